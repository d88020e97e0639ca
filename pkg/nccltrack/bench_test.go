package nccltrack

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// BenchmarkCollectiveRate runs three training loops side by side, each
// all-reducing 10 000 times a second for 20 s on the NCCL stand-in, each
// on its own copy of the library (uprobes are placed by inode): one
// untraced, one whose ncclAllReduce has a program that does nothing (the
// bare cost of a uprobe hit), and one traced by this view. It reports
// each loop's CPU time per second of wall time, the traced loop's extra
// over the untraced one as a share of one core and per call, and the
// kernel's count of the time spent in our programs per call (BPF run-time
// statistics). Run with -benchtime=1x: the loops are timed by the clock,
// not b.N.
func BenchmarkCollectiveRate(b *testing.B) {
	const rate, seconds = 10000, 20
	c := newConcern(b)
	lib := testutil.NCCLStub(b)
	data, err := os.ReadFile(lib)
	if err != nil {
		b.Fatal(err)
	}
	copyLib := func(name string) string {
		dir := filepath.Join(b.TempDir(), name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			b.Fatal(err)
		}
		path := filepath.Join(dir, "libnccl.so.2")
		if err := os.WriteFile(path, data, 0o755); err != nil {
			b.Fatal(err)
		}
		return path
	}
	untracedLib, emptyLib := copyLib("untraced"), copyLib("empty")
	detach := attachEmpty(b, emptyLib)
	defer detach()
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatal(err)
	}
	defer stats.Close()
	bin := testutil.Fixture(b, "ncclrank")
	for range b.N {
		before := runTime(b, c)
		// Each loop prints "ready" once its communicator is set up; the
		// traced one is hooked a moment after it starts its loop.
		traced := testutil.StartProc(b, nil, bin, lib, "rate", fmt.Sprint(seconds), fmt.Sprint(rate))
		empty := testutil.StartProc(b, nil, bin, emptyLib, "rate", fmt.Sprint(seconds), fmt.Sprint(rate))
		untraced := testutil.StartProc(b, nil, bin, untracedLib, "rate", fmt.Sprint(seconds), fmt.Sprint(rate))
		p := &model.Process{PID: traced.Cmd.Process.Pid}
		if err := c.Track(p.PID); err != nil {
			b.Fatal(err)
		}
		cpu := map[*testutil.Proc]float64{}
		var calls int
		for _, l := range []*testutil.Proc{traced, empty, untraced} {
			line := l.Wait(b, "calls ", (seconds+30)*time.Second)
			var ns float64
			if _, err := fmt.Sscanf(line, "calls %d cpu_ns %g", &calls, &ns); err != nil {
				b.Fatalf("%q: %v", line, err)
			}
			cpu[l] = ns
		}
		if _, err := c.Fill(time.Now(), []*model.Process{p}); err != nil {
			b.Fatal(err)
		}
		counted := uint64(0)
		if len(p.NCCL.Comms) == 1 {
			counted = p.NCCL.Comms[0].Calls["allreduce"]
		}
		// Hooked a moment after it began: nearly all its calls.
		if counted < uint64(calls)*9/10 {
			b.Fatalf("traced loop counted %+v of %d calls", p.NCCL.Comms, calls)
		}
		perSecond := func(ns float64) float64 { return ns / 1e6 / seconds }
		b.ReportMetric(perSecond(cpu[traced]), "traced-cpu-ms/s")
		b.ReportMetric(perSecond(cpu[empty]), "empty-probe-cpu-ms/s")
		b.ReportMetric(perSecond(cpu[untraced]), "untraced-cpu-ms/s")
		b.ReportMetric((cpu[traced]-cpu[untraced])/1e9/seconds*100, "extra-%-of-a-core")
		b.ReportMetric((cpu[traced]-cpu[untraced])/float64(calls), "extra-ns/call")
		b.ReportMetric((cpu[empty]-cpu[untraced])/float64(calls), "empty-probe-ns/call")
		b.ReportMetric(float64(runTime(b, c)-before)/float64(counted), "bpf-ns/call")
		c.Untrack(p.PID)
	}
}

// runTime is the time the kernel counted in the view's programs so far.
func runTime(b *testing.B, c *Concern) time.Duration {
	var total time.Duration
	for _, p := range c.coll.Programs {
		st, err := p.Stats()
		if err != nil {
			b.Fatal(err)
		}
		total += st.Runtime
	}
	return total
}

// attachEmpty puts a program that does nothing on ncclAllReduce of the
// library at path, for every process, as the view attaches its own.
func attachEmpty(b *testing.B, path string) func() {
	b.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.Kprobe,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		b.Fatal(err)
	}
	ex, err := link.OpenExecutable(path)
	if err != nil {
		b.Fatal(err)
	}
	l, err := ex.Uprobe("ncclAllReduce", prog, nil)
	if err != nil {
		b.Fatal(err)
	}
	return func() { _ = l.Close(); _ = prog.Close() }
}
