package symbolize

import (
	"cmp"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
)

// The big library: bigFuncs functions of funcStride bytes from bigText,
// listed out of address order, with aliases, objects, undefined and absolute
// symbols among them, and a tail that only the last, sizeless, function
// covers.
const (
	bigFuncs   = 300_000
	bigText    = 0x1000
	funcStride = 16
	bigTail    = 40
	bigTextEnd = bigText + bigFuncs*funcStride + bigTail
)

// bigFunc is the symbol that should name function i, and its ELF size.
func bigFunc(i int) (string, uint64) {
	switch {
	case i%1000 == 0:
		// Preferred over a smaller alias before it and an equal one after.
		return fmt.Sprintf("f%d", i), funcStride
	case i == bigFuncs-1 || i%7 == 3:
		return fmt.Sprintf("f%d", i), 0
	case i%5 == 1:
		return fmt.Sprintf("f%d", i), funcStride / 2
	}
	return fmt.Sprintf("f%d", i), funcStride
}

func bigSyms(yield func(genSym) bool) {
	text := genTextShndx(0)
	for k := range bigFuncs {
		// 7919 is prime to bigFuncs: every function once, out of order.
		i := k * 7919 % bigFuncs
		start := bigText + uint64(i)*funcStride
		name, size := bigFunc(i)
		group := []genSym{{name: name, value: start, size: size, typ: elf.STT_FUNC, shndx: text}}
		if i%1000 == 0 {
			group = []genSym{
				{name: fmt.Sprintf("alias%d", i), value: start, size: 4, typ: elf.STT_FUNC, shndx: text},
				group[0],
				{name: fmt.Sprintf("dup%d", i), value: start, size: funcStride, typ: elf.STT_FUNC, shndx: text},
			}
		}
		if i%3 == 0 {
			group = append(group, genSym{name: fmt.Sprintf("obj%d", i), value: start + 4, size: 4, typ: elf.STT_OBJECT, shndx: text})
		}
		if i%11 == 0 {
			group = append(group, genSym{name: fmt.Sprintf("undef%d", i), value: start + 8, typ: elf.STT_FUNC, shndx: elf.SHN_UNDEF})
		}
		if i%13 == 0 {
			group = append(group, genSym{name: fmt.Sprintf("abs%d", i), value: start + 8, typ: elf.STT_FUNC, shndx: elf.SHN_ABS})
		}
		for _, s := range group {
			if !yield(s) {
				return
			}
		}
	}
}

// bigFrame is the frame expected for ELF virtual address vaddr of libbig.so.
func bigFrame(vaddr uint64) string {
	if vaddr >= bigText {
		i := min(int((vaddr-bigText)/funcStride), bigFuncs-1)
		start := bigText + uint64(i)*funcStride
		name, size := bigFunc(i)
		end := start + size
		if size == 0 {
			end = min(start+funcStride, bigTextEnd)
			if i == bigFuncs-1 {
				end = bigTextEnd
			}
		}
		if vaddr < end {
			if vaddr == start {
				return name + " (libbig.so)"
			}
			return fmt.Sprintf("%s+%#x (libbig.so)", name, vaddr-start)
		}
	}
	return fmt.Sprintf("libbig.so+%#x", vaddr)
}

// fakeLib is a generated library mapped whole, from offset 0, by a process
// of a fake proc root.
type fakeLib struct {
	start uint64
	offs  []uint64 // file offset of each text
	texts []genText
}

// addr is the runtime address of vaddr in text i.
func (l fakeLib) addr(i int, vaddr uint64) uint64 {
	return l.start + vaddr - l.texts[i].addr + l.offs[i]
}

// mapLib writes g at path inside pid's root under procRoot and appends its
// maps line (device 08:01, inode ino, mapped at start).
func mapLib(tb testing.TB, procRoot string, pid int, path string, ino int, start uint64, g genELF) fakeLib {
	tb.Helper()
	file := filepath.Join(procRoot, strconv.Itoa(pid), "root", path)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		tb.Fatal(err)
	}
	offs := g.write(tb, file)
	fi, err := os.Stat(file)
	if err != nil {
		tb.Fatal(err)
	}
	end := start + (uint64(fi.Size())+genPage-1)&^(genPage-1)
	maps, err := os.OpenFile(filepath.Join(procRoot, strconv.Itoa(pid), "maps"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	defer maps.Close()
	if _, err := fmt.Fprintf(maps, "%x-%x r-xp 00000000 08:01 %d %s\n", start, end, ino, path); err != nil {
		tb.Fatal(err)
	}
	return fakeLib{start: start, offs: offs, texts: g.texts}
}

func bigLib() genELF {
	return genELF{
		class:   elf.ELFCLASS64,
		buildID: []byte("big-library-build-id"),
		texts:   []genText{{addr: bigText, size: bigTextEnd - bigText}},
		symtab:  bigSyms,
	}
}

// bigAddrs are a few thousand ELF virtual addresses spread over libbig.so,
// at every offset within functions, and its edges.
func bigAddrs() []uint64 {
	addrs := []uint64{bigText - 1, bigText, bigText + 1000*funcStride, bigTextEnd - 1, bigTextEnd}
	for k := range 4000 {
		addrs = append(addrs, bigText+uint64(k)*(bigTextEnd-bigText)/4000+uint64(k%funcStride))
	}
	return addrs
}

// Parsing with debug/elf (a Go string and an elf.Symbol per symbol) kept
// 12.5 MiB live for this library and allocated 150 MiB on the way; the index
// is 3.4 MiB (12 bytes a function), built in place. The bounds leave room
// over the index but fail far below the old numbers.
const (
	maxRetainedHeap  = 6 << 20
	maxAllocatedHeap = 12 << 20
)

func TestFramesLargeSymbolTable(t *testing.T) {
	root := t.TempDir()
	lib := mapLib(t, root, 100, "/usr/lib/libbig.so", 77, 0x7f0000000000, bigLib())
	vaddrs := bigAddrs()
	addrs := make([]uint64, len(vaddrs))
	for i, v := range vaddrs {
		addrs[i] = lib.addr(0, v)
	}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := New(root)
	got := frameTexts(s, 100, addrs)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(s)

	for i, v := range vaddrs {
		if want := bigFrame(v); got[i] != want {
			t.Errorf("frame of vaddr %#x = %q, want %q", v, got[i], want)
		}
	}
	retained := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d functions: %.1f MiB retained, %.1f MiB allocated", bigFuncs, float64(retained)/(1<<20), float64(allocated)/(1<<20))
	if retained > maxRetainedHeap {
		t.Errorf("heap retained after symbolizing = %d bytes, want at most %d", retained, maxRetainedHeap)
	}
	if allocated > maxAllocatedHeap {
		t.Errorf("heap allocated while symbolizing = %d bytes, want at most %d", allocated, maxAllocatedHeap)
	}
}

// refTable is the symbol table as the package built it with debug/elf before
// it indexed tables itself: the reference for which functions count and
// where they end.
type refSym struct {
	start, end uint64
	name       string
}

func refTable(f *elf.File, syms []elf.Symbol) []refSym {
	type fn struct {
		start, size, secEnd uint64
		name                string
	}
	var fns []fn
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Section == elf.SHN_UNDEF || int(s.Section) >= len(f.Sections) {
			continue
		}
		sec := f.Sections[s.Section]
		fns = append(fns, fn{start: s.Value, size: s.Size, secEnd: sec.Addr + sec.Size, name: s.Name})
	}
	slices.SortStableFunc(fns, func(a, b fn) int {
		if c := cmp.Compare(a.start, b.start); c != 0 {
			return c
		}
		return cmp.Compare(b.size, a.size)
	})
	fns = slices.CompactFunc(fns, func(a, b fn) bool { return a.start == b.start })
	table := make([]refSym, len(fns))
	for i, s := range fns {
		end := s.start + s.size
		if s.size == 0 {
			end = s.secEnd
			if i+1 < len(fns) {
				end = min(end, fns[i+1].start)
			}
		}
		table[i] = refSym{start: s.start, end: end, name: s.name}
	}
	return table
}

func refLookup(table []refSym, vaddr uint64) (refSym, bool) {
	i, found := slices.BinarySearchFunc(table, vaddr, func(s refSym, v uint64) int { return cmp.Compare(s.start, v) })
	if !found {
		i--
	}
	if i < 0 || vaddr >= table[i].end {
		return refSym{}, false
	}
	return table[i], true
}

// checkAgainstDebugElf compares each symbol table's index of path with
// refTable at every function's edges and every section's.
func checkAgainstDebugElf(t *testing.T, path string) {
	t.Helper()
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	info, err := parseELF(f)
	if err != nil {
		t.Fatal(err)
	}
	syms, _ := ef.Symbols()
	dyn, _ := ef.DynamicSymbols()
	if len(syms)+len(dyn) == 0 {
		t.Fatalf("%s: no symbols; the comparison would be empty", path)
	}
	for k, ref := range [][]refSym{refTable(ef, syms), refTable(ef, dyn)} {
		tab := info.tables[k]
		if tab == nil {
			if len(ref) > 0 {
				t.Errorf("%s: table %d not indexed, but debug/elf finds %d functions", path, k, len(ref))
			}
			continue
		}
		tab.index = info.buildIndex(tab)
		var probes []uint64
		for _, s := range ref {
			probes = append(probes, s.start-1, s.start, s.start+1, s.end-1, s.end)
		}
		for _, sec := range ef.Sections {
			probes = append(probes, sec.Addr, sec.Addr+sec.Size-1, sec.Addr+sec.Size)
		}
		for _, p := range probes {
			want, wantOK := refLookup(ref, p)
			start, name, ok := tab.index.find(p)
			var got string
			if ok {
				got, _ = info.readName(tab, name)
			}
			if ok != wantOK || start != want.start || got != want.name {
				t.Errorf("%s: table %d at %#x: got %q at %#x (%v), want %q at %#x (%v)", path, k, p, got, start, ok, want.name, want.start, wantOK)
				return
			}
		}
		t.Logf("%s: table %d: %d functions, %d probes, %d index bytes", filepath.Base(path), k, len(ref), len(probes), tab.index.bytes())
	}
}

func TestIndexMatchesDebugElf(t *testing.T) {
	dir := t.TempDir()
	small := func(i int) (string, uint64) { return fmt.Sprintf("g%d", i), uint64(i%3) * 8 }
	smallSyms := func(text int, base uint64, n int) func(func(genSym) bool) {
		return func(yield func(genSym) bool) {
			for i := range n {
				name, size := small(i)
				if !yield(genSym{name: fmt.Sprintf("%s_%d", name, text), value: base + uint64(i)*16, size: size, typ: elf.STT_FUNC, shndx: genTextShndx(text)}) {
					return
				}
			}
		}
	}
	generated := map[string]genELF{
		"elf32": {
			class:  elf.ELFCLASS32,
			texts:  []genText{{addr: 0x8048000, size: 0x1000}},
			symtab: smallSyms(0, 0x8048000, 200),
			dynsym: smallSyms(0, 0x8048000, 50),
		},
		// Functions 4 GiB apart do not fit 32-bit offsets.
		"wide": {
			class: elf.ELFCLASS64,
			texts: []genText{{addr: 0x1000, size: 0x1000}, {addr: 0x2_0000_0000, size: 0x1000}},
			symtab: func(yield func(genSym) bool) {
				for s := range smallSyms(0, 0x1000, 100) {
					if !yield(s) {
						return
					}
				}
				for s := range smallSyms(1, 0x2_0000_0000, 100) {
					if !yield(s) {
						return
					}
				}
			},
		},
	}
	var paths []string
	for name, g := range generated {
		path := filepath.Join(dir, name)
		g.write(t, path)
		paths = append(paths, path)
	}
	f, err := os.Open(filepath.Join(dir, "wide"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	wide, err := parseELF(f)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := wide.buildIndex(wide.tables[0]).(funcTable[uint64]); !ok {
		t.Error("functions 8 GiB apart indexed with 32-bit offsets")
	}
	// Real toolchain output: C++ aliases, PLT stubs, sizeless _init, ...
	for _, p := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"} {
		if _, err := os.Stat(p); err == nil {
			paths = append(paths, p)
		}
	}
	if _, err := exec.LookPath("gcc"); err == nil {
		paths = append(paths, buildTarget(t, "target", "-fPIE", "-pie"), buildTarget(t, "target-dyn", "-fPIE", "-pie", "-rdynamic"))
	}
	for _, p := range paths {
		checkAgainstDebugElf(t, p)
	}
}
