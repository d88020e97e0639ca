package symbolize

import (
	"cmp"
	"debug/elf"
	"io"
	"slices"
)

// elfInfo is what symbolization needs from one ELF file; the file itself is
// closed once this is built.
type elfInfo struct {
	loads  []load
	symtab []symbol // from .symtab; empty when the file is stripped
	dynsym []symbol // from .dynsym; exported functions only, but survives strip
}

// load is a PT_LOAD program header: file bytes [off, off+filesz) are mapped
// at virtual address vaddr.
type load struct {
	off, filesz, vaddr uint64
	exec               bool // PF_X: only code can hold a return address
}

// symbol is a function covering ELF virtual addresses [start, end).
type symbol struct {
	start, end uint64
	name       string
}

func parseELF(r io.ReaderAt) (*elfInfo, error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return nil, err
	}
	info := &elfInfo{}
	for _, p := range f.Progs {
		if p.Type == elf.PT_LOAD {
			info.loads = append(info.loads, load{off: p.Off, filesz: p.Filesz, vaddr: p.Vaddr, exec: p.Flags&elf.PF_X != 0})
		}
	}
	// A missing or unreadable table leaves that table empty: the other one,
	// or module+offset frames, are still useful.
	syms, _ := f.Symbols()
	info.symtab = funcTable(f, syms)
	dyn, _ := f.DynamicSymbols()
	info.dynsym = funcTable(f, dyn)
	return info, nil
}

// funcTable keeps the defined functions of syms, sorted by address, with the
// end of each one resolved so that lookup is a single binary search.
func funcTable(f *elf.File, syms []elf.Symbol) []symbol {
	type fn struct {
		start, size, secEnd uint64
		name                string
	}
	var fns []fn
	for _, s := range syms {
		// Undefined (imported) and absolute symbols say nothing about this
		// file's code.
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Section == elf.SHN_UNDEF || int(s.Section) >= len(f.Sections) {
			continue
		}
		sec := f.Sections[s.Section]
		fns = append(fns, fn{start: s.Value, size: s.Size, secEnd: sec.Addr + sec.Size, name: s.Name})
	}
	// Among aliases at one address prefer the one with a size, then keep the
	// first so that the choice is deterministic.
	slices.SortStableFunc(fns, func(a, b fn) int {
		if c := cmp.Compare(a.start, b.start); c != 0 {
			return c
		}
		return cmp.Compare(b.size, a.size)
	})
	fns = slices.CompactFunc(fns, func(a, b fn) bool { return a.start == b.start })

	table := make([]symbol, len(fns))
	for i, s := range fns {
		end := s.start + s.size
		if s.size == 0 {
			// Hand-written assembly often has no size: such a symbol covers
			// up to the next function, but not past its own section (which
			// would attribute e.g. PLT stubs to _init).
			end = s.secEnd
			if i+1 < len(fns) {
				end = min(end, fns[i+1].start)
			}
		}
		table[i] = symbol{start: s.start, end: end, name: s.name}
	}
	return table
}

// vaddr converts a file offset to the ELF virtual address it is loaded at.
// Symbol values are virtual addresses, and for PIEs and shared libraries they
// differ from file offsets wherever segments are not aligned identically.
func (e *elfInfo) vaddr(off uint64) (uint64, bool) {
	l, ok := e.loadAt(off)
	if !ok {
		return 0, false
	}
	return off - l.off + l.vaddr, true
}

// loadAt returns the segment that file offset off is loaded from.
func (e *elfInfo) loadAt(off uint64) (load, bool) {
	for _, l := range e.loads {
		if off >= l.off && off < l.off+l.filesz {
			return l, true
		}
	}
	return load{}, false
}

// inCode reports whether virtual address vaddr lies in an executable segment.
func (e *elfInfo) inCode(vaddr uint64) bool {
	for _, l := range e.loads {
		if l.exec && vaddr >= l.vaddr && vaddr < l.vaddr+l.filesz {
			return true
		}
	}
	return false
}

// lookup finds the function containing vaddr, preferring .symtab, whose local
// functions .dynsym lacks.
func (e *elfInfo) lookup(vaddr uint64) (symbol, bool) {
	if s, ok := findSymbol(e.symtab, vaddr); ok {
		return s, true
	}
	return findSymbol(e.dynsym, vaddr)
}

func findSymbol(table []symbol, vaddr uint64) (symbol, bool) {
	// Index of the last symbol starting at or before vaddr.
	i, found := slices.BinarySearchFunc(table, vaddr, func(s symbol, v uint64) int { return cmp.Compare(s.start, v) })
	if !found {
		i--
	}
	if i < 0 || vaddr >= table[i].end {
		return symbol{}, false
	}
	return table[i], true
}
