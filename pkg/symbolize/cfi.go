package symbolize

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Call-frame information (.eh_frame) of x86-64 and AArch64 ELF files: for an
// instruction address, where its frame's caller starts (the canonical frame
// address, CFA), where the return address is (on the stack, or on AArch64
// still in the link register x30) and where the caller's frame pointer (rbp;
// x29) was saved. With that, a stack of code built without frame pointers can
// be walked.
//
// The file's .eh_frame_hdr (segment PT_GNU_EH_FRAME, which survives strip)
// has a sorted table of function starts; it is binary-searched in the file,
// and only the one FDE and CIE needed are read and run. Nothing is kept per
// function: libtorch_cuda.so has hundreds of thousands of FDEs, and
// debug-info parsers that load them all (Delve's, the Go runtime's tooling)
// would take more memory than the whole tool may use. Callers cache rules by
// address.

// CFA bases, as bpf/unwind.h names them. RSP and RBP are the stack and
// frame pointer registers: rsp and rbp on x86-64, sp and x29 on AArch64.
const (
	CFAEnd uint8 = iota // no caller: the outermost frame, or not unwindable
	CFARSP              // CFA = rsp + CFAOffset
	CFARBP              // CFA = rbp + CFAOffset
)

// Rules for the caller's frame pointer (rbp; x29), as bpf/unwind.h names
// them.
const (
	RBPSame      uint8 = iota // unchanged in this frame
	RBPAtCFA                  // saved at CFA + RBPOffset
	RBPUndefined              // not recoverable
)

// Rules for the return address, as bpf/unwind.h names them.
const (
	// RAAtCFA: saved at CFA + RAOffset (x86-64: always CFA - 8, where the
	// call pushed it; AArch64: where the prologue stored x30).
	RAAtCFA uint8 = iota
	// RAInLR: still in the link register x30 (AArch64, before the
	// prologue stores it and in leaf functions). Only the innermost frame
	// of a stack has the register's value.
	RAInLR
)

// Rule says how to find the caller of a frame from the frame's registers.
// 16 bytes, as bpf/unwind.h's struct unwind_rule: the kernel keeps one per
// instruction that user space taught it.
type Rule struct {
	CFA       uint8
	RBP       uint8
	RA        uint8
	CFAOffset int32
	RBPOffset int32
	RAOffset  int32
}

// endRule ends a stack.
var endRule = Rule{CFA: CFAEnd}

// fpRule is the frame-pointer convention, for code without call-frame
// information such as JIT-compiled code. x86-64's (push rbp; mov rsp, rbp)
// and AArch64's frame record (stp x29, x30, [sp, -N]!; mov x29, sp: x29
// points at the saved x29 and x30) have the same offsets.
var fpRule = Rule{CFA: CFARBP, CFAOffset: 16, RBP: RBPAtCFA, RBPOffset: -16, RA: RAAtCFA, RAOffset: -8}

// dwarfRegs are the DWARF numbers of the registers a rule is made of, in
// one machine's psABI.
type dwarfRegs struct {
	fp, sp, ra uint64
	// negateRAState: DW_CFA_AARCH64_negate_ra_state (0x2d, where other
	// machines have DW_CFA_GNU_window_save) toggles whether the return
	// address is signed (pointer authentication). Nothing here follows
	// it: the walkers strip every return address of its signature.
	negateRAState bool
	// raInLR: the return address is a register (x30) that an unspecified
	// or same-value rule leaves in the link register; on x86-64 it is
	// only ever on the stack.
	raInLR bool
}

var (
	// x86-64: System V psABI, figure 3.36 (rbp 6, rsp 7, return address 16).
	dwarfX86 = dwarfRegs{fp: 6, sp: 7, ra: 16}
	// AArch64: DWARF for the Arm 64-bit Architecture (x29 29, x30 30, sp 31).
	dwarfAArch64 = dwarfRegs{fp: 29, sp: 31, ra: 30, negateRAState: true, raInLR: true}
)

// Pointer encodings (DW_EH_PE_*), as in LSB's "Exception Frames".
const (
	peAbsptr  = 0x00
	peUleb128 = 0x01
	peUdata2  = 0x02
	peUdata4  = 0x03
	peUdata8  = 0x04
	peSleb128 = 0x09
	peSdata2  = 0x0a
	peSdata4  = 0x0b
	peSdata8  = 0x0c
	pePcrel   = 0x10
	peDatarel = 0x30
	peOmit    = 0xff
)

var errCFI = errors.New("malformed call-frame information")

// ehFrame locates the call-frame information of one file.
type ehFrame struct {
	hdrAddr, hdrSize uint64 // .eh_frame_hdr
	regs             dwarfRegs
}

// cfiReader decodes .eh_frame data read from the file at a known address.
type cfiReader struct {
	b    []byte
	pos  int
	addr uint64 // virtual address of b[0]
	err  error
}

func (r *cfiReader) fail() {
	if r.err == nil {
		r.err = errCFI
	}
}

func (r *cfiReader) need(n int) bool {
	if r.err != nil || n < 0 || r.pos+n > len(r.b) {
		r.fail()
		return false
	}
	return true
}

// skip moves past n bytes, which must be there. n is read from the file:
// as an int it could be negative, move back, and make a program loop.
func (r *cfiReader) skip(n uint64) {
	if !r.need(0) || n > uint64(len(r.b)-r.pos) {
		r.fail()
		return
	}
	r.pos += int(n)
}

func (r *cfiReader) u8() uint8 {
	if !r.need(1) {
		return 0
	}
	r.pos++
	return r.b[r.pos-1]
}

func (r *cfiReader) u16() uint16 {
	if !r.need(2) {
		return 0
	}
	r.pos += 2
	return binary.LittleEndian.Uint16(r.b[r.pos-2:])
}

func (r *cfiReader) u32() uint32 {
	if !r.need(4) {
		return 0
	}
	r.pos += 4
	return binary.LittleEndian.Uint32(r.b[r.pos-4:])
}

func (r *cfiReader) u64() uint64 {
	if !r.need(8) {
		return 0
	}
	r.pos += 8
	return binary.LittleEndian.Uint64(r.b[r.pos-8:])
}

func (r *cfiReader) uleb() uint64 {
	var v uint64
	for shift := 0; ; shift += 7 {
		c := r.u8()
		if r.err != nil {
			return 0
		}
		if shift < 64 {
			v |= uint64(c&0x7f) << shift
		}
		if c&0x80 == 0 {
			return v
		}
	}
}

func (r *cfiReader) sleb() int64 {
	var v int64
	shift := 0
	for {
		c := r.u8()
		if r.err != nil {
			return 0
		}
		if shift < 64 {
			v |= int64(c&0x7f) << shift
		}
		shift += 7
		if c&0x80 == 0 {
			if shift < 64 && c&0x40 != 0 {
				v |= -1 << shift
			}
			return v
		}
	}
}

// pointer decodes a pointer in encoding enc; datarel is relative to base.
func (r *cfiReader) pointer(enc uint8, base uint64) uint64 {
	here := r.addr + uint64(r.pos)
	var v uint64
	switch enc & 0x0f {
	case peAbsptr, peUdata8, peSdata8:
		v = r.u64()
	case peUleb128:
		v = r.uleb()
	case peUdata2:
		v = uint64(r.u16())
	case peUdata4:
		v = uint64(r.u32())
	case peSleb128:
		v = uint64(r.sleb())
	case peSdata2:
		v = uint64(int64(int16(r.u16())))
	case peSdata4:
		v = uint64(int64(int32(r.u32())))
	default:
		r.fail()
	}
	switch enc & 0x70 {
	case 0:
	case pePcrel:
		v += here
	case peDatarel:
		v += base
	default:
		r.fail()
	}
	return v
}

// maxCFIEntry bounds one CIE or FDE read from a file; real ones are a few
// dozen bytes, rarely a few hundred.
const maxCFIEntry = 64 << 10

// readAt reads n bytes at virtual address addr of the file.
func (e *elfInfo) readAt(addr uint64, n int) ([]byte, error) {
	for _, l := range e.loads {
		if addr >= l.vaddr && addr < l.vaddr+l.filesz {
			n = int(min(uint64(n), l.vaddr+l.filesz-addr))
			b := make([]byte, n)
			_, err := e.f.ReadAt(b, int64(addr-l.vaddr+l.off))
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			return b, nil
		}
	}
	return nil, fmt.Errorf("address %#x is not loaded from the file", addr)
}

// entry reads the CIE or FDE at addr: its body (after the length) and the
// address the body starts at.
func (e *elfInfo) entry(addr uint64) (*cfiReader, error) {
	head, err := e.readAt(addr, 12)
	if err != nil || len(head) < 4 {
		return nil, errCFI
	}
	size, skip := uint64(binary.LittleEndian.Uint32(head)), uint64(4)
	if size == 0xffffffff {
		if len(head) < 12 {
			return nil, errCFI
		}
		size, skip = binary.LittleEndian.Uint64(head[4:]), 12
	}
	if size == 0 || size > maxCFIEntry {
		return nil, errCFI
	}
	b, err := e.readAt(addr+skip, int(size))
	if err != nil || uint64(len(b)) < size {
		return nil, errCFI
	}
	return &cfiReader{b: b, addr: addr + skip}, nil
}

// cie is what an FDE takes from its CIE.
type cie struct {
	codeAlign uint64
	dataAlign int64
	ra        uint64
	fdeEnc    uint8
	hasAug    bool // 'z': FDEs carry an augmentation data length
	initial   []byte
	signal    bool
}

func (e *elfInfo) parseCIE(addr uint64) (*cie, error) {
	r, err := e.entry(addr)
	if err != nil {
		return nil, err
	}
	if r.u32() != 0 {
		return nil, errCFI // not a CIE
	}
	c := &cie{fdeEnc: peAbsptr}
	version := r.u8()
	end := bytes.IndexByte(r.b[r.pos:], 0)
	if end < 0 {
		return nil, errCFI
	}
	aug := string(r.b[r.pos : r.pos+end])
	r.pos += end + 1
	if len(aug) >= 2 && aug[:2] == "eh" {
		r.u64()
		aug = aug[2:]
	}
	c.codeAlign = r.uleb()
	c.dataAlign = r.sleb()
	if version == 1 {
		c.ra = uint64(r.u8())
	} else {
		c.ra = r.uleb()
	}
	if len(aug) > 0 && aug[0] == 'z' {
		c.hasAug = true
		n := r.uleb()
		augStart := r.pos
		for _, a := range aug[1:] {
			switch a {
			case 'R':
				c.fdeEnc = r.u8()
			case 'P':
				enc := r.u8()
				r.pointer(enc&0x7f, 0)
			case 'L':
				r.u8()
			case 'S':
				c.signal = true
			}
		}
		r.pos = augStart
		r.skip(n)
	}
	if !r.need(0) {
		return nil, r.err
	}
	c.initial = r.b[r.pos:]
	return c, nil
}

// cfiState is one row of the unwind table, for the registers we follow.
type cfiState struct {
	cfaReg  uint64
	cfaOff  int64
	cfaExpr bool
	rbp     regRule
	ra      regRule
}

type regRule struct {
	kind uint8 // ruleSame, ruleOffset, ruleUndefined, ruleOther
	off  int64
}

const (
	ruleSame = iota
	ruleOffset
	ruleUndefined
	ruleOther
)

// rule looks up the rule at virtual address vaddr of the file. ok is false
// when the file has no FDE covering vaddr.
func (e *elfInfo) rule(vaddr uint64) (Rule, bool, error) {
	if e.eh.hdrSize == 0 {
		return Rule{}, false, nil
	}
	fde, err := e.findFDE(vaddr)
	if err != nil || fde == 0 {
		return Rule{}, false, err
	}
	r, err := e.entry(fde)
	if err != nil {
		return Rule{}, false, err
	}
	ciePtr := r.addr + uint64(r.pos)
	off := r.u32()
	if off == 0 {
		return Rule{}, false, errCFI
	}
	c, err := e.parseCIE(ciePtr - uint64(off))
	if err != nil {
		return Rule{}, false, err
	}
	start := r.pointer(c.fdeEnc, 0)
	length := r.pointer(c.fdeEnc&0x0f, 0)
	if r.err != nil {
		return Rule{}, false, r.err
	}
	if vaddr < start || vaddr >= start+length {
		return Rule{}, false, nil
	}
	if c.hasAug {
		r.skip(r.uleb())
	}
	if !r.need(0) {
		return Rule{}, false, r.err
	}
	init := cfiState{}
	regs := &e.eh.regs
	if err := c.run(regs, &init, nil, c.initial, 0, 0, ^uint64(0)); err != nil {
		return Rule{}, false, err
	}
	st := init
	if err := c.run(regs, &st, &init, r.b[r.pos:], r.addr+uint64(r.pos), start, vaddr); err != nil {
		return Rule{}, false, err
	}
	return st.rule(c, regs), true, nil
}

// rule turns a row into what the kernel can follow.
func (st *cfiState) rule(c *cie, regs *dwarfRegs) Rule {
	if st.cfaExpr || c.ra != regs.ra {
		// Expressions (signal frames, stack realignment) end the stack.
		return endRule
	}
	out := Rule{CFAOffset: int32(st.cfaOff)}
	switch {
	case st.ra.kind == ruleOffset:
		out.RA, out.RAOffset = RAAtCFA, int32(st.ra.off)
	case st.ra.kind == ruleSame && regs.raInLR:
		out.RA = RAInLR
	default:
		// An undefined return address (_start, thread entry) ends the
		// stack, as one the walkers cannot follow.
		return endRule
	}
	switch st.cfaReg {
	case regs.sp:
		out.CFA = CFARSP
	case regs.fp:
		out.CFA = CFARBP
	default:
		return endRule
	}
	switch st.rbp.kind {
	case ruleSame:
		out.RBP = RBPSame
	case ruleOffset:
		out.RBP, out.RBPOffset = RBPAtCFA, int32(st.rbp.off)
	default:
		out.RBP = RBPUndefined
	}
	return out
}

// maxRemembered bounds DW_CFA_remember_state's stack: compilers nest it
// once or twice (around epilogues); a crafted entry could otherwise keep
// a row for each of its bytes.
const maxRemembered = 64

// run executes call-frame instructions from location loc until the row
// covering target. init is the CIE's row, for DW_CFA_restore; addr is the
// instructions' own address, for DW_CFA_set_loc's encoding.
func (c *cie) run(regs *dwarfRegs, st *cfiState, init *cfiState, prog []byte, addr, loc, target uint64) error {
	r := &cfiReader{b: prog, addr: addr}
	var saved []cfiState
	// The return address is the CIE's column: on AArch64 it is x30's own.
	setReg := func(reg uint64, rr regRule) {
		switch reg {
		case regs.fp:
			st.rbp = rr
		case c.ra:
			st.ra = rr
		}
	}
	restore := func(reg uint64) {
		if init == nil {
			setReg(reg, regRule{})
			return
		}
		switch reg {
		case regs.fp:
			st.rbp = init.rbp
		case c.ra:
			st.ra = init.ra
		}
	}
	advance := func(delta uint64) bool {
		loc += delta * c.codeAlign
		return loc <= target
	}
	for r.pos < len(r.b) && r.err == nil {
		op := r.u8()
		switch op >> 6 {
		case 1: // DW_CFA_advance_loc
			if !advance(uint64(op & 0x3f)) {
				return nil
			}
			continue
		case 2: // DW_CFA_offset
			setReg(uint64(op&0x3f), regRule{ruleOffset, int64(r.uleb()) * c.dataAlign})
			continue
		case 3: // DW_CFA_restore
			restore(uint64(op & 0x3f))
			continue
		}
		switch op {
		case 0x00: // nop
		case 0x01: // set_loc
			loc = r.pointer(c.fdeEnc, 0)
			if loc > target {
				return nil
			}
		case 0x02:
			if !advance(uint64(r.u8())) {
				return nil
			}
		case 0x03:
			if !advance(uint64(r.u16())) {
				return nil
			}
		case 0x04:
			if !advance(uint64(r.u32())) {
				return nil
			}
		case 0x05: // offset_extended
			reg := r.uleb()
			setReg(reg, regRule{ruleOffset, int64(r.uleb()) * c.dataAlign})
		case 0x06: // restore_extended
			restore(r.uleb())
		case 0x07: // undefined
			setReg(r.uleb(), regRule{kind: ruleUndefined})
		case 0x08: // same_value
			setReg(r.uleb(), regRule{kind: ruleSame})
		case 0x09: // register
			reg := r.uleb()
			r.uleb()
			setReg(reg, regRule{kind: ruleOther})
		case 0x0a: // remember_state
			if len(saved) == maxRemembered {
				return fmt.Errorf("%w: states remembered over %d deep", errCFI, maxRemembered)
			}
			saved = append(saved, *st)
		case 0x0b: // restore_state
			if len(saved) == 0 {
				return errCFI
			}
			// Whole rows, CFA included, as libgcc's and LLVM's
			// unwinders do: compilers emit the pair around epilogues.
			*st = saved[len(saved)-1]
			saved = saved[:len(saved)-1]
		case 0x0c: // def_cfa
			st.cfaReg, st.cfaOff, st.cfaExpr = r.uleb(), int64(r.uleb()), false
		case 0x0d: // def_cfa_register
			st.cfaReg, st.cfaExpr = r.uleb(), false
		case 0x0e: // def_cfa_offset
			st.cfaOff = int64(r.uleb())
		case 0x0f: // def_cfa_expression
			r.skip(r.uleb())
			st.cfaExpr = true
		case 0x10: // expression
			reg := r.uleb()
			r.skip(r.uleb())
			setReg(reg, regRule{kind: ruleOther})
		case 0x11: // offset_extended_sf
			reg := r.uleb()
			setReg(reg, regRule{ruleOffset, r.sleb() * c.dataAlign})
		case 0x12: // def_cfa_sf
			st.cfaReg, st.cfaOff, st.cfaExpr = r.uleb(), r.sleb()*c.dataAlign, false
		case 0x13: // def_cfa_offset_sf
			st.cfaOff = r.sleb() * c.dataAlign
		case 0x14, 0x15: // val_offset(_sf)
			reg := r.uleb()
			if op == 0x14 {
				r.uleb()
			} else {
				r.sleb()
			}
			setReg(reg, regRule{kind: ruleOther})
		case 0x16: // val_expression
			reg := r.uleb()
			r.skip(r.uleb())
			setReg(reg, regRule{kind: ruleOther})
		case 0x2d: // AARCH64_negate_ra_state (GNU_window_save elsewhere)
			if !regs.negateRAState {
				return fmt.Errorf("%w: opcode %#x", errCFI, op)
			}
		case 0x2e: // GNU_args_size
			r.uleb()
		case 0x2f: // GNU_negative_offset_extended
			reg := r.uleb()
			setReg(reg, regRule{ruleOffset, -int64(r.uleb()) * c.dataAlign})
		default:
			return fmt.Errorf("%w: opcode %#x", errCFI, op)
		}
	}
	if r.err != nil || r.pos > len(r.b) {
		return errCFI
	}
	return nil
}

// findFDE binary-searches .eh_frame_hdr's table for the FDE of the function
// containing vaddr; 0 when vaddr is before the first function.
func (e *elfInfo) findFDE(vaddr uint64) (uint64, error) {
	hdr, err := e.readAt(e.eh.hdrAddr, 32)
	if err != nil || len(hdr) < 4 || hdr[0] != 1 {
		return 0, errCFI
	}
	r := &cfiReader{b: hdr, addr: e.eh.hdrAddr, pos: 4}
	ptrEnc, countEnc, tableEnc := hdr[1], hdr[2], hdr[3]
	r.pointer(ptrEnc, e.eh.hdrAddr)
	if countEnc == peOmit || tableEnc != peDatarel|peSdata4 {
		// Every linker writes sdata4 datarel tables; without one the
		// search would have to walk .eh_frame.
		return 0, errCFI
	}
	count := r.pointer(countEnc, e.eh.hdrAddr)
	if r.err != nil {
		return 0, r.err
	}
	table := e.eh.hdrAddr + uint64(r.pos)
	if count == 0 || count > e.eh.hdrSize/8 {
		return 0, errCFI
	}
	var pair [8]byte
	at := func(i uint64) (start, fde uint64, err error) {
		b, err := e.readAt(table+i*8, 8)
		if err != nil || len(b) < 8 {
			return 0, 0, errCFI
		}
		copy(pair[:], b)
		start = e.eh.hdrAddr + uint64(int64(int32(binary.LittleEndian.Uint32(pair[:]))))
		fde = e.eh.hdrAddr + uint64(int64(int32(binary.LittleEndian.Uint32(pair[4:]))))
		return start, fde, nil
	}
	// The last entry whose start is <= vaddr.
	lo, hi := uint64(0), count
	for lo < hi {
		mid := lo + (hi-lo)/2
		start, _, err := at(mid)
		if err != nil {
			return 0, err
		}
		if start <= vaddr {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return 0, nil
	}
	_, fde, err := at(lo - 1)
	return fde, err
}
