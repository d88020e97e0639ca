package symbolize

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// A call-frame program whose expression length, read as an int, is
// negative moved back to its own start and looped forever; one that
// remembers states without end kept a row per byte. Both are refused.
func TestCFIProgramBounded(t *testing.T) {
	c := &cie{codeAlign: 1, dataAlign: -8, ra: dwarfX86.ra}
	// DW_CFA_def_cfa_expression, its length 2^64-11: back by the 11
	// bytes of the instruction, to 0.
	loop := binary.AppendUvarint([]byte{0x0f}, 1<<64-11)
	if len(loop) != 11 {
		t.Fatalf("the instruction is %d bytes", len(loop))
	}
	deep := slices.Repeat([]byte{0x0a}, maxRemembered+1)
	nested := append(slices.Repeat([]byte{0x0a}, maxRemembered), slices.Repeat([]byte{0x0b}, maxRemembered)...)
	for _, tc := range []struct {
		name string
		prog []byte
		ok   bool
	}{
		{"looping", loop, false},
		{"past its end", binary.AppendUvarint([]byte{0x10, byte(dwarfX86.fp)}, 1), false},
		{"remembering too deep", deep, false},
		{"remembering as deep as allowed", nested, true},
	} {
		done := make(chan error, 1)
		go func() {
			var st cfiState
			done <- c.run(&dwarfX86, &st, nil, tc.prog, 0, 0, ^uint64(0))
		}()
		select {
		case err := <-done:
			if (err == nil) != tc.ok || err != nil && !errors.Is(err, errCFI) {
				t.Errorf("%s: %v", tc.name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: still running after 10 s", tc.name)
		}
	}
}

// DW_CFA_AARCH64_negate_ra_state (0x2d) is AArch64's alone: elsewhere
// the opcode is DW_CFA_GNU_window_save (SPARC), which no x86-64 file has.
// Between the prologue's paciasp and the epilogue's autiasp the return
// address is signed: the rule stays where x30 was saved, as readelf's.
func TestNegateRAState(t *testing.T) {
	a64 := &cie{codeAlign: 4, dataAlign: -8, ra: dwarfAArch64.ra}
	// paciasp; stp x29, x30, [sp, -16]!: advance 1, negate_ra_state,
	// advance 1, def_cfa_offset 16, offset x29 at cfa-16, offset x30 at
	// cfa-8.
	prog := []byte{0x41, 0x2d, 0x41, 0x0e, 16, 0x80 | 29, 2, 0x80 | 30, 1}
	for _, tc := range []struct {
		at   uint64
		want Rule
	}{
		{0, Rule{CFA: CFARSP, RA: RAInLR}},
		{4, Rule{CFA: CFARSP, RA: RAInLR}},
		{8, Rule{CFA: CFARSP, CFAOffset: 16, RBP: RBPAtCFA, RBPOffset: -16, RA: RAAtCFA, RAOffset: -8}},
	} {
		st := cfiState{cfaReg: dwarfAArch64.sp}
		if err := a64.run(&dwarfAArch64, &st, nil, prog, 0, 0, tc.at); err != nil {
			t.Fatalf("at %d: %v", tc.at, err)
		}
		if got := st.rule(a64, &dwarfAArch64); got != tc.want {
			t.Errorf("at %d: %+v, want %+v", tc.at, got, tc.want)
		}
	}
	x86 := &cie{codeAlign: 1, dataAlign: -8, ra: dwarfX86.ra}
	var st cfiState
	if err := x86.run(&dwarfX86, &st, nil, []byte{0x2d}, 0, 0, ^uint64(0)); !errors.Is(err, errCFI) {
		t.Errorf("x86-64: %v, want %v", err, errCFI)
	}
}

// A file whose call-frame information cannot be read ends the stack at
// its frame, and is counted once per address while its rule is cached.
func TestCFIRefusedCounted(t *testing.T) {
	bin := buildTarget(t, "target", "-fPIE", "-pie", "-Wl,--build-id=sha1")
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	i := slices.IndexFunc(ef.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_GNU_EH_FRAME })
	if i < 0 {
		t.Fatal("no PT_GNU_EH_FRAME")
	}
	data[ef.Progs[i].Off] = 2 // .eh_frame_hdr's version: only 1 is read
	crafted := filepath.Join(t.TempDir(), "crafted")
	if err := os.WriteFile(crafted, data, 0o755); err != nil {
		t.Fatal(err)
	}
	pid, addr := startTarget(t, crafted)
	s := New("/proc")
	for range 2 {
		if _, rules := s.UnwindCopy(pid, StackCopy{PC: addr + 5}, 4); rules[addr+4].Rule != endRule {
			t.Fatalf("rule at leakyfn = %+v, want the end rule", rules[addr+4])
		}
	}
	if s.Refused() != 1 {
		t.Errorf("Refused() = %d, want 1", s.Refused())
	}
}

// A symbol table over maxSymtabBytes is left out for the other, and a name
// over maxNameBytes left unread (a module+offset frame); each is counted.
func TestSymbolsOverBoundRefused(t *testing.T) {
	root := t.TempDir()
	g := smallLib("", "f", 4, false)
	lib := mapLib(t, root, 100, "/usr/lib/libhuge.so", 77, 0x7f0000000000, g)
	// .symtab (all four functions) claims 96 MiB.
	path := filepath.Join(root, "100", "root", "usr", "lib", "libhuge.so")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.NewFile(strings.NewReader(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	idx := slices.IndexFunc(ef.Sections, func(s *elf.Section) bool { return s.Type == elf.SHT_SYMTAB })
	shoff := binary.LittleEndian.Uint64(data[0x28:])
	binary.LittleEndian.PutUint64(data[shoff+uint64(idx)*64+32:], elf.Sym64Size<<22)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("g", maxNameBytes+1)
	syms := func(yield func(genSym) bool) {
		for i, name := range []string{"g0", long} {
			if !yield(genSym{name: name, value: 0x1000 + uint64(i)*16, size: 16, typ: elf.STT_FUNC, shndx: genTextShndx(0)}) {
				return
			}
		}
	}
	named := mapLib(t, root, 100, "/usr/lib/libnames.so", 78, 0x7f1000000000,
		genELF{class: elf.ELFCLASS64, texts: []genText{{addr: 0x1000, size: 32}}, symtab: syms})

	s := New(root)
	got := frameTexts(s, 100, []uint64{lib.addr(0, 0x1000+4), lib.addr(0, 0x1010+4), named.addr(0, 0x1000+4), named.addr(0, 0x1010+4)})
	// f1 is in .symtab alone; g1's name is not read.
	want := []string{"f0+0x4 (libhuge.so)", "libhuge.so+0x1014", "g0+0x4 (libnames.so)", "libnames.so+0x1014"}
	if !slices.Equal(got, want) {
		t.Errorf("frames %q, want %q", got, want)
	}
	if s.Refused() != 2 {
		t.Errorf("Refused() = %d, want 2", s.Refused())
	}
}
