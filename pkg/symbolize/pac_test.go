package symbolize

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// An AArch64 stack stopped at the first instruction of a leaf function
// (as a syscall wrapper is: its caller only in the link register), through
// code built with pointer authentication: UnwindCopy takes the innermost
// frame's return address from LR, the others from where each prologue
// stored x30, and strips the signature of every one (RAMask). The file is
// testdata/pac.c built for AArch64, mapped in a made-up process; the stack
// is laid out as its call-frame information says, with signed return
// addresses.
func TestUnwindCopyLinkRegisterAndPAC(t *testing.T) {
	lib := pacFixture(t)
	const (
		pid  = 700
		base = 0xaaaa_0000_0000 // an AArch64 PIE's place, below 2^48
		path = "/usr/lib/libpac.so"
		mask = 1<<48 - 1
		pac  = 0x002d_0000_0000_0000 // a signature, above bit 48
	)
	root := t.TempDir()
	file := filepath.Join(root, strconv.Itoa(pid), "root", path)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(lib)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	maps := fmt.Sprintf("%x-%x r-xp 00000000 08:01 77 %s\n", base, base+uint64(len(data)+0xffff)&^0xffff, path)
	if err := os.WriteFile(filepath.Join(root, strconv.Itoa(pid), "maps"), []byte(maps), 0o644); err != nil {
		t.Fatal(err)
	}

	ef, err := elf.Open(lib)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	// addr is where vaddr of the file is in the process: the file is
	// mapped whole from offset 0.
	addr := func(vaddr uint64) uint64 {
		for _, p := range ef.Progs {
			if p.Type == elf.PT_LOAD && vaddr >= p.Vaddr && vaddr < p.Vaddr+p.Filesz {
				return base + vaddr - p.Vaddr + p.Off
			}
		}
		t.Fatalf("%#x is not loaded", vaddr)
		return 0
	}
	syms, err := ef.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	sym := func(name string) elf.Symbol {
		i := slices.IndexFunc(syms, func(s elf.Symbol) bool { return s.Name == name })
		if i < 0 {
			t.Fatalf("%s has no %s", lib, name)
		}
		return syms[i]
	}
	// after is the return address of the call from caller to callee: the
	// instruction after its BL.
	after := func(caller, callee string) uint64 {
		c, target := sym(caller), sym(callee).Value
		code := make([]byte, c.Size)
		if _, err := ef.Section(".text").ReadAt(code, int64(c.Value-ef.Section(".text").Addr)); err != nil {
			t.Fatal(err)
		}
		for i := 0; i+4 <= len(code); i += 4 {
			insn := binary.LittleEndian.Uint32(code[i:])
			if insn&0xfc000000 != 0x94000000 { // BL imm26
				continue
			}
			pc := c.Value + uint64(i)
			if pc+uint64(int64(int32(insn<<6))>>4) == target {
				return addr(pc + 4)
			}
		}
		t.Fatalf("%s does not call %s", caller, callee)
		return 0
	}
	leaf, inInner, inOuter := addr(sym("leaf").Value), after("inner", "leaf"), after("outer", "inner")

	s := New(root)
	const sp = 0xffff_f000_0000
	stack := make([]byte, 4096)
	// The frames of inner and outer, as their rules say; outer's return
	// address is 0: the end of the stack.
	frameSP := uint64(sp)
	for _, f := range []struct{ at, ra uint64 }{{inInner - 1, inOuter | pac}, {inOuter - 1, 0}} {
		r := s.ruleAt(s.procMaps(pid), f.at).Rule
		if r.CFA != CFARSP || r.RA != RAAtCFA {
			t.Fatalf("rule at %#x: %+v, want the CFA from sp and x30 saved", f.at, r)
		}
		cfa := frameSP + uint64(int64(r.CFAOffset))
		binary.LittleEndian.PutUint64(stack[cfa+uint64(int64(r.RAOffset))-sp:], f.ra)
		frameSP = cfa
	}
	pcs, rules := s.UnwindCopy(pid, StackCopy{PC: leaf, SP: sp, LR: inInner | pac, Exact: true, RAMask: mask, Stack: stack}, 8)
	if want := []uint64{inInner, inOuter}; !slices.Equal(pcs, want) {
		t.Errorf("callers %#x, want %#x", pcs, want)
	}
	if r := rules[leaf].Rule; r != (Rule{CFA: CFARSP, RA: RAInLR}) {
		t.Errorf("leaf's rule %+v: want the return address in LR", r)
	}
	if r := rules[inInner-1].Rule; r.RA != RAAtCFA {
		t.Errorf("inner's rule %+v: want the return address on the stack", r)
	}
	// Where the link register is not known (0: a uprobe's stack starts
	// at the caller), a frame whose return address is in it ends the
	// stack.
	if pcs, _ := s.UnwindCopy(pid, StackCopy{PC: leaf, SP: sp, Exact: true, RAMask: mask, Stack: stack}, 8); len(pcs) != 0 {
		t.Errorf("without LR: callers %#x, want none", pcs)
	}
}
