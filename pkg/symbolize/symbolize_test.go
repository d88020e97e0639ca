package symbolize

import (
	"bufio"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// lookTool finds a build tool. Developers without it may skip; CI must not
// silently lose the coverage.
func lookTool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("%s not found", name)
		}
		t.Fatalf("%s not found (required when CI is set)", name)
	}
	return path
}

// buildTarget compiles testdata/target.c with extra gcc flags into a fresh
// temporary directory and returns the binary's path.
func buildTarget(t *testing.T, name string, flags ...string) string {
	t.Helper()
	return buildC(t, "testdata/target.c", name, append([]string{"-O0"}, flags...)...)
}

// buildC compiles src with gcc flags into a fresh temporary directory and
// returns the binary's path.
func buildC(t *testing.T, src, name string, flags ...string) string {
	t.Helper()
	gcc := lookTool(t, "gcc")
	out := filepath.Join(t.TempDir(), name)
	args := append([]string{"-o", out}, flags...)
	args = append(args, src)
	if b, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc %v: %v\n%s", args, err, b)
	}
	return out
}

func stripTo(t *testing.T, bin, out string) {
	t.Helper()
	if b, err := exec.Command(lookTool(t, "strip"), "-o", out, bin).CombinedOutput(); err != nil {
		t.Fatalf("strip: %v\n%s", err, b)
	}
}

// symbolValue returns the ELF virtual address of a symbol in bin's .symtab.
func symbolValue(t *testing.T, bin, name string) uint64 {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range syms {
		if s.Name == name {
			return s.Value
		}
	}
	t.Fatalf("%s: no symbol %s", bin, name)
	return 0
}

// startTarget runs bin until the test ends and returns its pid and the
// runtime address of leakyfn, which it prints.
func startTarget(t *testing.T, bin string) (int, uint64) {
	t.Helper()
	pid, line := runTarget(t, bin)
	addr, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(line), "0x"), 16, 64)
	if err != nil {
		t.Fatalf("parsing address %q: %v", line, err)
	}
	return pid, addr
}

// runTarget runs bin until the test ends and returns its pid and the first
// line it prints.
func runTarget(t *testing.T, bin string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("reading from %s: %v", bin, err)
	}
	return cmd.Process.Pid, line
}

func TestFramesLiveProcess(t *testing.T) {
	bin := buildTarget(t, "target", "-fPIE", "-pie", "-Wl,--build-id=sha1")
	pid, addr := startTarget(t, bin)
	s := New("/proc")

	got := frameTexts(s, pid, []uint64{addr + 4, 0x10})
	if got[0] != "leakyfn+0x4 (target)" {
		t.Errorf("frame of leakyfn+4 = %q, want %q", got[0], "leakyfn+0x4 (target)")
	}
	// The file as the process maps it, and its build-id as readelf reads it.
	out, err := exec.Command("readelf", "-n", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	_, id, _ := strings.Cut(string(out), "Build ID: ")
	id, _, _ = strings.Cut(id, "\n")
	if f := s.Frames(pid, []uint64{addr + 4})[0]; f.Path != bin || f.BuildID == "" || f.BuildID != strings.TrimSpace(id) {
		t.Errorf("leakyfn's file %q, build-id %q; want %q, %q", f.Path, f.BuildID, bin, id)
	}
	// The zero page is never mapped.
	if got[1] != "0x10" {
		t.Errorf("frame of unmapped address = %q, want 0x10", got[1])
	}
}

func TestFramesLiveStrippedProcess(t *testing.T) {
	bin := buildTarget(t, "target", "-fPIE", "-pie")
	// strip keeps the layout, so the unstripped binary still tells where leakyfn is.
	vaddr := symbolValue(t, bin, "leakyfn")
	stripped := filepath.Join(t.TempDir(), "target-stripped")
	stripTo(t, bin, stripped)
	pid, addr := startTarget(t, stripped)

	got := frameTexts(New("/proc"), pid, []uint64{addr + 4})[0]
	if want := fmt.Sprintf("target-stripped+%#x", vaddr+4); got != want {
		t.Errorf("frame in stripped binary = %q, want %q", got, want)
	}
}

// execMapping describes how a fake maps line maps bin's executable segment
// at start, as the kernel would.
type execMapping struct {
	start, end, offset uint64
	seg                *elf.Prog
}

func newExecMapping(t *testing.T, bin string, start uint64) execMapping {
	t.Helper()
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 {
			const page = 0x1000
			off := p.Off &^ (page - 1)
			size := (p.Off + p.Filesz - off + page - 1) &^ (page - 1)
			return execMapping{start: start, end: start + size, offset: off, seg: p}
		}
	}
	t.Fatalf("%s: no executable segment", bin)
	return execMapping{}
}

// addr is the runtime address of ELF virtual address vaddr.
func (m execMapping) addr(vaddr uint64) uint64 {
	return m.start + vaddr - m.seg.Vaddr + m.seg.Off - m.offset
}

func (m execMapping) line(devInode, path string) string {
	return fmt.Sprintf("%x-%x r-xp %08x %s %s\n", m.start, m.end, m.offset, devInode, path)
}

func (m execMapping) mapFile() string {
	return fmt.Sprintf("%x-%x", m.start, m.end)
}

// put writes a file of the fake proc root, copying it from src when data is nil.
func put(t *testing.T, path string, data []byte, src string) {
	t.Helper()
	if data == nil {
		var err error
		if data, err = os.ReadFile(src); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestFramesFakeProcRoot(t *testing.T) {
	pie := buildTarget(t, "target", "-fPIE", "-pie")
	// Non-PIE code is linked at 0x400000, so its ELF virtual addresses differ
	// from file offsets: a missing offset-to-vaddr conversion shows up here.
	nopie := buildTarget(t, "target-nopie", "-no-pie")
	// Exported but stripped: only .dynsym can name leakyfn.
	dynFull := buildTarget(t, "target-dyn", "-fPIE", "-pie", "-rdynamic")
	dyn := filepath.Join(t.TempDir(), "target-dyn")
	stripTo(t, dynFull, dyn)

	pieMap := newExecMapping(t, pie, 0x55d0c0de0000)
	nopieMap := newExecMapping(t, nopie, 0x7f5000000000)
	dynMap := newExecMapping(t, dyn, 0x7f3000000000)
	if nopieMap.seg.Vaddr == nopieMap.seg.Off {
		t.Fatalf("non-PIE executable segment has vaddr == offset (%#x); the test would not cover the conversion", nopieMap.seg.Off)
	}

	leaky := symbolValue(t, pie, "leakyfn")
	nosize := symbolValue(t, pie, "nosize")
	initFn := symbolValue(t, pie, "_init")
	plt := func() uint64 {
		f, err := elf.Open(pie)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		sec := f.Section(".plt")
		if sec == nil {
			t.Skip("PIE has no .plt section")
		}
		return sec.Addr
	}()

	root := t.TempDir()
	proc := func(pid int, rel string) string { return filepath.Join(root, strconv.Itoa(pid), rel) }

	// pid 100 holds every kind of mapping.
	maps := "7f0000000000-7f0000001000 rw-p 00000000 00:00 0 \n" +
		pieMap.line("00:00 0", "/opt/app/target") +
		nopieMap.line("08:01 1234", "/usr/bin/target-nopie") +
		dynMap.line("08:01 1235", "/opt/app/lib dir/target-dyn") +
		"7f1000000000-7f1000001000 r--p 00002000 08:01 1236 /data/blob.bin\n" +
		"7f2000000000-7f2000001000 r-xp 00001000 08:01 1237 /lib/gone.so\n" +
		"7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]\n"
	put(t, proc(100, "maps"), []byte(maps), "")
	put(t, proc(100, "root/opt/app/target"), nil, pie)
	put(t, proc(100, "root/usr/bin/target-nopie"), nil, nopie)
	put(t, proc(100, "root/opt/app/lib dir/target-dyn"), nil, dyn)
	put(t, proc(100, "root/data/blob.bin"), []byte("not an ELF file"), "")

	cases := []struct {
		name string
		addr uint64
		want string
	}{
		{"symtab", pieMap.addr(leaky + 4), "leakyfn+0x4 (target)"},
		{"zero offset omitted", pieMap.addr(leaky), "leakyfn (target)"},
		{"sizeless symbol", pieMap.addr(nosize + 1), "nosize+0x1 (target)"},
		{"sizeless symbol in own section", pieMap.addr(initFn + 4), "_init+0x4 (target)"},
		{"no symbol past section end", pieMap.addr(plt + 4), fmt.Sprintf("target+%#x", plt+4)},
		{"non-PIE vaddr", nopieMap.addr(symbolValue(t, nopie, "leakyfn") + 4), "leakyfn+0x4 (target-nopie)"},
		{"dynsym fallback", dynMap.addr(symbolValue(t, dynFull, "leakyfn") + 4), "leakyfn+0x4 (target-dyn)"},
		{"not ELF", 0x7f1000000010, "blob.bin+0x2010"},
		{"file missing", 0x7f2000000010, "gone.so+0x1010"},
		{"anonymous", 0x7f0000000010, "0x7f0000000010"},
		{"vdso", 0x7ffd00000010, "0x7ffd00000010"},
		{"unmapped", 0x10, "0x10"},
	}
	t.Run("pid 100", func(t *testing.T) {
		s := New(root)
		addrs := make([]uint64, len(cases))
		for i, c := range cases {
			addrs[i] = c.addr
		}
		got := frameTexts(s, 100, addrs)
		for i, c := range cases {
			if got[i] != c.want {
				t.Errorf("%s: frame of %#x = %q, want %q", c.name, c.addr, got[i], c.want)
			}
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		s := New(root)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 20 {
					got := frameTexts(s, 100, []uint64{cases[0].addr, cases[5].addr})
					if got[0] != cases[0].want || got[1] != cases[5].want {
						t.Errorf("concurrent frames = %q", got)
						return
					}
					s.Forget(100)
				}
			})
		}
		wg.Wait()
	})

	t.Run("map_files fallback", func(t *testing.T) {
		put(t, proc(101, "maps"), []byte(pieMap.line("08:01 2000", "/opt/app/target")), "")
		put(t, proc(101, "map_files/"+pieMap.mapFile()), nil, pie)
		if got := frameTexts(New(root), 101, []uint64{pieMap.addr(leaky + 4)})[0]; got != "leakyfn+0x4 (target)" {
			t.Errorf("frame = %q, want leakyfn+0x4 (target)", got)
		}
	})

	t.Run("deleted file", func(t *testing.T) {
		// The path now holds a different binary; only map_files has the mapped one.
		put(t, proc(102, "maps"), []byte(pieMap.line("08:01 2001", "/opt/app/target (deleted)")), "")
		put(t, proc(102, "root/opt/app/target"), nil, nopie)
		put(t, proc(102, "map_files/"+pieMap.mapFile()), nil, pie)
		if got := frameTexts(New(root), 102, []uint64{pieMap.addr(leaky + 4)})[0]; got != "leakyfn+0x4 (target)" {
			t.Errorf("frame = %q, want leakyfn+0x4 (target)", got)
		}
	})

	t.Run("late load, exit and Forget", func(t *testing.T) {
		s := New(root)
		addr := pieMap.addr(leaky + 4)
		raw := fmt.Sprintf("%#x", addr)
		put(t, proc(103, "root/opt/app/target"), nil, pie)
		put(t, proc(103, "root/data/blob.bin"), []byte("not an ELF file"), "")

		put(t, proc(103, "maps"), []byte("7f0000000000-7f0000001000 rw-p 00000000 00:00 0\n"), "")
		if got := frameTexts(s, 103, []uint64{addr})[0]; got != raw {
			t.Fatalf("before load: frame = %q, want %q", got, raw)
		}
		// Like dlopen: the cached maps miss the address, so they are re-read.
		put(t, proc(103, "maps"), []byte(pieMap.line("00:00 0", "/opt/app/target")), "")
		if got := frameTexts(s, 103, []uint64{addr})[0]; got != "leakyfn+0x4 (target)" {
			t.Fatalf("after load: frame = %q, want leakyfn+0x4 (target)", got)
		}
		// The pid is reused by a process mapping something else there; the
		// cache still answers for the old process until Forget.
		blob := fmt.Sprintf("%x-%x r--p 00000000 00:00 0 /data/blob.bin\n", pieMap.start, pieMap.end)
		put(t, proc(103, "maps"), []byte(blob), "")
		if got := frameTexts(s, 103, []uint64{addr})[0]; got != "leakyfn+0x4 (target)" {
			t.Fatalf("cached: frame = %q, want leakyfn+0x4 (target)", got)
		}
		s.Forget(103)
		if got, want := frameTexts(s, 103, []uint64{addr})[0], fmt.Sprintf("blob.bin+%#x", addr-pieMap.start); got != want {
			t.Fatalf("after Forget: frame = %q, want %q", got, want)
		}
		// Once the process is gone its maps cannot be re-read, but stacks
		// that arrive late still resolve against the cached ones.
		if err := os.RemoveAll(filepath.Join(root, "103")); err != nil {
			t.Fatal(err)
		}
		if got := frameTexts(s, 103, []uint64{0x10, addr}); got[0] != "0x10" || got[1] != fmt.Sprintf("blob.bin+%#x", addr-pieMap.start) {
			t.Fatalf("after exit: frames = %q", got)
		}
	})

	t.Run("no such process", func(t *testing.T) {
		if got := frameTexts(New(root), 999, []uint64{0x1234}); len(got) != 1 || got[0] != "0x1234" {
			t.Errorf("frames = %q, want [0x1234]", got)
		}
	})
}

// With ShareMaps, Refresh takes the poll's read of /proc/PID/maps (another
// view read it first); an address outside it (a library loaded since) is
// looked up in the file again.
func TestRefreshSharedMaps(t *testing.T) {
	pie := buildTarget(t, "target", "-fPIE", "-pie")
	root := t.TempDir()
	fs, err := procinfo.New(root)
	if err != nil {
		t.Fatal(err)
	}
	first := newExecMapping(t, pie, 0x55d0c0de0000)
	second := newExecMapping(t, pie, 0x7f3000000000)
	put(t, filepath.Join(root, "100", "root", "opt", "target"), nil, pie)
	put(t, filepath.Join(root, "100", "stat"), []byte("100 (target) S 1 100 100 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0\n"), "")
	mapsFile := filepath.Join(root, "100", "maps")
	put(t, mapsFile, []byte(first.line("08:01 1234", "/opt/target")), "")
	shared := fs.WithPollCache(procinfo.NewPollCache())
	if _, err := shared.Maps(100); err != nil { // the view that read first
		t.Fatal(err)
	}
	both := first.line("08:01 1234", "/opt/target") + second.line("08:01 1234", "/opt/target")
	put(t, mapsFile, []byte(both), "")
	s := New(root).ShareMaps(shared)
	s.Refresh(100)
	if got := len(s.maps[100]); got != 1 {
		t.Fatalf("Refresh kept %d mappings; want the poll's read (1)", got)
	}
	leaky := symbolValue(t, pie, "leakyfn")
	frames := s.Frames(100, []uint64{second.addr(leaky + 4)})
	if got := frames[0].String(); got != "leakyfn+0x4 (target)" {
		t.Errorf("an address mapped since the poll's read: %q", got)
	}
}
