package unwind

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// The mask covers the addresses below the highest mapping's end: the
// kernel's user address space (48 bits on Debian's arm64 kernels, 39 with
// three levels of 4 KiB pages), and nothing above, where AArch64 return
// addresses carry their pointer authentication codes.
func TestVAMask(t *testing.T) {
	for _, tc := range []struct{ top, want uint64 }{
		{0xffff_ffff_f000, 1<<48 - 1}, // the stack at the top of 48 bits
		{0xffff_c000_0000, 1<<48 - 1},
		{0x7f_ffff_f000, 1<<39 - 1},
		{1 << 48, 1<<48 - 1}, // ends exactly at 2^48
	} {
		if got := vaMask(tc.top); got != tc.want {
			t.Errorf("vaMask(%#x) = %#x, want %#x", tc.top, got, tc.want)
		}
	}
	maps := filepath.Join(t.TempDir(), "maps")
	if err := os.WriteFile(maps, []byte("aaaab0000000-aaaab0010000 r-xp 00000000 08:01 7 /bin/x\n"+
		"ffffd0000000-ffffd0021000 rw-p 00000000 00:00 0 [stack]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if top, err := highestMapping(maps); err != nil || top != 0xffffd0021000 {
		t.Errorf("highestMapping = %#x, %v", top, err)
	}
	if err := os.WriteFile(maps, []byte("garbage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := highestMapping(maps); err == nil {
		t.Error("a malformed maps file: no error")
	}
	// x86-64 addresses have nothing to strip; this process's own on arm64
	// are below the mask.
	switch m := RAMask(); runtime.GOARCH {
	case "arm64":
		top, err := highestMapping("/proc/self/maps")
		if err != nil || m < top-1 || m == ^uint64(0) {
			t.Errorf("RAMask() = %#x, highest mapping %#x (%v)", m, top, err)
		}
	default:
		if m != ^uint64(0) {
			t.Errorf("RAMask() = %#x on %s", m, runtime.GOARCH)
		}
	}
}
