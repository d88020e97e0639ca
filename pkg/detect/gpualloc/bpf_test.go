package gpualloc_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/cudatrack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/gpualloc"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// The detector on what the CUDA hooks see of testdata/cudawork running on
// the stand-in runtime, polled once a second as the pipeline does.

// watched is a cudawork scenario under the CUDA concern with the detector.
type watched struct {
	proc     *testutil.Proc
	c        *cudatrack.Concern
	det      *gpualloc.Detector
	p        *model.Process
	findings []model.Finding // every report, in order
}

// watch starts scenario in step mode, tracked before the runtime is loaded,
// and returns once the runtime is loaded and hooked.
func watch(t *testing.T, scenario string, args ...string) *watched {
	t.Helper()
	testutil.RequireRoot(t)
	return watchBin(t, testutil.Fixture(t, "cudawork"), scenario, args...)
}

// watchBin is watch with cudawork built as bin.
func watchBin(t *testing.T, bin, scenario string, args ...string) *watched {
	t.Helper()
	c, err := cudatrack.New(cudatrack.Config{ProcRoot: "/proc"}, symbolize.New("/proc"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	rt := testutil.CUDAStubs(t)
	proc := testutil.StartProc(t, []string{"CUDAWORK_STEP=1"}, bin, append([]string{rt, scenario, "60"}, args...)...)
	w := &watched{proc: proc, c: c, det: gpualloc.New(gpualloc.DefaultConfig()), p: &model.Process{PID: proc.Cmd.Process.Pid, Comm: "cudawork"}}
	if err := c.Track(w.p.PID); err != nil {
		t.Fatal(err)
	}
	w.poll(t)
	proc.Signal(t)
	proc.Wait(t, "loaded", 10*time.Second)
	w.poll(t)
	if len(w.p.CUDA.Libraries) == 0 {
		t.Fatal("the runtime was not hooked")
	}
	return w
}

// poll fills the process's CUDA view now, as the pipeline's poll does, and
// returns the findings the detector reports on it.
func (w *watched) poll(t *testing.T) []model.Finding {
	t.Helper()
	now := time.Now()
	if _, err := w.c.Fill(now, []*model.Process{w.p}); err != nil {
		t.Fatal(err)
	}
	fs := w.det.Observe(now, w.p)
	w.findings = append(w.findings, fs...)
	return fs
}

// pollUntil polls once a second until a finding of kind is reported, at
// most n times.
func (w *watched) pollUntil(t *testing.T, kind string, n int) *model.Finding {
	t.Helper()
	for range n {
		time.Sleep(time.Second)
		for _, f := range w.poll(t) {
			if f.Kind == kind {
				return &f
			}
		}
	}
	return nil
}

// distinct returns the findings of kind, one per first sighting, as last reported.
func (w *watched) distinct(kind string) []model.Finding {
	var out []model.Finding
	for _, f := range w.findings {
		if f.Kind != kind {
			continue
		}
		if i := slices.IndexFunc(out, func(g model.Finding) bool { return g.FirstSeen.Equal(f.FirstSeen) }); i >= 0 {
			out[i] = f
		} else {
			out = append(out, f)
		}
	}
	return out
}

func (w *watched) none(t *testing.T, kinds ...string) {
	t.Helper()
	for _, k := range kinds {
		for _, f := range w.distinct(k) {
			t.Errorf("%s: %s", k, f.Summary)
		}
	}
}

func stackHas(stack []model.Frame, fn string) bool {
	return slices.ContainsFunc(stack, func(f model.Frame) bool { return f.Function == fn })
}

// leak_weights leaks 1 MiB every 50 ms (20 MiB/s) while scratch churns
// 256 KiB: found within 15 s of the first leaked allocation seen.
func TestLeakWorkload(t *testing.T) {
	w := watch(t, "leak")
	f := w.pollUntil(t, model.KindGPUMemoryLeak, 30)
	if f == nil {
		t.Fatal("no leak found in 30 polls")
	}
	i := slices.IndexFunc(w.p.CUDA.Sites, func(s model.CUDASite) bool { return stackHas(s.Stack, "leak_weights") })
	if i < 0 {
		t.Fatalf("no live allocations at leak_weights: %+v", w.p.CUDA.Sites)
	}
	first := w.p.CUDA.Sites[i].Allocs[0]
	latency := f.FirstSeen.Sub(first)
	t.Logf("found %s after the first leaked allocation: %s", latency.Round(time.Millisecond), f.Summary)
	if latency > 15*time.Second {
		t.Errorf("found %s after the first leaked allocation, want within 15s", latency)
	}
	// The site is named with the line of its cudaMalloc, from the
	// fixture's line tables (built -g).
	line := testutil.LineOf(t, filepath.Join(testutil.RepoRoot(), "testdata", "cudawork.c"), `"leak_weights");`)
	if !stackHas(f.Stack, "leak_weights") || !strings.Contains(f.Summary, fmt.Sprintf("made at leak_weights (cudawork.c:%d)", line)) {
		t.Errorf("leak not at leak_weights: %s %q", f.Summary, f.Stack)
	}
	if g := f.Evidence.(model.GPUMemoryLeakEvidence).GrowthBytesPerSecond; g < 10<<20 || g > 21<<20 {
		t.Errorf("growth %.0f B/s, want about 20 MiB/s (less when the machine is loaded)", g)
	}
	w.none(t, model.KindGPUAllocBurst, model.KindGPUAllocChurn)
}

// In one loop, leak_step keeps 8 MiB every 100 ms and every 3 s
// burst_step takes 300 × 64 MiB and frees them within milliseconds, in
// code built -O2 without frame pointers: the burst, gone by the next poll,
// is named at burst_step with the line of its cudaMalloc (the kernel's
// per-site counters), not at the leaking site live at the poll.
func TestBurstBetweenPolls(t *testing.T) {
	testutil.RequireRoot(t)
	src := filepath.Join(testutil.RepoRoot(), "testdata", "cudawork.c")
	bin := filepath.Join(t.TempDir(), "cudawork")
	if out, err := exec.Command("gcc", "-O2", "-g", "-fomit-frame-pointer", "-Wall", "-pthread", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("building cudawork: %v\n%s", err, out)
	}
	w := watchBin(t, bin, "spike")
	f := w.pollUntil(t, model.KindGPUAllocBurst, 15)
	if f == nil {
		t.Fatalf("no burst found in 15 polls; sites %+v", w.p.CUDA.Sites)
	}
	t.Logf("%s", f.Summary)
	site := fmt.Sprintf("burst_step (cudawork.c:%d)", testutil.LineOf(t, src, "/* spike: alloc */"))
	if !stackHas(f.Stack, "burst_step") || !strings.Contains(f.Summary, "most at "+site) {
		t.Errorf("burst not at %s: %s\n  %s", site, f.Summary, strings.Join(testutil.Texts(f.Stack), "\n  "))
	}
	top := f.Evidence.(model.GPUAllocBurstEvidence).TopSites
	if len(top) == 0 || top[0].Bytes != 300*64<<20 {
		t.Errorf("top sites %+v, want 300 × 64 MiB at burst_step first", top)
	}
}

// burst_alloc takes 20000 × 64 KiB (1.25 GiB) at once, holds it across a
// poll and frees it, three times with quiet polls between: one finding
// with three occurrences and their period.
func TestRecurringBurstWorkload(t *testing.T) {
	w := watch(t, "burst", "20000")
	// Quiet intervals to learn the baseline from. The detector judges
	// time: each sleep below is the poll interval, as --interval paces a
	// run, not a wait for something to happen.
	for range 6 {
		time.Sleep(time.Second)
		w.poll(t)
	}
	for range 3 {
		w.proc.Signal(t)
		w.proc.Wait(t, "held", 60*time.Second)
		time.Sleep(time.Second)
		w.poll(t)
		w.proc.Signal(t)
		w.proc.Wait(t, "released", 60*time.Second)
		for range 4 {
			time.Sleep(time.Second)
			w.poll(t)
		}
	}
	bursts := w.distinct(model.KindGPUAllocBurst)
	if len(bursts) != 1 {
		t.Fatalf("%d burst findings, want 1: %+v", len(bursts), bursts)
	}
	f := bursts[0]
	t.Logf("%s", f.Summary)
	ev := f.Evidence.(model.GPUAllocBurstEvidence)
	if n := ev.Occurrences; n != 3 {
		t.Errorf("occurrences %d, want 3", n)
	}
	if p := ev.PeriodSeconds; p == nil {
		t.Error("period_seconds null, want the 5 or more seconds between bursts")
	} else if *p < 5 || *p > 30 {
		t.Errorf("period_seconds %v, want the 5 or more seconds between bursts", *p)
	}
	if ev.LargestBurstBytes != 20000*64<<10 || !stackHas(f.Stack, "burst_alloc") {
		t.Errorf("largest_burst_bytes %v, stack %q", ev.LargestBurstBytes, f.Stack)
	}
	w.none(t, model.KindGPUMemoryLeak, model.KindGPUAllocChurn)
}

// cudaMalloc + cudaFree pairs, 16000 a second over two threads: churn, and
// no burst even when each buffer is 1 MiB (16 GiB/s through, at most 2 MiB
// live).
func TestChurnWorkload(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"rate 4 KiB", []string{"rate", "16000", "2"}},
		{"churn 1 MiB", []string{"churn", "16000", "2", "1048576"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := watch(t, tc.args[0], tc.args[1:]...)
			w.proc.Signal(t)
			f := w.pollUntil(t, model.KindGPUAllocChurn, 15)
			if f == nil {
				t.Fatalf("no churn found in 15 polls; last sample: calls %v", w.p.CUDA.Calls)
			}
			t.Logf("%s", f.Summary)
			if r := f.Evidence.(model.GPUAllocChurnEvidence).PairsPerSecond; r < 5000 || r > 17000 {
				t.Errorf("pairs_per_second %v", r)
			}
			// A few more polls: bytes keep passing through.
			for range 3 {
				time.Sleep(time.Second)
				w.poll(t)
			}
			w.none(t, model.KindGPUAllocBurst, model.KindGPUMemoryLeak)
		})
	}
}

// steady_step takes 32 × 128 KiB and frees them every 10 ms: balanced,
// and under the churn rate. Nothing to report.
func TestSteadyWorkload(t *testing.T) {
	w := watch(t, "steady")
	for range 15 {
		time.Sleep(time.Second)
		w.poll(t)
	}
	if w.p.CUDA.AllocCalls["cudaMalloc"] == 0 {
		t.Fatal("no allocations seen")
	}
	w.none(t, model.KindGPUAllocBurst, model.KindGPUMemoryLeak, model.KindGPUAllocChurn, model.KindGPUAllocFailure)
}
