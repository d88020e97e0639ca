package schedtrack

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/procfs"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj/bpfobjtest"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/ctxstorm"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// modes are both ways of attaching; this kernel has tp_btf, and the classic
// fallback is forced.
var modes = []struct {
	name string
	cfg  Config
}{{ModeBTF, Config{ProcRoot: "/proc"}}, {ModeTracepoint, Config{ProcRoot: "/proc", Tracepoint: true}}}

func newTracker(t *testing.T, cfg Config, mode string) *Tracker {
	t.Helper()
	testutil.RequireRoot(t)
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	if tr.Mode() != mode {
		t.Fatalf("attached with %s, want %s (tp_btf error: %v)", tr.Mode(), mode, tr.BTFError())
	}
	return tr
}

// judged is the scheduler concern with the detector the pipeline runs on
// its view.
type judged struct {
	*Concern
	det *ctxstorm.Detector
}

// Observe fills procs and judges them, as a poll of the pipeline does.
func (j *judged) Observe(now time.Time, procs []*model.Process) ([]model.Finding, error) {
	return testutil.Judge(now, procs, j.Fill, nil, j.det)
}

func newConcern(t *testing.T) *judged {
	t.Helper()
	testutil.RequireRoot(t)
	c, err := NewConcern(Config{ProcRoot: "/proc"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &judged{Concern: c, det: ctxstorm.New(ctxstorm.DefaultConfig())}
}

func schedwork(t *testing.T, args ...string) int {
	t.Helper()
	return testutil.Start(t, testutil.Fixture(t, "schedwork", "-pthread"), args...).Process.Pid
}

// kernelSwitches sums what the kernel counted for every live thread of pid.
func kernelSwitches(t *testing.T, pid int) (vol, invol uint64) {
	t.Helper()
	tasks, err := procfs.AllThreads(pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		st, err := task.NewStatus()
		if err != nil {
			t.Fatal(err)
		}
		vol += st.VoluntaryCtxtSwitches
		invol += st.NonVoluntaryCtxtSwitches
	}
	return vol, invol
}

func ourSwitches(t *testing.T, tr *Tracker, pid int) (vol, invol uint64) {
	t.Helper()
	m, err := tr.Poll([]int{pid})
	if err != nil {
		t.Fatal(err)
	}
	return m[pid].Voluntary, m[pid].Involuntary
}

// Our counts of a pipe storm against the kernel's own nvcsw/nivcsw over the
// same interval, both read at its ends right after each other.
func TestCountsMatchKernel(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			tr := newTracker(t, m.cfg, m.name)
			pid := schedwork(t, "storm", "4", "60")
			if err := tr.Track(pid); err != nil {
				t.Fatal(err)
			}
			ov0, oi0 := ourSwitches(t, tr, pid)
			kv0, ki0 := kernelSwitches(t, pid)
			// Measurement window: both counts are compared over these 2 s.
			time.Sleep(2 * time.Second)
			ov1, oi1 := ourSwitches(t, tr, pid)
			kv1, ki1 := kernelSwitches(t, pid)
			ov, oi, kv, ki := ov1-ov0, oi1-oi0, kv1-kv0, ki1-ki0
			t.Logf("voluntary: ours %d kernel %d (%+.3f%%); involuntary: ours %d kernel %d (%+.3f%%)",
				ov, kv, pct(ov, kv), oi, ki, pct(oi, ki))
			if kv+ki < 100000 {
				t.Fatalf("only %d switches in 2 s: the storm did not run", kv+ki)
			}
			if d := pct(ov, kv); d < -2 || d > 2 {
				t.Errorf("voluntary switches differ by %.3f%%", d)
			}
			if d := pct(oi, ki); d < -2 || d > 2 {
				t.Errorf("involuntary switches differ by %.3f%%", d)
			}
			lost, err := tr.Lost()
			if err != nil {
				t.Fatal(err)
			}
			for src, n := range lost {
				// Recursion misses depend on what else runs BPF on the
				// machine; the map errors are ours.
				if n != 0 && src != "sched_recursion_misses" {
					t.Errorf("%s = %d", src, n)
				}
			}
			t.Logf("lost: %v", lost)
		})
	}
}

func pct(ours, kernel uint64) float64 {
	if kernel == 0 {
		if ours == 0 {
			return 0
		}
		return 100
	}
	return 100 * (float64(ours) - float64(kernel)) / float64(kernel)
}

// The storm is found, with the voluntary hint, its threads and a run-queue
// histogram; cpu-bound, moderate and idle processes watched alongside are not.
func TestStormFlaggedOthersQuiet(t *testing.T) {
	c := newConcern(t)
	storm := schedwork(t, "storm", "4", "60")
	quiet := map[int]string{
		schedwork(t, "cpu", "60"):             "cpu",
		schedwork(t, "moderate", "500", "60"): "moderate",
		schedwork(t, "idle", "60"):            "idle",
	}
	procs := []*model.Process{{PID: storm, Comm: "schedwork"}}
	for pid := range quiet {
		procs = append(procs, &model.Process{PID: pid, Comm: "schedwork"})
	}
	for _, p := range procs {
		if err := c.Track(p.PID); err != nil {
			t.Fatal(err)
		}
	}
	var storms []model.Finding
	// Twice the intervals the detector needs above its ceiling, and more
	// than its warm-up, so that the quiet ones are judged by their baseline too.
	for range 12 {
		// Measurement window: one observation interval of the detector.
		time.Sleep(500 * time.Millisecond)
		fs, err := c.Observe(time.Now(), procs)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			if f.PID != storm {
				t.Errorf("%s workload flagged: %s", quiet[f.PID], f.Summary)
				continue
			}
			storms = append(storms, f)
		}
	}
	if len(storms) == 0 {
		t.Fatalf("storm not flagged; counts %d voluntary, %d involuntary", procs[0].Sched.Voluntary, procs[0].Sched.Involuntary)
	}
	f := storms[len(storms)-1]
	t.Logf("%s: %s", f.Severity, f.Summary)
	ev, _ := f.Evidence.(model.CtxSwitchStormEvidence)
	if f.Kind != model.KindCtxSwitchStorm || !f.Active || ev.Hint != "mostly voluntary: lock contention or I/O churn (threads blocking and waking)" {
		t.Errorf("finding %+v", f)
	}
	if ev.VoluntaryRatio < 0.5 {
		t.Errorf("voluntary_ratio = %v", ev.VoluntaryRatio)
	}
	if ev.RunqueueP99Seconds == nil {
		t.Error("no run-queue p99 in the evidence")
	}

	s := procs[0].Sched
	if s.RunqLatency.Count == 0 || s.RunqLatency.Sum <= 0 || len(s.RunqLatency.Bounds) != len(s.RunqLatency.Counts) {
		t.Errorf("run-queue histogram of the storm: %+v", s.RunqLatency)
	}
	var inBuckets uint64
	for _, n := range s.RunqLatency.Counts {
		inBuckets += n
	}
	if inBuckets == 0 || inBuckets > s.RunqLatency.Count {
		t.Errorf("bucket counts sum to %d of %d", inBuckets, s.RunqLatency.Count)
	}
	// Every wait lies within its bucket (the kernel's sum is exact), so the
	// buckets bound the sum: a slot off by a power of two would not.
	h := s.RunqLatency
	last := h.Bounds[len(h.Bounds)-1]
	lo, hi := float64(h.Count-inBuckets)*last, math.Inf(1)
	if h.Count == inBuckets {
		hi = 0
		for i, n := range h.Counts {
			hi += float64(n) * h.Bounds[i]
		}
	}
	for i, n := range h.Counts[1:] {
		lo += float64(n) * h.Bounds[i]
	}
	if h.Sum < lo || h.Sum > hi {
		t.Errorf("sum %.6fs outside what the buckets allow, [%.6f, %.6f]", h.Sum, lo, hi)
	}
	pingpong := 0
	for _, th := range s.Threads {
		if th.Name == "pingpong" && th.Voluntary > 0 {
			pingpong++
		}
	}
	if pingpong != 8 || s.Threads[0].Name != "pingpong" {
		t.Errorf("threads: %+v, want the 8 pingpong threads first", s.Threads)
	}
	if s.AllowedCPUs != runtime.NumCPU() {
		t.Errorf("allowed CPUs = %d, want %d", s.AllowedCPUs, runtime.NumCPU())
	}
	// The moderate pair is counted too: the quiet verdict is not blindness.
	for _, p := range procs[1:] {
		if quiet[p.PID] == "moderate" && p.Sched.Voluntary < 1000 {
			t.Errorf("moderate workload: only %d voluntary switches counted", p.Sched.Voluntary)
		}
	}
}

// Threads that exit drop their entries in the kernel; the process keeps
// their counts. Untrack then drops everything.
func TestExitAndUntrack(t *testing.T) {
	tr := newTracker(t, Config{ProcRoot: "/proc"}, ModeBTF)
	cmd := testutil.Start(t, testutil.Fixture(t, "schedwork", "-pthread"), "storm", "2", "1")
	pid := cmd.Process.Pid
	if err := tr.Track(pid); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	m, err := tr.Poll([]int{pid})
	if err != nil {
		t.Fatal(err)
	}
	if s := m[pid]; s.Voluntary == 0 || len(s.Threads) != 0 {
		t.Errorf("after exit: %d voluntary, threads %+v; want counts kept, no threads", s.Voluntary, s.Threads)
	}
	if s := m[pid]; s.Histogram().Count == 0 {
		t.Error("no run-queue waits counted")
	}
	var (
		tid uint32
		th  schedThreadSched
	)
	for it := tr.maps.ThreadCounts.Iterate(); it.Next(&tid, &th); {
		if th.Tgid == uint32(pid) {
			t.Errorf("entry of exited thread %d still in the table", tid)
		}
	}

	live := schedwork(t, "storm", "1", "60")
	if err := tr.Track(live); err != nil {
		t.Fatal(err)
	}
	// Untrack must have thread entries to drop.
	testutil.Eventually(t, 10*time.Second, "the live storm's threads in the table", func() bool {
		for it := tr.maps.ThreadCounts.Iterate(); it.Next(&tid, &th); {
			if th.Tgid == uint32(live) {
				return true
			}
		}
		return false
	})
	tr.Untrack(live)
	tr.Untrack(pid)
	if _, err := tr.Poll([]int{live}); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("Poll after Untrack: %v, want ErrKeyNotExist", err)
	}
	// The storm goes on, untracked: nothing of it may come back, and the
	// next poll drops the threads it started since the last one.
	// Measurement window: the untracked storm runs on for 200 ms.
	time.Sleep(200 * time.Millisecond)
	if _, err := tr.Poll(nil); err != nil {
		t.Fatal(err)
	}
	for it := tr.maps.ThreadCounts.Iterate(); it.Next(&tid, &th); {
		t.Errorf("thread %d of pid %d still in the table", tid, th.Tgid)
	}
}

// Close leaves no program or map behind.
func TestCloseUnloads(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			testutil.RequireRoot(t)
			tr, err := New(m.cfg)
			if err != nil {
				t.Fatal(err)
			}
			var progs []ebpf.ProgramID
			for _, p := range tr.obj.Programs() {
				info, err := p.Info()
				if err != nil {
					t.Fatal(err)
				}
				id, _ := info.ID()
				progs = append(progs, id)
			}
			mapInfo, err := tr.maps.ThreadCounts.Info()
			if err != nil {
				t.Fatal(err)
			}
			mapID, _ := mapInfo.ID()
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			if err := tr.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			// The kernel frees them after the last reference, possibly
			// from a work queue: allow it a moment.
			for _, id := range progs {
				testutil.Eventually(t, 10*time.Second, fmt.Sprintf("program %d to be unloaded after Close", id), func() bool {
					p, err := ebpf.NewProgramFromID(id)
					if err == nil {
						p.Close()
					}
					return errors.Is(err, os.ErrNotExist)
				})
			}
			testutil.Eventually(t, 10*time.Second, fmt.Sprintf("map %d to be freed after Close", mapID), func() bool {
				mp, err := ebpf.NewMapFromID(mapID)
				if err == nil {
					mp.Close()
				}
				return errors.Is(err, os.ErrNotExist)
			})
		})
	}
}

// The histogram's bounds: powers of two of a second, from about a
// microsecond; waits under it fall in the first bucket, waits over the last
// bound only in Count.
func TestHistogram(t *testing.T) {
	var s Sample
	s.RunqSlots[0] = 1  // ~1 ns
	s.RunqSlots[9] = 2  // 2^-21..2^-20 s
	s.RunqSlots[10] = 3 // 2^-20..2^-19 s
	s.RunqSlots[31] = 4 // over 2 s
	s.RunqSumNs = 5e9
	h := s.Histogram()
	if len(h.Bounds) != 22 || h.Bounds[0] != math.Ldexp(1, -20) || h.Bounds[1] != math.Ldexp(1, -19) || h.Bounds[21] != 2 {
		t.Fatalf("bounds %v", h.Bounds)
	}
	if h.Counts[0] != 3 || h.Counts[1] != 3 || h.Count != 10 || h.Sum != 5 {
		t.Errorf("counts %v count %d sum %v", h.Counts, h.Count, h.Sum)
	}
}

// Two tracked pids share a prefilter bit; untracking one must not blind the
// tracker to the other.
func TestSharedPrefilterBit(t *testing.T) {
	tr := newTracker(t, Config{ProcRoot: "/proc"}, ModeBTF)
	pid := schedwork(t, "storm", "1", "60")
	other := pid + trackedBits // the same bit; no such process needs to exist
	for _, p := range []int{pid, other} {
		if err := tr.Track(p); err != nil {
			t.Fatal(err)
		}
	}
	tr.Untrack(other)
	v0, _ := ourSwitches(t, tr, pid)
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("switches counted after untracking a pid sharing the bit (still %d)", v0), func() bool {
		v1, _ := ourSwitches(t, tr, pid)
		return v1 != v0
	})
}

// The fallbacks of kernels before 6.1, taken on this one: hash maps
// preallocated, the exiting task read with CO-RE rather than through
// bpf_get_current_task_btf.
func TestOlderKernelFallbacks(t *testing.T) {
	bpfobjtest.OlderKernel(t)
	TestCountsMatchKernel(t)
}
