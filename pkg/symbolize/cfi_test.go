package symbolize

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// cfiRow is one row of readelf's interpreted unwind table.
type cfiRow struct {
	loc, end uint64 // the row covers [loc, end)
	cfa      string // "rsp+8", "rbp+16", "exp"
	rbp, ra  string // "c-16", "u", ...; rbp "" when the FDE never saves it
}

// readelfRows runs readelf --debug-dump=frames-interp (binutils), an
// independent decoder of .eh_frame, and returns every row of every FDE.
func readelfRows(t *testing.T, path string) []cfiRow {
	t.Helper()
	// -wN: the file's own .eh_frame, not a separate debug file's.
	out, err := exec.Command("readelf", "-wN", "--debug-dump=frames-interp", path).Output()
	if err != nil {
		t.Fatalf("readelf %s: %v", path, err)
	}
	var (
		rows     []cfiRow
		cols     []string
		fdeEnd   uint64
		inFDE    bool
		fdeFirst int
	)
	closeFDE := func() {
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
			inFDE, fdeFirst, cols = true, len(rows), nil
			for _, w := range f {
				if r, ok := strings.CutPrefix(w, "pc="); ok {
					_, e, _ := strings.Cut(r, "..")
					fdeEnd, _ = strconv.ParseUint(e, 16, 64)
				}
			}
		case len(f) >= 4 && f[3] == "CIE", len(f) >= 2 && f[1] == "ZERO":
			if inFDE {
				closeFDE()
			}
			inFDE = false
		case inFDE && len(f) >= 2 && f[0] == "LOC":
			cols = f[2:]
		case inFDE && len(f) >= 2 && cols != nil:
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
				case "rbp":
					r.rbp = f[2+i]
				case "ra":
					r.ra = f[2+i]
				}
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
func (r cfiRow) want() (Rule, bool) {
	if r.ra != "c-8" {
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
	rule := Rule{CFAOffset: int32(n)}
	switch base {
	case "rsp":
		rule.CFA = CFARSP
	case "rbp":
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
// libstdc++.
func TestRulesMatchReadelf(t *testing.T) {
	paths := []string{testutil.CUDAChain(t, "c"), testutil.CUDAChain(t, "c++")}
	for _, lib := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libstdc++.so.6"} {
		if _, err := os.Stat(lib); err == nil {
			paths = append(paths, lib)
		}
	}
	if len(paths) < 4 {
		t.Fatalf("libc and libstdc++ not found: %v", paths)
	}
	for _, path := range paths {
		t.Run(path, func(t *testing.T) {
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			info, err := parseELF(f)
			if err != nil {
				t.Fatal(err)
			}
			defer info.f.Close()
			rows := readelfRows(t, path)
			if len(rows) < 10 {
				t.Fatalf("readelf shows %d rows", len(rows))
			}
			checked := 0
			for _, r := range rows {
				want, ok := r.want()
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
					if got != want {
						t.Fatalf("rule at %#x = %+v, readelf row %+v means %+v", at, got, r, want)
					}
					checked++
				}
			}
			t.Logf("%d addresses checked", checked)
		})
	}
}
