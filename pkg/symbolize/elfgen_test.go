package symbolize

import (
	"debug/elf"
	"encoding/binary"
	"iter"
	"os"
	"testing"
)

// genSym is a symbol table entry of a generated ELF file.
type genSym struct {
	name        string
	value, size uint64
	typ         elf.SymType
	shndx       elf.SectionIndex // genTextShndx(i) for text i
}

// genText is an executable section of a generated ELF file, loaded by a
// segment of its own from a page-aligned file offset. addr must be
// page-aligned.
type genText struct{ addr, size uint64 }

// genELF describes an ELF shared library written by the test itself, so that
// tables of any size and shape need no toolchain. Its code is all zeros.
type genELF struct {
	class   elf.Class
	buildID []byte // nil: no build-id note
	texts   []genText
	symtab  iter.Seq[genSym] // nil: no .symtab
	dynsym  iter.Seq[genSym] // nil: no .dynsym
}

func genTextShndx(i int) elf.SectionIndex { return elf.SectionIndex(1 + i) }

const genPage = 0x1000

// write writes g to path and returns the file offset each text is loaded from.
func (g genELF) write(tb testing.TB, path string) []uint64 {
	tb.Helper()
	is64 := g.class == elf.ELFCLASS64
	le := binary.LittleEndian
	var ehSize, phSize, shSize uint64 = 52, 32, 40
	if is64 {
		ehSize, phSize, shSize = 64, 56, 64
	}
	align := func(n, a uint64) uint64 { return (n + a - 1) &^ (a - 1) }

	nphdr := uint64(len(g.texts))
	if g.buildID != nil {
		nphdr++
	}
	noteOff := ehSize + nphdr*phSize
	var note []byte
	if g.buildID != nil {
		note = le.AppendUint32(note, 4)
		note = le.AppendUint32(note, uint32(len(g.buildID)))
		note = le.AppendUint32(note, ntGNUBuildID)
		note = append(note, "GNU\x00"...)
		note = append(note, g.buildID...)
		for len(note)%4 != 0 {
			note = append(note, 0)
		}
	}
	textOffs := make([]uint64, len(g.texts))
	end := noteOff + uint64(len(note))
	for i, t := range g.texts {
		textOffs[i] = align(end, genPage)
		end = textOffs[i] + t.size
	}

	// Sections after the texts: [note], tables, .shstrtab.
	type section struct {
		name                   string
		typ                    elf.SectionType
		flags                  elf.SectionFlag
		addr, off, size, align uint64
		link                   uint32
		entsize                uint64
	}
	var sections []section
	for i, t := range g.texts {
		sections = append(sections, section{name: ".text", typ: elf.SHT_PROGBITS, flags: elf.SHF_ALLOC | elf.SHF_EXECINSTR,
			addr: t.addr, off: textOffs[i], size: t.size, align: 16})
	}
	if note != nil {
		sections = append(sections, section{name: ".note.gnu.build-id", typ: elf.SHT_NOTE, flags: elf.SHF_ALLOC,
			off: noteOff, size: uint64(len(note)), align: 4})
	}
	var tail []byte
	tailOff := align(end, 8)
	addData := func(s section, data []byte) {
		for len(tail)%8 != 0 {
			tail = append(tail, 0)
		}
		s.off, s.size = tailOff+uint64(len(tail)), uint64(len(data))
		tail = append(tail, data...)
		sections = append(sections, s)
	}
	symSize := uint64(elf.Sym32Size)
	if is64 {
		symSize = elf.Sym64Size
	}
	addTable := func(name, strName string, typ elf.SectionType, syms iter.Seq[genSym]) {
		str := []byte{0}
		tab := make([]byte, symSize) // the null symbol
		for s := range syms {
			nameOff := uint32(len(str))
			str = append(append(str, s.name...), 0)
			info := elf.ST_INFO(elf.STB_GLOBAL, s.typ)
			tab = le.AppendUint32(tab, nameOff)
			if is64 {
				tab = append(tab, info, 0)
				tab = le.AppendUint16(tab, uint16(s.shndx))
				tab = le.AppendUint64(tab, s.value)
				tab = le.AppendUint64(tab, s.size)
			} else {
				tab = le.AppendUint32(tab, uint32(s.value))
				tab = le.AppendUint32(tab, uint32(s.size))
				tab = append(tab, info, 0)
				tab = le.AppendUint16(tab, uint16(s.shndx))
			}
		}
		// The string table follows its symbol table.
		link := uint32(len(sections) + 2)
		addData(section{name: name, typ: typ, link: link, align: 8, entsize: symSize}, tab)
		addData(section{name: strName, typ: elf.SHT_STRTAB, align: 1}, str)
	}
	if g.symtab != nil {
		addTable(".symtab", ".strtab", elf.SHT_SYMTAB, g.symtab)
	}
	if g.dynsym != nil {
		addTable(".dynsym", ".dynstr", elf.SHT_DYNSYM, g.dynsym)
	}
	shstr := []byte{0}
	names := make([]uint32, len(sections)+1)
	for i, s := range sections {
		names[i] = uint32(len(shstr))
		shstr = append(append(shstr, s.name...), 0)
	}
	names[len(sections)] = uint32(len(shstr))
	shstr = append(shstr, ".shstrtab\x00"...)
	addData(section{name: ".shstrtab", typ: elf.SHT_STRTAB, align: 1}, shstr)
	for len(tail)%8 != 0 {
		tail = append(tail, 0)
	}
	shOff := tailOff + uint64(len(tail))

	// Section headers, with the null section first.
	tail = append(tail, make([]byte, shSize)...)
	for i, s := range sections {
		tail = le.AppendUint32(tail, names[i])
		tail = le.AppendUint32(tail, uint32(s.typ))
		word := func(v uint64) {
			if is64 {
				tail = le.AppendUint64(tail, v)
			} else {
				tail = le.AppendUint32(tail, uint32(v))
			}
		}
		word(uint64(s.flags))
		word(s.addr)
		word(s.off)
		word(s.size)
		tail = le.AppendUint32(tail, s.link)
		tail = le.AppendUint32(tail, 0)
		word(s.align)
		word(s.entsize)
	}

	var head []byte
	word := func(v uint64) {
		if is64 {
			head = le.AppendUint64(head, v)
		} else {
			head = le.AppendUint32(head, uint32(v))
		}
	}
	head = append(head, 0x7f, 'E', 'L', 'F', byte(g.class), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT))
	head = append(head, make([]byte, 9)...)
	machine := elf.EM_386
	if is64 {
		machine = elf.EM_X86_64
	}
	head = le.AppendUint16(head, uint16(elf.ET_DYN))
	head = le.AppendUint16(head, uint16(machine))
	head = le.AppendUint32(head, uint32(elf.EV_CURRENT))
	word(0) // entry
	word(ehSize)
	word(shOff)
	head = le.AppendUint32(head, 0) // flags
	head = le.AppendUint16(head, uint16(ehSize))
	head = le.AppendUint16(head, uint16(phSize))
	head = le.AppendUint16(head, uint16(nphdr))
	head = le.AppendUint16(head, uint16(shSize))
	head = le.AppendUint16(head, uint16(len(sections)+1))
	head = le.AppendUint16(head, uint16(len(sections)))
	prog := func(typ elf.ProgType, flags elf.ProgFlag, off, vaddr, size, align uint64) {
		head = le.AppendUint32(head, uint32(typ))
		if is64 {
			head = le.AppendUint32(head, uint32(flags))
		}
		word(off)
		word(vaddr)
		word(vaddr)
		word(size)
		word(size)
		if !is64 {
			head = le.AppendUint32(head, uint32(flags))
		}
		word(align)
	}
	for i, t := range g.texts {
		prog(elf.PT_LOAD, elf.PF_R|elf.PF_X, textOffs[i], t.addr, t.size, genPage)
	}
	if note != nil {
		prog(elf.PT_NOTE, elf.PF_R, noteOff, 0, uint64(len(note)), 4)
	}
	head = append(head, note...)

	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	// The texts between head and tail stay a hole of zeros.
	if _, err := f.WriteAt(head, 0); err != nil {
		tb.Fatal(err)
	}
	if _, err := f.WriteAt(tail, int64(tailOff)); err != nil {
		tb.Fatal(err)
	}
	return textOffs
}
