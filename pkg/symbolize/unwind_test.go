package symbolize

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestDecodeCall(t *testing.T) {
	cases := []struct {
		name             string
		code             []byte
		indirect, direct bool
		rel              int32
	}{
		{"call rel32", []byte{0x90, 0x90, 0xe8, 0x10, 0x00, 0x00, 0x00}, false, true, 0x10},
		{"call rel32 backwards", []byte{0xe8, 0xfb, 0xff, 0xff, 0xff}, false, true, -5},
		{"call *%rax", []byte{0x90, 0xff, 0xd0}, true, false, 0},
		{"call *%r11", []byte{0x41, 0xff, 0xd3}, true, false, 0},
		{"call *(%rax)", []byte{0xff, 0x10}, true, false, 0},
		{"call *(%rsp)", []byte{0xff, 0x14, 0x24}, true, false, 0},
		{"call *0x10(%rbx)", []byte{0xff, 0x53, 0x10}, true, false, 0},
		{"call *0x8(%rsp)", []byte{0xff, 0x54, 0x24, 0x08}, true, false, 0},
		{"call *0x1000(%rbx)", []byte{0xff, 0x93, 0x00, 0x10, 0x00, 0x00}, true, false, 0},
		{"call *x(%rip)", []byte{0xff, 0x15, 0x00, 0x10, 0x00, 0x00}, true, false, 0},
		{"call *0x1000(,%rax,8)", []byte{0xff, 0x14, 0xc5, 0x00, 0x10, 0x00, 0x00}, true, false, 0},
		{"call *0x1000(%rax,%rbx,1)", []byte{0xff, 0x94, 0x18, 0x00, 0x10, 0x00, 0x00}, true, false, 0},
		{"call *0x1000(%r8,%r9,1) with REX", []byte{0x43, 0xff, 0x94, 0x08, 0x00, 0x10, 0x00, 0x00}, true, false, 0},
		// E8 rel32 whose last displacement bytes read as call *%rax.
		{"both", []byte{0xe8, 0x00, 0x00, 0xff, 0xd0}, true, true, -0x2f010000},

		{"empty", nil, false, false, 0},
		{"nops", []byte{0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90}, false, false, 0},
		{"jmp rel32", []byte{0xe9, 0x10, 0x00, 0x00, 0x00}, false, false, 0},
		{"jmp *%rax", []byte{0xff, 0xe0}, false, false, 0},
		{"jmp *(%rax)", []byte{0xff, 0x20}, false, false, 0},
		{"push *0x10(%rbx)", []byte{0xff, 0x73, 0x10}, false, false, 0},
		{"E8 one byte early", []byte{0xe8, 0x00, 0x00, 0x00, 0x00, 0x90}, false, false, 0},
		{"call *%rax one byte early", []byte{0xff, 0xd0, 0x90}, false, false, 0},
		// FF 15 needs a 4-byte displacement, so it cannot end 2 bytes later.
		{"call *x(%rip) too short", []byte{0x90, 0xff, 0x15, 0x00}, false, false, 0},
		// FF 14 needs a SIB byte, which would be past the end.
		{"call via SIB cut off", []byte{0x90, 0xff, 0x14}, false, false, 0},
		// SIB with base 5 needs a disp32: FF 14 25 is 7 bytes, not 3.
		{"call via SIB without base too short", []byte{0xff, 0x14, 0x25}, false, false, 0},
		{"call *0x8(%rsp) too long", []byte{0xff, 0x54, 0x24, 0x08, 0x90}, false, false, 0},
	}
	for _, c := range cases {
		indirect, direct, rel := decodeCall(c.code)
		if indirect != c.indirect || direct != c.direct || rel != c.rel {
			t.Errorf("%s: decodeCall(% x) = %v, %v, %d; want %v, %v, %d",
				c.name, c.code, indirect, direct, rel, c.indirect, c.direct, c.rel)
		}
	}
}

func TestMergeStacks(t *testing.T) {
	// Return addresses are the words ending in 0x001; the rest stand for data.
	isRet := func(a uint64) bool { return a&0xfff == 1 }
	const ip = 0x1001
	cases := []struct {
		name     string
		fp, scan []uint64
		want     []uint64
	}{
		{
			// The wrapper broke the chain: only the scan finds the callers.
			name: "garbage fp[1]",
			fp:   []uint64{ip, 0x6c},
			scan: []uint64{3, 0x2001, 0x7ff0, 0x3001, 0x6c, 0x4001},
			want: []uint64{ip, 0x2001, 0x3001, 0x4001},
		},
		{
			// The wrapper kept the caller's rbp, so the chain skips only the
			// immediate caller; the scan stops where the chain takes over,
			// so no frame appears twice.
			name: "intact from fp[1]",
			fp:   []uint64{ip, 0x3001, 0x4001, 0x5001},
			scan: []uint64{3, 0x2001, 0x7ff0, 0x3001, 0x4001, 0x9001},
			want: []uint64{ip, 0x2001, 0x3001, 0x4001, 0x5001},
		},
		{
			name: "intact, nothing above fp[1]",
			fp:   []uint64{ip, 0x3001},
			scan: []uint64{0x3001, 0x2001},
			want: []uint64{ip, 0x3001},
		},
		{
			name: "fp[1] beyond the scan",
			fp:   []uint64{ip, 0x3001},
			scan: []uint64{0x2001, 5},
			want: []uint64{ip, 0x2001, 0x3001},
		},
		{
			name: "garbage deeper in the chain",
			fp:   []uint64{ip, 0x3001, 0x20, 0x4001},
			scan: []uint64{0x3001},
			want: []uint64{ip, 0x3001, 0x4001},
		},
		{
			name: "no scan",
			fp:   []uint64{ip, 0x6c, 0x3001},
			want: []uint64{ip, 0x3001},
		},
		{
			// The instruction pointer is kept even where it does not look
			// like a return address.
			name: "ip only",
			fp:   []uint64{0x10},
			scan: []uint64{0x2001},
			want: []uint64{0x10, 0x2001},
		},
		{
			name: "no fp",
			scan: []uint64{0x2001, 7},
			want: []uint64{0x2001},
		},
	}
	for _, c := range cases {
		if got := mergeStacks(c.fp, c.scan, isRet); !slices.Equal(got, c.want) {
			t.Errorf("%s: mergeStacks(%#x, %#x) = %#x, want %#x", c.name, c.fp, c.scan, got, c.want)
		}
	}
}

// buildUnwindTarget builds testdata/unwind.c the way the traced programs are
// assumed to be built: optimized, with frame pointers.
func buildUnwindTarget(t *testing.T) string {
	t.Helper()
	return buildC(t, "testdata/unwind.c", "unwind", "-O1", "-fno-omit-frame-pointer", "-fPIE", "-pie")
}

func TestUnwindLiveProcess(t *testing.T) {
	pid, line := runTarget(t, buildUnwindTarget(t))
	var words []uint64
	for f := range strings.FieldsSeq(line) {
		w, err := strconv.ParseUint(f, 16, 64)
		if err != nil {
			t.Fatalf("parsing %q: %v", line, err)
		}
		words = append(words, w)
	}
	if len(words) != 2+32 {
		t.Fatalf("target printed %d words, want 34: %q", len(words), line)
	}
	fp, scan := words[:2], words[2:]
	s := New("/proc")

	// The premise: the frame-pointer stack alone loses leaky.
	if got := frameTexts(s, pid, fp); !strings.HasPrefix(got[0], "clobber+") || got[1] != fmt.Sprintf("%#x", fp[1]) {
		t.Fatalf("frame-pointer stack = %q, want clobber then garbage", got)
	}

	addrs := s.Unwind(pid, fp, scan)
	frames := frameTexts(s, pid, addrs)
	t.Logf("unwound: %q", frames)
	if len(frames) < 3 || !strings.HasPrefix(frames[0], "clobber+") ||
		!strings.HasPrefix(frames[1], "leaky+") || !strings.HasPrefix(frames[2], "main+") {
		t.Fatalf("unwound frames = %q, want clobber, leaky, main, ...", frames)
	}
	for i, f := range frames {
		if strings.HasPrefix(f, "0x") || addrs[i] == fp[1] {
			t.Errorf("unwound frame %d = %q is garbage", i, f)
		}
	}

	// Had clobber kept leaky's rbp, the chain would start at main.
	intact := append([]uint64{fp[0]}, addrs[2:]...)
	if got := s.Unwind(pid, intact, scan); !slices.Equal(got, addrs) {
		t.Errorf("with an intact chain: Unwind = %#x, want %#x", got, addrs)
	}
}

// fileOffset returns the file offset that bin loads at virtual address vaddr
// from, and whether that segment is executable.
func fileOffset(t *testing.T, bin string, vaddr uint64) (uint64, bool) {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && vaddr >= p.Vaddr && vaddr < p.Vaddr+p.Filesz {
			return vaddr - p.Vaddr + p.Off, p.Flags&elf.PF_X != 0
		}
	}
	t.Fatalf("%s: %#x is in no segment", bin, vaddr)
	return 0, false
}

func TestUnwindFakeProcRoot(t *testing.T) {
	bin := buildUnwindTarget(t)
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	// The whole file mapped at base: addresses are base plus file offsets.
	// Plausibility follows the ELF segment, not the mapping's permissions.
	const base = 0x55d0c0de0000
	end := base + (uint64(fi.Size())+0xfff)&^0xfff
	binLine := fmt.Sprintf("%x-%x r-xp 00000000 08:01 3000 /opt/app/unwind\n", uint64(base), end)
	addr := func(name string) uint64 {
		off, _ := fileOffset(t, bin, symbolValue(t, bin, name))
		return base + off
	}
	if _, exec := fileOffset(t, bin, symbolValue(t, bin, "no_data")); exec {
		t.Fatal("no_data is in an executable segment; the test would not cover data")
	}

	root := t.TempDir()
	proc := func(pid int, rel string) string { return filepath.Join(root, strconv.Itoa(pid), rel) }
	put(t, proc(200, "maps"), []byte(binLine+
		"7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n"+
		"7f1000000000-7f1000001000 r-xp 00000000 08:01 3001 /data/blob.bin\n"), "")
	put(t, proc(200, "root/opt/app/unwind"), nil, bin)
	// Bytes of call *%rax right before 0x7f1000000010, but not in an ELF file.
	blob := make([]byte, 0x20)
	blob[0xe], blob[0xf] = 0xff, 0xd0
	put(t, proc(200, "root/data/blob.bin"), blob, "")

	ip := addr("ret_direct") - 1
	isRet := func(s *Symbolizer, pid int, a uint64) bool {
		return slices.Equal(s.Unwind(pid, []uint64{ip}, []uint64{a}), []uint64{ip, a})
	}

	cases := []struct {
		name string
		addr uint64
		want bool
	}{
		{"call rel32", addr("ret_direct"), true},
		{"call *%rax", addr("ret_reg"), true},
		{"call *%r11", addr("ret_rex"), true},
		{"call *(%rax)", addr("ret_mem"), true},
		{"call *0x10(%rbx)", addr("ret_disp8"), true},
		{"call *0x1000(%rbx)", addr("ret_disp32"), true},
		{"call *x(%rip)", addr("ret_rip"), true},
		{"call *0x8(%rsp)", addr("ret_sib_disp8"), true},
		{"call *0x1000(,%rax,8)", addr("ret_sib_disp32"), true},
		{"after nops", addr("no_nops"), false},
		{"call rel32 out of the code", addr("no_bad_target"), false},
		{"after jmp *%rax", addr("no_jmp"), false},
		{"function start", addr("leaky"), false},
		{"call bytes in data", addr("no_data"), false},
		{"call bytes in a non-ELF file", 0x7f1000000010, false},
		{"anonymous", 0x7f0000000010, false},
		{"unmapped", 0x10000000, false},
		{"zero", 0, false},
		{"text", 0x726f772f7070612f, false},
	}
	t.Run("pid 200", func(t *testing.T) {
		s := New(root)
		for _, c := range cases {
			if got := isRet(s, 200, c.addr); got != c.want {
				t.Errorf("%s: %#x plausible = %v, want %v", c.name, c.addr, got, c.want)
			}
		}
	})

	t.Run("late load", func(t *testing.T) {
		s := New(root)
		a := addr("ret_direct")
		put(t, proc(201, "root/opt/app/unwind"), nil, bin)
		put(t, proc(201, "maps"), []byte("7f0000000000-7f0000001000 rw-p 00000000 00:00 0\n"), "")
		if isRet(s, 201, a) {
			t.Fatal("before load: plausible")
		}
		// Like dlopen: the cached maps miss the address, so they are re-read.
		put(t, proc(201, "maps"), []byte(binLine), "")
		if !isRet(s, 201, a) {
			t.Fatal("after load: not plausible")
		}
	})

	t.Run("words that cannot be code keep the cache", func(t *testing.T) {
		s := New(root)
		a := addr("ret_direct")
		put(t, proc(202, "root/opt/app/unwind"), nil, bin)
		put(t, proc(202, "root/data/blob.bin"), blob, "")
		put(t, proc(202, "maps"), []byte(binLine), "")
		if !isRet(s, 202, a) {
			t.Fatal("not plausible")
		}
		// The pid is reused by a process mapping something else there; a
		// re-read of the maps would show it.
		put(t, proc(202, "maps"), []byte(fmt.Sprintf("%x-%x r-xp 00000000 08:01 3001 /data/blob.bin\n", uint64(base), end)), "")
		if got := s.Unwind(202, []uint64{ip}, []uint64{3, 0x241, 0x726f772f7070612f}); !slices.Equal(got, []uint64{ip}) {
			t.Fatalf("Unwind = %#x, want only the ip", got)
		}
		if !isRet(s, 202, a) {
			t.Fatal("maps re-read for words that cannot be code")
		}
	})
}
