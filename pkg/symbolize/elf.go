package symbolize

import (
	"bytes"
	"cmp"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"math"
	"os"
	"slices"
	"sort"
	"unsafe"
)

// elfInfo is what symbolization needs from one ELF file. Symbol tables of
// large libraries (libtorch_cpu.so has 632 k functions) do not fit the tool's
// memory as Go strings, so each table is indexed only on its first lookup,
// as addresses and string-table offsets, and a name is read from the file
// only for a function that is hit. The file therefore stays open for as long
// as its info is cached.
type elfInfo struct {
	f       *os.File
	build   buildKey // zero when the file has no GNU build-id
	buildID string   // its hex, for profiles' mappings
	loads   []load
	order   binary.ByteOrder
	class   elf.Class
	secEnds []uint64 // end address of each section, by section index
	// tables are .symtab, then .dynsym (exported functions only, but it
	// survives strip); nil where a table is missing or unusable.
	tables [2]*symTable
	eh     ehFrame // zero without call-frame information
	// lineTab gives source lines (lines); linesRead once it was looked for.
	lineTab   *lineTable
	linesRead bool
	// linesRefused: its debugging information is over maxLineBytes.
	linesRefused bool
	// tablesRefused: its symbol tables over maxSymtabBytes, left out.
	tablesRefused int
}

// load is a PT_LOAD program header: file bytes [off, off+filesz) are mapped
// at virtual address vaddr.
type load struct {
	off, filesz, vaddr uint64
}

// buildKey identifies a file's contents across paths and containers. The
// size is part of it because strip keeps the build-id: a stripped copy must
// not answer with (or for) the unstripped one's symbols.
type buildKey struct {
	id   string
	size int64
}

// symbol is a resolved function: its start address and name.
type symbol struct {
	start uint64
	name  string
	// nameRefused: the name runs over maxNameBytes and is left empty.
	nameRefused bool
}

// symTable locates one raw symbol table and its string table in the file.
type symTable struct {
	off, size       uint64
	strOff, strSize uint64
	index           funcIndex // nil until the first lookup
}

// ntGNUBuildID is the note type of a GNU build-id (owner "GNU").
const ntGNUBuildID = 3

// maxNoteBytes bounds what is read of one PT_NOTE segment; build-id notes
// come early and whole segments are normally well under a kilobyte.
const maxNoteBytes = 64 << 10

// parseELF reads f's headers; its symbol tables are read on lookup. On
// success the returned info owns f.
func parseELF(f *os.File) (*elfInfo, error) {
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	info := &elfInfo{f: f, order: ef.ByteOrder, class: ef.Class}
	for _, p := range ef.Progs {
		switch p.Type {
		case elf.PT_LOAD:
			info.loads = append(info.loads, load{off: p.Off, filesz: p.Filesz, vaddr: p.Vaddr})
		case elf.PT_GNU_EH_FRAME:
			switch ef.Machine {
			case elf.EM_X86_64:
				info.eh = ehFrame{hdrAddr: p.Vaddr, hdrSize: p.Filesz, regs: dwarfX86}
			case elf.EM_AARCH64:
				info.eh = ehFrame{hdrAddr: p.Vaddr, hdrSize: p.Filesz, regs: dwarfAArch64}
			}
		}
	}
	if id := buildID(ef); id != "" {
		info.build = buildKey{id: id, size: st.Size()}
		info.buildID = hex.EncodeToString([]byte(id))
	}
	info.secEnds = make([]uint64, len(ef.Sections))
	for i, sec := range ef.Sections {
		info.secEnds[i] = sec.Addr + sec.Size
	}
	for i, typ := range []elf.SectionType{elf.SHT_SYMTAB, elf.SHT_DYNSYM} {
		t := newSymTable(ef, typ)
		if t != nil && t.size > maxSymtabBytes {
			info.tablesRefused++
			t = nil
		}
		info.tables[i] = t
	}
	return info, nil
}

// maxSymtabBytes bounds a symbol table that is indexed: each is streamed
// twice and indexed at up to 16 bytes a function, under the symbolizer's
// lock. 64 MiB is 2.8 M ELF64 symbols, four times libtorch_cpu.so's
// functions; a larger (or crafted) table would stall stacks for seconds
// and its index alone outgrow the tool's memory. It is left out: the
// other table, or module+offset frames, still answer.
const maxSymtabBytes = 64 << 20

func buildID(f *elf.File) string {
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE || p.Filesz > maxNoteBytes {
			continue
		}
		data := make([]byte, p.Filesz)
		if _, err := p.ReadAt(data, 0); err != nil {
			continue
		}
		// Notes are padded to the segment's alignment: 4, or 8 for
		// .note.gnu.property segments.
		align := uint64(4)
		if p.Align == 8 {
			align = 8
		}
		for len(data) >= 12 {
			namesz := uint64(f.ByteOrder.Uint32(data[0:]))
			descsz := uint64(f.ByteOrder.Uint32(data[4:]))
			typ := f.ByteOrder.Uint32(data[8:])
			nameEnd := 12 + (namesz+align-1)&^(align-1)
			if 12+namesz > uint64(len(data)) || nameEnd+descsz > uint64(len(data)) {
				break
			}
			if typ == ntGNUBuildID && string(data[12:12+namesz]) == "GNU\x00" && descsz > 0 {
				return string(data[nameEnd : nameEnd+descsz])
			}
			data = data[min(nameEnd+(descsz+align-1)&^(align-1), uint64(len(data))):]
		}
	}
	return ""
}

// newSymTable finds the first section of type typ, as debug/elf does. A
// table that debug/elf could not read whole (or that we cannot stream, such
// as a compressed one) is left out: the other table, or module+offset
// frames, are still useful.
func newSymTable(f *elf.File, typ elf.SectionType) *symTable {
	sec := f.SectionByType(typ)
	if sec == nil || !plainData(sec) || sec.Link == 0 || int(sec.Link) >= len(f.Sections) {
		return nil
	}
	str := f.Sections[sec.Link]
	if !plainData(str) || sec.Size == 0 || sec.Size%symSize(f.Class) != 0 {
		return nil
	}
	return &symTable{off: sec.Offset, size: sec.Size, strOff: str.Offset, strSize: str.Size}
}

func plainData(sec *elf.Section) bool {
	return sec.Type != elf.SHT_NOBITS && sec.Flags&elf.SHF_COMPRESSED == 0
}

func symSize(c elf.Class) uint64 {
	if c == elf.ELFCLASS32 {
		return elf.Sym32Size
	}
	return elf.Sym64Size
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

// lookup finds the function containing vaddr, preferring .symtab, whose local
// functions .dynsym lacks. .dynsym is indexed only when .symtab has no
// answer, which for an unstripped library is rare.
func (e *elfInfo) lookup(vaddr uint64) (symbol, bool) {
	for _, t := range e.tables {
		if t == nil {
			continue
		}
		if t.index == nil {
			t.index = e.buildIndex(t)
		}
		if start, name, ok := t.index.find(vaddr); ok {
			s, ok := e.readName(t, name)
			return symbol{start: start, name: s, nameRefused: !ok}, true
		}
	}
	return symbol{}, false
}

// indexBytes is the memory taken by the indexes built so far.
func (e *elfInfo) indexBytes() int {
	n := 0
	for _, t := range e.tables {
		if t != nil && t.index != nil {
			n += t.index.bytes()
		}
	}
	if e.lineTab != nil {
		n += e.lineTab.bytes
	}
	return n
}

// maxNameBytes bounds a symbol's name: mangled C++ names run to hundreds
// of bytes, and one without an end in a string table of gigabytes would
// otherwise be read whole, for every frame in it.
const maxNameBytes = 64 << 10

// readName reads the NUL-terminated name at offset off of t's string table.
// Like debug/elf, it gives "" for a name that runs past the table; and for
// one over maxNameBytes, with ok false (refused).
func (e *elfInfo) readName(t *symTable, off uint32) (name string, ok bool) {
	// Most names, even mangled C++ ones, fit one read.
	buf := make([]byte, 256)
	var b []byte
	for pos := uint64(off); pos < t.strSize; {
		if len(b) >= maxNameBytes {
			return "", false
		}
		n := min(uint64(len(buf)), t.strSize-pos)
		if _, err := e.f.ReadAt(buf[:n], int64(t.strOff+pos)); err != nil {
			return "", true
		}
		if i := bytes.IndexByte(buf[:n], 0); i >= 0 {
			return string(append(b, buf[:i]...)), true
		}
		b = append(b, buf[:n]...)
		pos += n
	}
	return "", true
}

// rawSym is the part of a symbol table entry that indexing needs.
type rawSym struct {
	value, size uint64
	name        uint32
	shndx       uint16
}

// symsPerRead bounds the buffer that a table is streamed through, whatever
// the table's size (48 KiB for ELF64).
const symsPerRead = 2048

// eachFunc calls fn for every defined function of t, in table order.
// Undefined (imported) and absolute symbols say nothing about this file's
// code.
func (e *elfInfo) eachFunc(t *symTable, fn func(rawSym)) error {
	size := symSize(e.class)
	buf := make([]byte, symsPerRead*size)
	// The first entry is the reserved null symbol.
	for off := size; off < t.size; {
		n := min(uint64(len(buf)), t.size-off)
		if _, err := e.f.ReadAt(buf[:n], int64(t.off+off)); err != nil {
			return err
		}
		for b := buf[:n]; len(b) > 0; b = b[size:] {
			var s rawSym
			var info byte
			if e.class == elf.ELFCLASS32 {
				s = rawSym{name: e.order.Uint32(b[0:]), value: uint64(e.order.Uint32(b[4:])), size: uint64(e.order.Uint32(b[8:])), shndx: e.order.Uint16(b[14:])}
				info = b[12]
			} else {
				s = rawSym{name: e.order.Uint32(b[0:]), shndx: e.order.Uint16(b[6:]), value: e.order.Uint64(b[8:]), size: e.order.Uint64(b[16:])}
				info = b[4]
			}
			if elf.ST_TYPE(info) == elf.STT_FUNC && s.shndx != uint16(elf.SHN_UNDEF) && int(s.shndx) < len(e.secEnds) {
				fn(s)
			}
		}
		off += n
	}
	return nil
}

// buildIndex streams t twice, to count its functions and their address span
// and then to fill an index of exactly that size, so that the peak is the
// index itself rather than a growing slice or the whole table.
func (e *elfInfo) buildIndex(t *symTable) funcIndex {
	n := 0
	lo, hi := uint64(math.MaxUint64), uint64(0)
	err := e.eachFunc(t, func(s rawSym) {
		n++
		lo, hi = min(lo, s.value), max(hi, s.value)
	})
	switch {
	case err != nil || n == 0:
		return funcTable[uint32]{}
	case hi-lo <= math.MaxUint32:
		return buildFuncTable[uint32](e, t, n, lo)
	default:
		return buildFuncTable[uint64](e, t, n, lo)
	}
}

// funcIndex finds the function containing an address.
type funcIndex interface {
	// find returns the function's start and the string-table offset of
	// its name.
	find(vaddr uint64) (start uint64, name uint32, ok bool)
	bytes() int
}

// funcTable holds functions sorted by start, relative to base. Starts fit in
// 32 bits for any file whose functions span less than 4 GiB, which makes an
// entry 12 bytes rather than 16.
type funcTable[A uint32 | uint64] struct {
	base uint64
	fns  []fnEntry[A]
}

type fnEntry[A uint32 | uint64] struct {
	start A      // address - base
	len   uint32 // the function covers [start, start+len)
	name  uint32 // offset in the string table
}

// While an index is built, a function without an ELF size is flagged in len:
// any sized alias is preferred. Lengths are capped below the flag; no real
// function is 2 GiB long.
const (
	sizeless = 1 << 31
	maxLen   = sizeless - 1
)

func buildFuncTable[A uint32 | uint64](e *elfInfo, t *symTable, n int, base uint64) funcIndex {
	fns := make([]fnEntry[A], 0, n)
	err := e.eachFunc(t, func(s rawSym) {
		// A file rewritten in place between the two passes must not grow
		// the index or wrap its offsets.
		if len(fns) == n || s.value < base || s.value-base > uint64(^A(0)) {
			return
		}
		l := uint32(min(s.size, maxLen))
		if s.size == 0 {
			// Hand-written assembly often has no size: such a symbol
			// covers up to the next function (where the search moves on
			// anyway), but not past its own section (which would
			// attribute e.g. PLT stubs to _init).
			secEnd := e.secEnds[s.shndx]
			l = sizeless | uint32(min(max(secEnd, s.value)-s.value, maxLen))
		}
		fns = append(fns, fnEntry[A]{start: A(s.value - base), len: l, name: s.name})
	})
	if err != nil {
		return funcTable[A]{}
	}
	// Among aliases at one address prefer the one with a size, the largest,
	// then keep the first so that the choice is deterministic.
	rank := func(f fnEntry[A]) uint32 {
		if f.len&sizeless != 0 {
			return 0
		}
		return f.len
	}
	slices.SortStableFunc(fns, func(a, b fnEntry[A]) int {
		if c := cmp.Compare(a.start, b.start); c != 0 {
			return c
		}
		return cmp.Compare(rank(b), rank(a))
	})
	fns = slices.CompactFunc(fns, func(a, b fnEntry[A]) bool { return a.start == b.start })
	for i := range fns {
		fns[i].len &^= sizeless
	}
	return funcTable[A]{base: base, fns: fns}
}

func (t funcTable[A]) find(vaddr uint64) (uint64, uint32, bool) {
	if vaddr < t.base {
		return 0, 0, false
	}
	rel := vaddr - t.base
	// Index of the last function starting at or before vaddr.
	i := sort.Search(len(t.fns), func(i int) bool { return uint64(t.fns[i].start) > rel }) - 1
	if i < 0 || rel-uint64(t.fns[i].start) >= uint64(t.fns[i].len) {
		return 0, 0, false
	}
	return t.base + uint64(t.fns[i].start), t.fns[i].name, true
}

func (t funcTable[A]) bytes() int {
	return cap(t.fns) * int(unsafe.Sizeof(fnEntry[A]{}))
}
