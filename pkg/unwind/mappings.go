package unwind

import (
	"math/bits"
	"slices"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
)

// The kernel keys rules by file and file offset (bpf/unwind.h), and finds
// which file an address is in from the trie of each process's code
// mappings that user space keeps here: a process's mappings are entered
// when a view starts tracking it (Learn), so that its first stack through
// code another process taught the kernel already is unwound in the kernel;
// again when a request shows code the trie does not know (dlopen) or an
// exec; and they leave with the process (Drop). The rules of a file go once
// no process left maps it.

// ASID names an address space as bpf/unwind.h's unwind_asid does.
func ASID(l procinfo.Layout) uint64 {
	return l.StartStack*0x9e3779b97f4a7c15 ^ l.StartBrk
}

// ownCodeBit marks the ids of a process's own code (UNWIND_OWN_CODE).
const ownCodeBit = 1 << 63

// ownCode is unwind_own_code of bpf/unwind.h: the id under which the rules
// of the process's code that is no file's are kept.
func ownCode(tgid uint32, asid uint64) uint64 {
	return ownCodeBit | asid&0x7fffffff00000000 | uint64(tgid)
}

// Block is one entry of the trie: the addresses of an address space that
// share their first Bits bits with Addr.
type Block struct {
	TGID uint32
	ASID uint64
	Addr uint64
	Bits int
}

// blocks splits [start, end) into the fewest aligned blocks, each a power
// of two long: at most two per bit of an address, a handful for most
// mappings.
func blocks(start, end uint64) []Block {
	var out []Block
	for start < end {
		// The largest block aligned at start that ends by end.
		size := uint64(1) << 63
		if start != 0 {
			size = start & -start
		}
		for size > end-start {
			size >>= 1
		}
		out = append(out, Block{Addr: start, Bits: 64 - bits.TrailingZeros64(size)})
		start += size
	}
	return out
}

// proc is a process's address space as the trie has it.
type proc struct {
	asid uint64
	maps []entered // in address order
}

// entered is one code mapping of a process.
type entered struct {
	symbolize.CodeMapping
	// in: all its blocks are in the trie, so the kernel keys the rules
	// of its addresses by its file. A mapping that did not fit (counted)
	// has rules of the process's own.
	in bool
}

func (p *proc) find(addr uint64) *entered {
	i, found := slices.BinarySearchFunc(p.maps, addr, func(e entered, a uint64) int {
		switch {
		case e.End <= a:
			return -1
		case e.Start > a:
			return 1
		}
		return 0
	})
	if !found {
		return nil
	}
	return &p.maps[i]
}

// stale reports whether rules, the symbolizer's, are of other code than
// the trie has at their addresses: a library loaded since the process's
// mappings were entered, or a file the symbolizer cannot read now.
func (p *proc) stale(rules map[uint64]symbolize.CodeRule) bool {
	for addr, r := range rules {
		e := p.find(addr)
		var file uint64
		if e != nil {
			file = e.File
		}
		if file != r.File || (file != 0 && r.Offset != addr-e.Bias) {
			return true
		}
	}
	return false
}

// key is where the kernel looks the rule of addr up in process tgid: by the
// file where the trie has one there (false where r is not that file's
// rule: stored, it would be wrong for every process mapping the file),
// else among the process's own.
func (p *proc) key(tgid uint32, addr uint64, r symbolize.CodeRule) (file, at uint64, ok bool) {
	if e := p.find(addr); e != nil && e.File != 0 && e.in {
		return r.File, r.Offset, r.File == e.File && r.Offset == addr-e.Bias
	}
	return ownCode(tgid, p.asid), addr, true
}

// Learn enters pid's code mappings into the trie: called when a view
// starts tracking it, so that its stacks through code whose rules other
// processes taught the kernel are unwound in the kernel from the first.
func (s *Server) Learn(pid int) {
	l, err := s.layout(pid)
	if err != nil {
		return // gone, or its layout hidden: its first request learns it
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.learn(uint32(pid), ASID(l))
}

// learn makes process tgid known in address space asid, a process known
// in another one forgotten (an exec: the old image's mappings and rules
// are no more use), and (re)enters its mappings as /proc shows them now.
// nil where the process has left asid already: nothing of it is worth
// keeping. A process whose layout cannot be read (gone, or hidden) is
// known without mappings: its rules are its own, as for anonymous code.
// Called with s.mu held.
func (s *Server) learn(tgid uint32, asid uint64) *proc {
	l, err := s.layout(int(tgid))
	if err == nil && ASID(l) != asid {
		return nil
	}
	p := s.procs[tgid]
	if p != nil && p.asid != asid {
		s.forget(tgid, p)
		p = nil
	}
	if p == nil {
		p = &proc{asid: asid}
		s.procs[tgid] = p
	}
	if err != nil {
		return p
	}
	ms, err := s.sym.CodeMappings(int(tgid))
	// The mappings are asid's only if no exec came while they were read.
	if l, lerr := s.layout(int(tgid)); err != nil || lerr != nil || ASID(l) != asid {
		return p
	}
	s.enter(tgid, p, ms)
	return p
}

// enter makes the trie hold ms for p: the mappings gone leave it, then the
// new ones enter it (a mapping whose file changed, at the same addresses,
// is both), those unchanged stay as they are.
func (s *Server) enter(tgid uint32, p *proc, ms []symbolize.CodeMapping) {
	now := map[symbolize.CodeMapping]bool{}
	for _, m := range ms {
		now[m] = true
	}
	kept := map[symbolize.CodeMapping]entered{}
	for _, e := range p.maps {
		if now[e.CodeMapping] {
			kept[e.CodeMapping] = e
		} else {
			s.remove(tgid, p.asid, e)
		}
	}
	p.maps = make([]entered, 0, len(ms))
	for _, m := range ms {
		e, ok := kept[m]
		if !ok {
			e = s.add(tgid, p.asid, m)
		}
		p.maps = append(p.maps, e)
	}
}

// add enters one mapping: all its blocks or, where the trie is full
// (counted), none, so that the kernel keys all its rules one way.
func (s *Server) add(tgid uint32, asid uint64, m symbolize.CodeMapping) entered {
	if m.File != 0 {
		s.files[m.File]++
	}
	bs := blocks(m.Start, m.End)
	for i, b := range bs {
		b.TGID, b.ASID = tgid, asid
		if err := s.tables.SetMapping(b, m); err != nil {
			s.mappingsLost.Add(1)
			for _, b := range bs[:i] {
				b.TGID, b.ASID = tgid, asid
				_ = s.tables.DeleteMapping(b)
			}
			return entered{CodeMapping: m}
		}
	}
	return entered{CodeMapping: m, in: true}
}

// remove takes one mapping out of the trie.
func (s *Server) remove(tgid uint32, asid uint64, e entered) {
	if e.File != 0 {
		if s.files[e.File]--; s.files[e.File] <= 0 {
			delete(s.files, e.File)
		}
	}
	if !e.in {
		return
	}
	for _, b := range blocks(e.Start, e.End) {
		b.TGID, b.ASID = tgid, asid
		// Gone already only if the map was emptied behind our back.
		_ = s.tables.DeleteMapping(b)
	}
}

// forget takes a process's mappings out of the trie. Called with s.mu held.
func (s *Server) forget(tgid uint32, p *proc) {
	for _, e := range p.maps {
		s.remove(tgid, p.asid, e)
	}
	delete(s.procs, tgid)
}

// live reports whether rules of code file may still be used: a file some
// known process maps, or the own code of a known process's address space.
func (s *Server) live(file uint64) bool {
	if file&ownCodeBit != 0 {
		p := s.procs[uint32(file)]
		return p != nil && ownCode(uint32(file), p.asid) == file
	}
	return s.files[file] > 0
}

// Drop forgets the processes for which tracked is false (called with the
// owner's state, every few polls): their mappings leave the trie, and the
// rules of code that no process left maps leave the rule map.
func (s *Server) Drop(tracked func(tgid uint32) bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for tgid, p := range s.procs {
		if !tracked(tgid) {
			s.forget(tgid, p)
		}
	}
	return s.tables.DropRules(s.live)
}
