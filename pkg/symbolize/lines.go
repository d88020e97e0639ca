package symbolize

import (
	"cmp"
	"debug/dwarf"
	"debug/elf"
	"slices"
	"strings"
)

// maxLineBytes bounds the debugging information read for one file's line
// numbers: the sections are held in memory while the file is cached and
// charged to the cache like the symbol indexes. A file with more (a large
// library built -g) keeps its frames without lines.
const maxLineBytes = 8 << 20

// maxLinesCached bounds the addresses whose line is remembered per file.
const maxLinesCached = 4096

// lineTable answers the source file and line of a file's addresses from
// its DWARF (.debug_line for the line, .debug_info for the compile unit
// and for inlined calls). Go binaries carry DWARF by default and C built
// with -g does; a file without it has no lineTable.
type lineTable struct {
	d     *dwarf.Data
	units []unitRange // sorted by lo
	bytes int
	cache map[uint64]srcLine
}

// unitRange is one address range of a compile unit.
type unitRange struct {
	lo, hi uint64
	off    dwarf.Offset
}

// srcLine is a source position; zero when unknown.
type srcLine struct {
	file string
	line int
}

// lines returns e's line table, reading it on first use; nil when the file
// has none or too much.
func (e *elfInfo) lines() *lineTable {
	if e.linesRead {
		return e.lineTab
	}
	e.linesRead = true
	ef, err := elf.NewFile(e.f)
	if err != nil {
		return nil
	}
	var size uint64
	for _, sec := range ef.Sections {
		if !strings.HasPrefix(sec.Name, ".debug_") && !strings.HasPrefix(sec.Name, ".zdebug_") {
			continue
		}
		if strings.HasPrefix(sec.Name, ".zdebug_") {
			// Its size is the compressed one until opened, which reads
			// the size it decompresses to: what DWARF reads, and a
			// crafted file can make that thousands of times larger.
			sec.Open()
		}
		// Summed without overflow: a crafted size must not wrap under the bound.
		if sec.Size > maxLineBytes-size {
			e.linesRefused = true
			return nil
		}
		size += sec.Size
	}
	if size == 0 || ef.Section(".debug_line") == nil && ef.Section(".zdebug_line") == nil {
		return nil
	}
	d, err := ef.DWARF()
	if err != nil {
		return nil
	}
	t := &lineTable{d: d, bytes: int(size), cache: make(map[uint64]srcLine)}
	r := d.Reader()
	for {
		cu, err := r.Next()
		if err != nil || cu == nil {
			break
		}
		if cu.Tag == dwarf.TagCompileUnit {
			ranges, err := d.Ranges(cu)
			if err == nil {
				for _, rg := range ranges {
					t.units = append(t.units, unitRange{lo: rg[0], hi: rg[1], off: cu.Offset})
				}
			}
		}
		r.SkipChildren()
	}
	if len(t.units) == 0 {
		return nil
	}
	slices.SortFunc(t.units, func(a, b unitRange) int { return cmp.Compare(a.lo, b.lo) })
	e.lineTab = t
	return t
}

// line is the source position of the instruction at vaddr in the function
// its symbol names: where code of another function was inlined there, the
// position of the outermost inlined call, so that a frame's line is in the
// function the frame names (Go inlines os.Open into its caller).
func (t *lineTable) line(vaddr uint64) srcLine {
	if l, ok := t.cache[vaddr]; ok {
		return l
	}
	l := t.resolve(vaddr)
	if len(t.cache) >= maxLinesCached {
		clear(t.cache)
	}
	t.cache[vaddr] = l
	return l
}

func (t *lineTable) resolve(vaddr uint64) srcLine {
	i, _ := slices.BinarySearchFunc(t.units, vaddr, func(u unitRange, a uint64) int {
		if u.lo <= a {
			return -1
		}
		return 1
	})
	if i == 0 || vaddr >= t.units[i-1].hi {
		return srcLine{}
	}
	r := t.d.Reader()
	r.Seek(t.units[i-1].off)
	cu, err := r.Next()
	if err != nil || cu == nil {
		return srcLine{}
	}
	lr, err := t.d.LineReader(cu)
	if err != nil || lr == nil {
		return srcLine{}
	}
	if call, ok := t.inlinedCall(r, vaddr); ok {
		idx, _ := call.Val(dwarf.AttrCallFile).(int64)
		ln, _ := call.Val(dwarf.AttrCallLine).(int64)
		if files := lr.Files(); idx >= 0 && int(idx) < len(files) && files[idx] != nil && ln > 0 {
			return srcLine{file: files[idx].Name, line: int(ln)}
		}
	}
	var le dwarf.LineEntry
	if err := lr.SeekPC(vaddr, &le); err != nil || le.File == nil {
		return srcLine{}
	}
	return srcLine{file: le.File.Name, line: le.Line}
}

// inlinedCall finds, below the compile unit r has just read, the function
// containing vaddr and in it the outermost inlined call containing vaddr.
func (t *lineTable) inlinedCall(r *dwarf.Reader, vaddr uint64) (*dwarf.Entry, bool) {
	// C++ definitions may sit inside namespaces: their entries are read
	// too, depth counting the namespaces open.
	for depth := 0; ; {
		e, err := r.Next()
		if err != nil || e == nil {
			return nil, false
		}
		switch {
		case e.Tag == 0:
			if depth == 0 {
				return nil, false
			}
			depth--
			continue
		case e.Tag == dwarf.TagSubprogram && t.contains(e, vaddr):
			if !e.Children {
				return nil, false
			}
			return t.outermostCall(r, vaddr)
		case (e.Tag == dwarf.TagNamespace || e.Tag == dwarf.TagModule) && e.Children:
			depth++
			continue
		}
		if e.Children {
			r.SkipChildren()
		}
	}
}

// outermostCall looks among the entries of one level (and in the lexical
// blocks containing vaddr) for an inlined call containing vaddr. It reads
// up to the end of the level when there is none.
func (t *lineTable) outermostCall(r *dwarf.Reader, vaddr uint64) (*dwarf.Entry, bool) {
	for {
		e, err := r.Next()
		if err != nil || e == nil || e.Tag == 0 {
			return nil, false
		}
		switch {
		case e.Tag == dwarf.TagInlinedSubroutine && t.contains(e, vaddr):
			return e, true
		case e.Tag == dwarf.TagLexDwarfBlock && e.Children && t.contains(e, vaddr):
			if call, ok := t.outermostCall(r, vaddr); ok {
				return call, true
			}
			continue
		}
		if e.Children {
			r.SkipChildren()
		}
	}
}

func (t *lineTable) contains(e *dwarf.Entry, vaddr uint64) bool {
	ranges, err := t.d.Ranges(e)
	if err != nil {
		return false
	}
	for _, rg := range ranges {
		if rg[0] <= vaddr && vaddr < rg[1] {
			return true
		}
	}
	return false
}
