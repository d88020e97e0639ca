package symbolize

import "encoding/binary"

// maxRulesPerFile bounds the rules cached for one file; a workload's call
// sites into one library are far fewer.
const maxRulesPerFile = 1 << 14

// ruleAt returns the unwind rule of the frame whose lookup address is addr
// (a return address minus one), and whose it is (CodeRule). An address
// outside any mapping ends the stack; code without call-frame information
// (anonymous executable memory: JIT compilers) is assumed to keep frame
// pointers, as perf assumes.
func (s *Symbolizer) ruleAt(pm *procMaps, addr uint64) CodeRule {
	m := pm.find(addr)
	if m == nil {
		return CodeRule{Rule: endRule}
	}
	e := s.codeOf(pm.pid, m)
	if e == nil {
		return CodeRule{Rule: fpRule}
	}
	off := addr - m.start + m.offset
	vaddr, ok := e.info.vaddr(off)
	if !ok {
		return CodeRule{Rule: endRule, File: e.code, Offset: off}
	}
	if r, ok := e.rules[vaddr]; ok {
		return CodeRule{Rule: r, File: e.code, Offset: off}
	}
	var r Rule
	var found bool
	var err error
	if !s.contain(e, m.path, func() { r, found, err = e.info.rule(vaddr) }) {
		// The file is no longer ELF to the cache: no rule of its is kept.
		return CodeRule{Rule: endRule}
	}
	switch {
	case err != nil:
		// Malformed or over its bounds (a crafted entry's loop): the
		// stack ends here, refused once per address while cached.
		s.refused.Add(1)
		r = endRule
	case !found:
		r = fpRule
	}
	if e.rules == nil || len(e.rules) >= maxRulesPerFile {
		e.rules = map[uint64]Rule{}
	}
	e.rules[vaddr] = r
	return CodeRule{Rule: r, File: e.code, Offset: off}
}

// StackCopy is a thread's stack from a frame on: the frame's return address
// PC (its instruction pointer when Exact: the innermost frame of a syscall),
// the stack pointer and frame pointer (rbp; x29) at it, the link register
// (x30) where PC is the innermost frame's on AArch64 (else 0: unknown), and
// the stack's bytes from SP up. RAMask is applied to every return address
// (0: none): it strips AArch64's pointer authentication codes.
type StackCopy struct {
	PC, SP, BP, LR uint64
	Exact          bool
	RAMask         uint64
	Stack          []byte
}

// UnwindCopy continues a stack that the kernel could not: it walks the
// copy's frames with the call-frame information of the mapped files and
// returns the return addresses of the callers of c.PC (at most max), and the
// rule of every frame it used, by lookup address (return address - 1, or
// c.PC itself when Exact), with the file it is of, for the kernel to walk
// those frames itself next time. The rule of the last
// frame reached is included even when the copy ends before its caller: rules
// depend on the code alone, and the kernel reads the live stack.
func (s *Symbolizer) UnwindCopy(pid int, c StackCopy, max int) (pcs []uint64, rules map[uint64]CodeRule) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pm := s.procMaps(pid)
	rules = map[uint64]CodeRule{}
	read := func(addr uint64) (uint64, bool) {
		if addr < c.SP || addr-c.SP+8 > uint64(len(c.Stack)) {
			return 0, false
		}
		return binary.LittleEndian.Uint64(c.Stack[addr-c.SP:]), true
	}
	mask := c.RAMask
	if mask == 0 {
		mask = ^uint64(0)
	}
	pc, sp, bp, lr := c.PC&mask, c.SP, c.BP, c.LR&mask
	at := pc - 1
	if c.Exact {
		at = pc
	}
	for len(pcs) < max && pc != 0 {
		cr := s.ruleAt(pm, at)
		rules[at] = cr
		r := cr.Rule
		if r.CFA == CFAEnd {
			break
		}
		cfa := sp
		if r.CFA == CFARBP {
			cfa = bp
		}
		cfa += uint64(int64(r.CFAOffset))
		var ra uint64
		if r.RA == RAInLR {
			// Only the innermost frame has the link register's value:
			// a caller's was overwritten by its call.
			ra = lr
		} else {
			var ok bool
			if ra, ok = read(cfa + uint64(int64(r.RAOffset))); !ok {
				break
			}
			ra &= mask
		}
		switch r.RBP {
		case RBPAtCFA:
			var ok bool
			if bp, ok = read(cfa + uint64(int64(r.RBPOffset))); !ok {
				bp = 0
			}
		case RBPUndefined:
			bp = 0
		}
		if ra == 0 {
			break
		}
		pcs = append(pcs, ra)
		pc, sp, at, lr = ra, cfa, ra-1, 0
	}
	return pcs, rules
}
