package nccltrack

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

func TestIsLibrary(t *testing.T) {
	for path, want := range map[string]bool{
		"/usr/lib/x86_64-linux-gnu/libnccl.so.2":                              true,
		"/opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2": true,
		"/usr/lib/libnccl.so.2.21.5":                                          true,
		"/usr/lib/libnccl.so":                                                 true,
		"/usr/lib/libnccl-net.so":                                             false, // plugins
		"/usr/lib/libnccl-tuner.so":                                           false,
		"/usr/lib/libcudart.so.12":                                            false,
		"/usr/lib/libnccl_static.a":                                           false,
		"/home/u/libnccl/train.py":                                            false,
		"/usr/lib/x86_64-linux-gnu/libc":                                      false,
	} {
		if got := IsLibrary(path); got != want {
			t.Errorf("IsLibrary(%q) = %v, want %v", path, got, want)
		}
	}
}

// A process is an NCCL rank to the daemon when it maps a libnccl
// executable; a data file of that name mapped read-only is not one.
func TestMapsLibrary(t *testing.T) {
	root := t.TempDir()
	write := func(pid, maps string) {
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, pid, "maps"), []byte(maps), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("100", "7f0000000000-7f0000100000 r-xp 00010000 08:01 1234 /usr/lib/libnccl.so.2\n")
	write("200", "7f0000000000-7f0000100000 r--p 00000000 08:01 1234 /usr/lib/libnccl.so.2\n"+
		"7f0000200000-7f0000300000 r-xp 00010000 08:01 99 /usr/lib/libc.so.6\n")
	fs, err := procinfo.New(root)
	if err != nil {
		t.Fatal(err)
	}
	for pid, want := range map[int]bool{100: true, 200: false} {
		if got, err := MapsLibrary(fs, pid); err != nil || got != want {
			t.Errorf("pid %d: %v, %v; want %v", pid, got, err, want)
		}
	}
	if _, err := MapsLibrary(fs, 300); err == nil {
		t.Error("pid 300 (gone): no error")
	}
}
