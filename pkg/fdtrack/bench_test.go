package fdtrack

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/launch"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// BenchmarkFDOverhead runs each workload untraced, traced, and untraced
// while the tracker is loaded but not tracking it (the cost everybody else
// on the machine pays), alternating runs so machine drift hits all alike.
// It reports the median per-operation time of each and the ratios.
func BenchmarkFDOverhead(b *testing.B) {
	testutil.RequireRoot(b)
	bin := testutil.Fixture(b, "fdwork", "-pthread")
	tr, err := New(Config{ProcRoot: "/proc"})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	for _, w := range []struct {
		name string
		args []string
	}{
		{"open-close-loop", []string{"loop", "300000"}},
		{"tcp-server", []string{"server", "5000"}},
	} {
		b.Run(w.name, func(b *testing.B) {
			var plain, traced, bystander []float64
			for i := 0; i < 7; i++ {
				plain = append(plain, runPlain(b, bin, w.args, nil))
				traced = append(traced, runPlain(b, bin, w.args, tr))
				bystander = append(bystander, runPlain(b, bin, w.args, nil))
			}
			p, t, o := median(plain), median(traced), median(bystander)
			b.ReportMetric(p, "ns/op-untraced")
			b.ReportMetric(t, "ns/op-traced")
			b.ReportMetric(t/p, "traced/untraced")
			b.ReportMetric(o/p, "untracked-while-loaded/untraced")
			fmt.Fprintf(os.Stderr, "%s: untraced %.0f ns/op, traced %.0f ns/op (x%.3f)\n", w.name, p, t, t/p)
		})
	}
}

// runPlain runs the fixture once and returns the ns_per_op it prints. With tr
// set it is tracked from before its exec (through the launch gate), so the
// whole workload is traced.
func runPlain(b *testing.B, bin string, args []string, tr *Tracker) float64 {
	b.Helper()
	var out bytes.Buffer
	if tr == nil {
		cmd := exec.Command(bin, args...)
		cmd.Stdout = &out
		if err := cmd.Run(); err != nil {
			b.Fatal(err)
		}
		return parseNS(b, out.String())
	}
	r, w, err := os.Pipe()
	if err != nil {
		b.Fatal(err)
	}
	g, err := launch.Start(append([]string{bin}, args...), nil, w, os.Stderr)
	w.Close()
	if err != nil {
		b.Fatal(err)
	}
	pid := g.Cmd.Process.Pid
	if err := tr.Track(pid); err != nil {
		b.Fatal(err)
	}
	if err := g.Release(); err != nil {
		b.Fatal(err)
	}
	_, _ = out.ReadFrom(r)
	r.Close()
	_ = g.Cmd.Wait()
	tr.Untrack(pid)
	return parseNS(b, out.String())
}

func parseNS(b *testing.B, out string) float64 {
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "ns_per_op "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	b.Fatalf("no ns_per_op in %q", out)
	return 0
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
