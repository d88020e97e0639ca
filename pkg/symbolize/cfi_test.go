package symbolize

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// cfiRow is one row of readelf's interpreted unwind table.
type cfiRow struct {
	loc, end uint64 // the row covers [loc, end)
	cfa      string // "rsp+8", "rbp+16", "sp+0", "x29+16", "exp"
	rbp, ra  string // "c-16", "u", ...; "" when the FDE never saves it
}

// readelfNames are readelf's names of one machine's registers: the frame
// pointer's column, and the CFA's bases.
type readelfNames struct {
	fp, sp string
	raInLR bool // an unsaved return address is in the link register
}

var (
	readelfX86     = readelfNames{fp: "rbp", sp: "rsp"}
	readelfAArch64 = readelfNames{fp: "x29", sp: "sp", raInLR: true}
)

// readelfRows runs readelf --debug-dump=frames-interp (binutils), an
// independent decoder of .eh_frame, and returns every row of every FDE. An
// FDE without instructions, which readelf prints without rows (AArch64 leaf
// functions), has its CIE's row.
func readelfRows(t *testing.T, path string, names readelfNames) []cfiRow {
	t.Helper()
	// -wN: the file's own .eh_frame, not a separate debug file's.
	out, err := exec.Command("readelf", "-wN", "--debug-dump=frames-interp", path).Output()
	if err != nil {
		t.Fatalf("readelf %s: %v", path, err)
	}
	var (
		rows             []cfiRow
		cols             []string
		fdeStart, fdeEnd uint64
		inFDE, inCIE     bool
		fdeFirst         int
		cieRow           *cfiRow
	)
	closeFDE := func() {
		if len(rows) == fdeFirst && cieRow != nil {
			r := *cieRow
			r.loc = fdeStart
			rows = append(rows, r)
		}
		for i := fdeFirst; i < len(rows); i++ {
			if i+1 < len(rows) {
				rows[i].end = rows[i+1].loc
			} else {
				rows[i].end = fdeEnd
			}
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var f []string
		for _, w := range strings.Fields(sc.Text()) {
			// "r10 (r10)" is one cell: a register saved in another.
			if strings.HasPrefix(w, "(") && len(f) > 0 {
				f[len(f)-1] += " " + w
				continue
			}
			f = append(f, w)
		}
		switch {
		case len(f) >= 4 && f[3] == "FDE":
			if inFDE {
				closeFDE()
			}
			inFDE, inCIE, fdeFirst, cols = true, false, len(rows), nil
			for _, w := range f {
				if r, ok := strings.CutPrefix(w, "pc="); ok {
					s, e, _ := strings.Cut(r, "..")
					fdeStart, _ = strconv.ParseUint(s, 16, 64)
					fdeEnd, _ = strconv.ParseUint(e, 16, 64)
				}
			}
		case len(f) >= 4 && f[3] == "CIE", len(f) >= 2 && f[1] == "ZERO":
			if inFDE {
				closeFDE()
			}
			inFDE, cols, cieRow = false, nil, nil
			inCIE = f[1] != "ZERO"
		case (inFDE || inCIE) && len(f) >= 2 && f[0] == "LOC":
			cols = f[2:]
		case (inFDE || inCIE) && len(f) >= 2 && cols != nil:
			loc, err := strconv.ParseUint(f[0], 16, 64)
			if err != nil {
				continue
			}
			r := cfiRow{loc: loc, cfa: f[1]}
			for i, c := range cols {
				if 2+i >= len(f) {
					break
				}
				switch c {
				case names.fp:
					r.rbp = f[2+i]
				case "ra":
					r.ra = f[2+i]
				}
			}
			if inCIE {
				cieRow = &r
				continue
			}
			rows = append(rows, r)
		}
	}
	if inFDE {
		closeFDE()
	}
	return rows
}

// want is the rule a row means for the kernel's walk.
func (r cfiRow) want(names readelfNames) (Rule, bool) {
	var rule Rule
	switch {
	case strings.HasPrefix(r.ra, "c"):
		o, err := strconv.Atoi(r.ra[1:])
		if err != nil {
			return Rule{}, false
		}
		rule.RA, rule.RAOffset = RAAtCFA, int32(o)
	case names.raInLR && (r.ra == "" || r.ra == "u"):
		// readelf prints "u" both for a register never set (the same
		// value: still in x30) and for one set undefined (the outermost
		// frame): the test tells them apart.
		rule.RA = RAInLR
	default:
		return endRule, true
	}
	base, off, ok := strings.Cut(r.cfa, "+")
	if !ok {
		return endRule, true
	}
	n, err := strconv.Atoi(off)
	if err != nil {
		return Rule{}, false
	}
	rule.CFAOffset = int32(n)
	switch base {
	case names.sp:
		rule.CFA = CFARSP
	case names.fp:
		rule.CFA = CFARBP
	default:
		return endRule, true
	}
	switch {
	case strings.HasPrefix(r.rbp, "c"):
		o, err := strconv.Atoi(r.rbp[1:])
		if err != nil {
			return Rule{}, false
		}
		rule.RBP, rule.RBPOffset = RBPAtCFA, int32(o)
	case r.rbp == "" || r.rbp == "u":
		// readelf prints "u" both for a register never set (the same
		// value) and for one set undefined: the rbp rule is not compared.
		rule.RBP = RBPSame
	default:
		rule.RBP = RBPUndefined
	}
	return rule, true
}

// Every row of every FDE, at its first and last address, decodes to what
// readelf says: in the -O2 -fomit-frame-pointer fixtures (C, and C++ with
// personality and LSDA augmentations) and in the system's libc and
// libstdc++ (x86-64's or AArch64's, as the host's).
func TestRulesMatchReadelf(t *testing.T) {
	paths := []string{testutil.CUDAChain(t, "c"), testutil.CUDAChain(t, "c++")}
	dir := map[string]string{"amd64": "/lib/x86_64-linux-gnu", "arm64": "/lib/aarch64-linux-gnu"}[runtime.GOARCH]
	for _, lib := range []string{"libc.so.6", "libstdc++.so.6"} {
		if _, err := os.Stat(dir + "/" + lib); err == nil {
			paths = append(paths, dir+"/"+lib)
		}
	}
	if len(paths) < 4 {
		t.Fatalf("libc and libstdc++ not found: %v", paths)
	}
	for _, path := range paths {
		t.Run(path, func(t *testing.T) { checkRulesMatchReadelf(t, path) })
	}
}

// AArch64's libc and libstdc++ (the cross toolchain's, or multiarch
// packages'), and a fixture built with pointer authentication: every row
// decodes to what readelf says, DW_CFA_AARCH64_negate_ra_state included.
func TestRulesMatchReadelfAArch64(t *testing.T) {
	var paths []string
	for _, lib := range []string{"libc.so.6", "libstdc++.so.6"} {
		for _, dir := range []string{"/lib/aarch64-linux-gnu", "/usr/aarch64-linux-gnu/lib"} {
			if _, err := os.Stat(dir + "/" + lib); err == nil {
				paths = append(paths, dir+"/"+lib)
				break
			}
		}
	}
	if len(paths) < 2 {
		t.Skipf("AArch64 libc and libstdc++ not installed (libc6:arm64 and libstdc++6:arm64, or gcc-aarch64-linux-gnu): %v", paths)
	}
	paths = append(paths, pacFixture(t))
	for _, path := range paths {
		t.Run(path, func(t *testing.T) { checkRulesMatchReadelf(t, path) })
	}
}

// pacFixture builds testdata/pac.c for AArch64 with pointer
// authentication (-mbranch-protection=standard: paciasp in every prologue
// that saves x30, and DW_CFA_AARCH64_negate_ra_state in its CFI), and
// checks that the opcode is there.
func pacFixture(t *testing.T) string {
	t.Helper()
	// The cross compiler where there is one (also under qemu-user,
	// where gcc is the host's), else an AArch64 host's own.
	cc, err := exec.LookPath("aarch64-linux-gnu-gcc")
	if err != nil && runtime.GOARCH == "arm64" {
		cc, err = exec.LookPath("gcc")
	}
	if err != nil {
		t.Skip("no AArch64 C compiler (gcc-aarch64-linux-gnu)")
	}
	out := t.TempDir() + "/pac.so"
	if b, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-fomit-frame-pointer", "-mbranch-protection=standard",
		"-o", out, "testdata/pac.c").CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cc, err, b)
	}
	raw, err := exec.Command("readelf", "-wN", "--debug-dump=frames", out).Output()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte("DW_CFA_AARCH64_negate_ra_state")) {
		t.Fatalf("%s has no DW_CFA_AARCH64_negate_ra_state:\n%s", out, raw)
	}
	return out
}

func checkRulesMatchReadelf(t *testing.T, path string) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	info, err := parseELF(f)
	if err != nil {
		t.Fatal(err)
	}
	defer info.f.Close()
	names := readelfX86
	if info.eh.regs == dwarfAArch64 {
		names = readelfAArch64
	}
	rows := readelfRows(t, path, names)
	if len(rows) < 10 {
		t.Fatalf("readelf shows %d rows", len(rows))
	}
	checked, undefined := 0, 0
	for _, r := range rows {
		want, ok := r.want(names)
		if !ok || r.end <= r.loc {
			continue
		}
		for _, at := range []uint64{r.loc, r.end - 1} {
			got, found, err := info.rule(at)
			if err != nil || !found {
				t.Fatalf("rule at %#x: found %v, %v", at, found, err)
			}
			if want.RBP == RBPSame && got.RBP == RBPUndefined {
				got.RBP = RBPSame
			}
			if want.RA == RAInLR && got == endRule {
				// readelf's "u": undefined (thread entry, clone), which
				// the few outermost functions say.
				undefined++
				continue
			}
			if got != want {
				t.Fatalf("rule at %#x = %+v, readelf row %+v means %+v", at, got, r, want)
			}
			checked++
		}
	}
	if undefined > checked/100 {
		t.Fatalf("%d addresses with an undefined return address, of %d", undefined, checked)
	}
	t.Logf("%d addresses checked, %d with an undefined return address", checked, undefined)
}
