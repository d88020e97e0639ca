package cudatrack

import (
	"maps"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// stubWait is how long each synchronising call of the stand-ins waits in
// these tests (CUDA_STUB_SYNC_US).
const stubWait = 5 * time.Millisecond

// Host waits by call site: cudawork's waiter thread calls
// cudaStreamSynchronize from sync_stream and cudaMemcpy from copy_back n
// times each (testdata/cudawork.c). Each site names its function with
// exactly n calls, the driver calls the runtime makes are not counted again,
// every wait lasts at least the stand-in's, and the waiter's share of the
// interval is most of it.
func TestWaits(t *testing.T) { runWaits(t, newConcern(t), dynamic(t)) }

// The same with the runtime linked into the executable.
func TestWaitsStaticRuntime(t *testing.T) { runWaits(t, newConcern(t), static(t)) }

func runWaits(t *testing.T, c *Concern, tg target) {
	const n = 40
	t.Setenv("CUDA_STUB_SYNC_US", strconv.Itoa(int(stubWait/time.Microsecond)))
	p, pr := work(t, c, tg, "waits", strconv.Itoa(n))
	observe(t, c, pr) // the interval starts here
	p.Signal(t)
	p.Wait(t, "done", time.Minute)
	observe(t, c, pr)
	w := pr.CUDA.Waits
	if len(w.Sites) != 2 {
		t.Fatalf("wait sites %+v, want 2 (the driver calls nested in the runtime's not counted again)", w.Sites)
	}
	for _, want := range []struct{ api, fn string }{{"cudaStreamSynchronize", "sync_stream"}, {"cudaMemcpy", "copy_back"}} {
		i := slices.IndexFunc(w.Sites, func(s model.CUDAWaitSite) bool { return s.API == want.api })
		if i < 0 {
			t.Fatalf("no %s site in %+v", want.api, w.Sites)
		}
		s := w.Sites[i]
		if !stackHas(s.Stack, want.fn) {
			t.Errorf("%s site does not name %s: %q", want.api, want.fn, s.Stack)
		}
		if s.Calls != n || s.RecentCalls != n || s.Histogram.Count != n {
			t.Errorf("%s: %d calls (%d recent, %d in the histogram), want %d", want.api, s.Calls, s.RecentCalls, s.Histogram.Count, n)
		}
		if min := n * stubWait.Seconds(); s.Seconds < min || s.RecentSeconds != s.Seconds || s.MaxSeconds < stubWait.Seconds() || s.MaxSeconds > s.Seconds {
			t.Errorf("%s: waited %gs (%gs recent, longest %gs), want at least %gs", want.api, s.Seconds, s.RecentSeconds, s.MaxSeconds, min)
		}
		if math.Abs(s.Histogram.Sum-s.Seconds) > 1e-9 {
			t.Errorf("%s: histogram sum %g, total %g", want.api, s.Histogram.Sum, s.Seconds)
		}
		// Each wait is at least stubWait: no observation at or below
		// the bound under it.
		for b, bound := range s.Histogram.Bounds {
			if bound < stubWait.Seconds()/2 && s.Histogram.Counts[b] != 0 {
				t.Errorf("%s: %d waits of at most %gs", want.api, s.Histogram.Counts[b], bound)
			}
		}
	}
	if w.Calls != 2*n || w.Seconds < 2*n*stubWait.Seconds() || w.Histogram.Count != 2*n {
		t.Errorf("process: %d calls, %gs, %d in the histogram", w.Calls, w.Seconds, w.Histogram.Count)
	}
	if len(w.Threads) != 1 {
		t.Fatalf("threads %+v, want the waiter alone", w.Threads)
	}
	th := w.Threads[0]
	if th.Name != "waiter" || th.TID == pr.PID || th.Calls != 2*n || th.Seconds != w.Seconds {
		t.Errorf("thread %+v, want waiter with %d calls and %gs", th, 2*n, w.Seconds)
	}
	// The interval is the waits and what it took to start them and see
	// them done; the waiter spent most of it waiting.
	if th.Share != w.Share || w.Share < 0.5 || w.Share > 1 {
		t.Errorf("share %g (thread %g), want most of the interval", w.Share, th.Share)
	}
	// Nothing since: the totals stay, the recent figures are gone.
	observe(t, c, pr)
	w = pr.CUDA.Waits
	if w.Calls != 2*n || w.Share != 0 || w.Sites[0].RecentCalls != 0 || w.Sites[0].Stack == nil {
		t.Errorf("after the waits: %d calls, share %g, sites %+v", w.Calls, w.Share, w.Sites)
	}
	if pr.CUDA.Launches != nil {
		t.Errorf("launches %+v without Config.Launches", pr.CUDA.Launches)
	}
	noLoss(t, c)
}

// With Config.Launches, each launch is counted once under the runtime's
// API (the driver's cuLaunchKernel nested in cudaLaunchKernel not again);
// without, launches are not hooked.
func TestLaunches(t *testing.T) {
	const n = 300
	for _, on := range []bool{true, false} {
		t.Run("launches="+strconv.FormatBool(on), func(t *testing.T) {
			testutil.RequireRoot(t)
			c, err := New(Config{ProcRoot: "/proc", Launches: on, Classic: classic}, symbolize.New("/proc"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			p, pr := work(t, c, dynamic(t), "launches", strconv.Itoa(n))
			p.Signal(t)
			p.Wait(t, "done", time.Minute)
			observe(t, c, pr)
			l := pr.CUDA.Launches
			if !on {
				if l != nil {
					t.Errorf("launches %+v, want none hooked", l)
				}
				return
			}
			if l == nil {
				t.Fatal("no launches")
			}
			want := map[string]uint64{"cudaLaunchKernel": n, "cudaGraphLaunch": n}
			if !maps.Equal(l.Calls, want) || l.Histogram.Count != 2*n {
				t.Errorf("launches %v (%d in the histogram), want %v", l.Calls, l.Histogram.Count, want)
			}
			noLoss(t, c)
		})
	}
}

// The decode of the kernel's sums: process totals, recent figures from the
// previous poll, shares of the interval, thread names from the scheduler's
// view, histogram bounds in seconds.
func TestWaitsDecode(t *testing.T) {
	c := &Concern{waits: map[int]*waitPoll{}}
	p := &model.Process{PID: 10, Sched: model.SchedStats{Threads: []model.ThreadSched{{TID: 11, Name: "loop"}, {TID: 12, Name: "loader"}}}}
	stream := WaitSite{API: apiIndex["cudaStreamSynchronize"], Site: stacks.Site{Stack: 3, Py: 4}}
	memcpy := WaitSite{API: apiIndex["cudaMemcpy"], Site: stacks.Site{Stack: 5}}
	var slots [waitSlots]uint64
	slots[2] = 1  // under the first bound: merged into it
	slots[20] = 3 // [2^20, 2^21) units of 2^-30 s: at most 2^-9 s
	slots[waitSlots-1] = 1
	s := &Sample{
		Waits:   map[WaitSite]WaitCounts{stream: {Calls: 5, TotalNs: 2e9, MaxNs: 1e9, Slots: slots}, memcpy: {Calls: 1, TotalNs: 1e6}},
		Threads: map[int]ThreadCounts{11: {Calls: 4, TotalNs: 1.5e9}, 12: {Calls: 2, TotalNs: 0.501e9}},
	}
	t0 := time.Unix(1000, 0)
	c.fillWaits(t0, p, s)
	w := p.CUDA.Waits
	if w.Calls != 6 || w.Seconds != 2.001 || w.Share != 0 || len(w.Sites) != 2 || w.Sites[0].API != "cudaStreamSynchronize" {
		t.Fatalf("first poll: %+v", w)
	}
	if w.Sites[0].StackID != stream.Site.ID() || w.Sites[0].MaxSeconds != 1 || w.Sites[0].RecentCalls != 5 {
		t.Errorf("site %+v", w.Sites[0])
	}
	h := w.Sites[0].Histogram
	if h.Count != 5 || h.Sum != 2 || h.Bounds[0] != math.Ldexp(1, -20) || h.Counts[0] != 1 || h.Bounds[20-firstWaitSlot] != math.Ldexp(1, -9) || h.Counts[20-firstWaitSlot] != 3 {
		t.Errorf("histogram %+v", h)
	}
	if q, _ := h.Quantile(0.5); q != math.Ldexp(1, -9) {
		t.Errorf("median %g", q)
	}
	// One second later the loop thread waited 0.8 s more at the memcpy.
	s2 := &Sample{
		Waits:   map[WaitSite]WaitCounts{stream: s.Waits[stream], memcpy: {Calls: 9, TotalNs: 0.801e9, MaxNs: 0.2e9}},
		Threads: map[int]ThreadCounts{11: {Calls: 12, TotalNs: 2.3e9}, 12: s.Threads[12]},
	}
	c.fillWaits(t0.Add(time.Second), p, s2)
	w = p.CUDA.Waits
	if w.Sites[0].API != "cudaMemcpy" || w.Sites[0].RecentCalls != 8 || math.Abs(w.Sites[0].RecentSeconds-0.8) > 1e-9 || w.Sites[1].RecentCalls != 0 {
		t.Errorf("sites, most waited recently first: %+v", w.Sites)
	}
	if len(w.Threads) != 2 || w.Threads[0].Name != "loop" || math.Abs(w.Threads[0].Share-0.8) > 1e-9 || w.Threads[1].Share != 0 || w.Share != w.Threads[0].Share {
		t.Errorf("threads %+v, share %g", w.Threads, w.Share)
	}
	if p.CUDA.Launches != nil {
		t.Errorf("launches %+v", p.CUDA.Launches)
	}
	l := launchesOf(&LaunchCounts{Calls: map[int]uint64{apiIndex["cudaLaunchKernel"]: 7}, TotalNs: 7000, Slots: [waitSlots]uint64{12: 7}})
	if l.Calls["cudaLaunchKernel"] != 7 || l.Histogram.Count != 7 || l.Histogram.Counts[0] != 0 || l.Histogram.Counts[12-firstWaitSlot] != 7 {
		t.Errorf("launches %+v", l)
	}
}
