package nccltrack

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// BenchmarkCollectiveRate runs two training loops side by side, each
// all-reducing 10 000 times a second for 20 s on the NCCL stand-in: one
// traced (its library hooked, the process tracked), one untraced (its own
// copy of the library, which no hook is on). It reports each loop's CPU
// time per second of wall time and the traced loop's extra as a share of
// one core, and per call. Run with -benchtime=1x: the loops are timed by
// the clock, not b.N.
func BenchmarkCollectiveRate(b *testing.B) {
	const rate, seconds = 10000, 20
	c := newConcern(b)
	lib := testutil.NCCLStub(b)
	// The untraced loop's copy: uprobes are placed by inode.
	data, err := os.ReadFile(lib)
	if err != nil {
		b.Fatal(err)
	}
	untracedLib := filepath.Join(b.TempDir(), "libnccl.so.2")
	if err := os.WriteFile(untracedLib, data, 0o755); err != nil {
		b.Fatal(err)
	}
	bin := testutil.Fixture(b, "ncclrank")
	for range b.N {
		// Each loop prints "ready" once its communicator is set up; the
		// traced one is hooked before the untraced one starts its loop.
		traced := testutil.StartProc(b, nil, bin, lib, "rate", fmt.Sprint(seconds), fmt.Sprint(rate))
		untraced := testutil.StartProc(b, nil, bin, untracedLib, "rate", fmt.Sprint(seconds), fmt.Sprint(rate))
		p := &model.Process{PID: traced.Cmd.Process.Pid}
		if err := c.Track(p.PID); err != nil {
			b.Fatal(err)
		}
		var tracedNs, untracedNs float64
		var calls int
		for _, l := range []struct {
			p  *testutil.Proc
			ns *float64
		}{{traced, &tracedNs}, {untraced, &untracedNs}} {
			line := l.p.Wait(b, "calls ", (seconds+30)*time.Second)
			if _, err := fmt.Sscanf(line, "calls %d cpu_ns %g", &calls, l.ns); err != nil {
				b.Fatalf("%q: %v", line, err)
			}
		}
		if _, err := c.Fill(time.Now(), []*model.Process{p}); err != nil {
			b.Fatal(err)
		}
		// The traced loop was hooked a moment after it began: it counted
		// nearly all its calls.
		if len(p.NCCL.Comms) != 1 || p.NCCL.Comms[0].Calls["allreduce"] < uint64(calls)*9/10 {
			b.Fatalf("traced loop counted %+v of %d calls", p.NCCL.Comms, calls)
		}
		b.ReportMetric(tracedNs/1e6/seconds, "traced-cpu-ms/s")
		b.ReportMetric(untracedNs/1e6/seconds, "untraced-cpu-ms/s")
		b.ReportMetric((tracedNs-untracedNs)/1e9/seconds*100, "extra-%-of-a-core")
		b.ReportMetric((tracedNs-untracedNs)/float64(calls), "extra-ns/call")
		c.Untrack(p.PID)
	}
}
