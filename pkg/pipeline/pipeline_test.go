package pipeline

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/launch"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// recorder is a sink that keeps every snapshot and compares the table with
// /proc at each one, while the process is certainly alive.
type recorder struct {
	mu     sync.Mutex
	snaps  []*model.Snapshot
	stop   func(*model.Snapshot) bool // ends the run early when true
	cancel context.CancelFunc
	diffs  []int
	proc   procinfo.FS
	final  *model.Snapshot
	closed bool
}

// runFromExec runs argv under a pipeline of cfg watching it from before
// exec, as `run` does, until stop says so (it sees every snapshot) or
// timeout, and returns the final snapshot and argv's pid.
func runFromExec(t *testing.T, cfg Config, argv []string, timeout time.Duration, stop func(*model.Snapshot) bool) (*model.Snapshot, int) {
	t.Helper()
	proc, _ := procinfo.New("/proc")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rec := &recorder{proc: proc, cancel: cancel, stop: stop}
	p, err := New(cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	g, err := launch.Start(argv, nil, nil, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Abort)
	if err := p.Watch(g.Cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	p.Ready()
	if err := g.Release(); err != nil {
		t.Fatal(err)
	}
	final, err := p.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return final, g.Cmd.Process.Pid
}

func (r *recorder) Update(s *model.Snapshot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snaps = append(r.snaps, s)
	for _, p := range s.Processes {
		if p.Exited {
			continue
		}
		if n, err := r.proc.FDCount(p.PID); err == nil {
			r.diffs = append(r.diffs, p.FD.Open-n)
		}
	}
	if r.stop(s) {
		r.cancel()
	}
}

func (r *recorder) Close(final *model.Snapshot) error {
	r.final, r.closed = final, true
	return nil
}

// intervals is how many polls a scenario gets: the leaks must be found
// within 15 intervals of 1 s, and the healthy ones stay quiet as long.
const intervals = 15

type scenario struct {
	name     string
	args     []string
	wantLeak bool
	gated    bool // tracked from before exec (as `run` does)
	within   int  // polls the leak must be found in; intervals when 0
}

func TestFDLeakScenarios(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Fixture(t, "fdwork")
	scenarios := []scenario{
		{name: "leak 5/s", args: []string{"leak", "5", "30"}, wantLeak: true},
		{name: "leak 40/s", args: []string{"leak", "40", "30"}, wantLeak: true, gated: true},
		// Too slow for the short window: the 100 s scale finds it within
		// the 2 minutes the slow scales promise.
		{name: "leak 1 every 5 s", args: []string{"leak", "0.2", "180"}, wantLeak: true, within: 120},
		{name: "stable pool with churn", args: []string{"pool", "30"}},
		{name: "burst and release", args: []string{"burst", "3000", "30"}},
		{name: "start-up opener", args: []string{"startup", "400", "30"}, gated: true},
	}
	// Run the scenarios in parallel: each has its own pipeline (own BPF
	// objects), and all of them need 15 s of wall time, the slow leak 2 min.
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			runScenario(t, bin, sc)
		})
	}
}

func runScenario(t *testing.T, bin string, sc scenario) {
	if sc.within == 0 {
		sc.within = intervals
	}
	proc, _ := procinfo.New("/proc")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Duration(sc.within)*time.Second)
	defer cancel()
	// Count polls rather than wall time: a loaded machine stretches
	// intervals, and the verdict is about what the detector saw.
	rec := &recorder{proc: proc, cancel: cancel}
	polls := 0
	rec.stop = func(s *model.Snapshot) bool {
		polls++
		return polls > sc.within || (sc.wantLeak && len(s.Findings) > 0)
	}
	p, err := New(DefaultConfig(), rec)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	var pid int
	if sc.gated {
		g, err := launch.Start(append([]string{bin}, sc.args...), nil, nil, os.Stderr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(g.Abort)
		pid = g.Cmd.Process.Pid
		if err := p.Watch(pid); err != nil {
			t.Fatal(err)
		}
		p.Ready()
		if err := g.Release(); err != nil {
			t.Fatal(err)
		}
	} else {
		pid = testutil.Start(t, bin, sc.args...).Process.Pid
		if err := p.Watch(pid); err != nil {
			t.Fatal(err)
		}
	}
	final, err := p.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !rec.closed {
		t.Fatal("sinks were not closed")
	}

	// The table matches /proc within ±1 at every interval (a sample races
	// with a running process by at most the fds opened in between; the
	// fixtures open at most a few per millisecond).
	bad := 0
	for _, d := range rec.diffs {
		if d < -1 || d > 1 {
			bad++
		}
	}
	// Churning fixtures can race the /proc read by a few fds; allow a rare
	// miss but not a systematic one.
	if len(rec.diffs) == 0 || bad > len(rec.diffs)/5 {
		t.Errorf("open-fd count off /proc by more than 1 in %d of %d samples: %v", bad, len(rec.diffs), rec.diffs)
	}

	var leak *model.Finding
	for i, f := range final.Findings {
		if f.Kind == model.KindFDLeak && f.PID == pid {
			leak = &final.Findings[i]
		}
	}
	if !sc.wantLeak {
		if leak != nil {
			t.Fatalf("healthy workload flagged: %s", leak.Summary)
		}
		return
	}
	if leak == nil {
		t.Fatalf("leak not found in %d intervals; last open fds %d", polls, final.Processes[0].FD.Open)
	}
	if polls > sc.within {
		t.Errorf("leak found after %d intervals, want <= %d", polls, sc.within)
	}
	if leak.Evidence.(model.FDLeakEvidence).TimeToExhaustionSeconds == nil {
		t.Errorf("no time to exhaustion: %+v", leak.Evidence)
	}
	if !strings.Contains(strings.Join(testutil.Texts(leak.Stack), "\n"), "leak_tick") {
		t.Errorf("leaking function not in stack: %q", leak.Stack)
	}
	if leak.CausedBy != nil {
		t.Errorf("a file leak explained by %+v", leak.CausedBy)
	}
	t.Logf("%s: found at interval %d: %s", sc.name, polls, leak.Summary)
}

// With Children set, a leak in a forked child of the target is found and
// attributed to the child.
func TestChildLeakFound(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Fixture(t, "fdwork")
	polls := 0
	cfg := DefaultConfig()
	cfg.Children = true
	// "; true" keeps the shell from exec'ing the command in place.
	final, shell := runFromExec(t, cfg, []string{"/bin/sh", "-c", bin + " leak 40 60; true"}, 3*intervals*time.Second, func(s *model.Snapshot) bool {
		polls++
		return polls > intervals+2 || len(s.Findings) > 0
	})
	if len(final.Targets) != 1 || final.Targets[0] != shell {
		t.Errorf("targets %v, want only the shell %d", final.Targets, shell)
	}
	if len(final.Findings) == 0 {
		t.Fatalf("no finding after %d intervals; processes: %d", polls, len(final.Processes))
	}
	f := final.Findings[0]
	if f.Kind != model.KindFDLeak || f.PID == shell || f.Comm != "fdwork" || !strings.Contains(strings.Join(testutil.Texts(f.Stack), " "), "leak_tick") {
		t.Fatalf("finding %+v: want an fd_leak in the fdwork child (shell %d) naming leak_tick", f, shell)
	}
	// Cleanup kills the shell only; its child would outlive it.
	_ = syscall.Kill(f.PID, syscall.SIGKILL)
}

// A CLOSE_WAIT leak found by the socket concern carries the stack that
// opened the sockets, joined from the fd concern's table; it is the one
// finding about the server, with the fd growth those sockets make as
// evidence, and the fd leak they make is recorded as caused by it.
func TestSocketLeakNamesOpeningStack(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Fixture(t, "sockwork")
	polls := 0
	final, _ := runFromExec(t, DefaultConfig(), []string{bin, "leaky-server", "10", "120"}, 90*time.Second, func(s *model.Snapshot) bool {
		polls++
		for _, f := range s.Findings {
			if f.Kind == model.KindSocketLeak {
				return true
			}
		}
		return polls > 40
	})
	var standing []model.Finding
	var fdLeak *model.Finding
	for i, f := range final.Findings {
		if f.CausedBy == nil {
			standing = append(standing, f)
		} else if f.Kind == model.KindFDLeak {
			fdLeak = &final.Findings[i]
		}
	}
	if len(standing) != 1 || standing[0].Kind != model.KindSocketLeak {
		t.Fatalf("findings on their own after %d intervals: %+v", polls, standing)
	}
	f := standing[0]
	if !strings.Contains(strings.Join(testutil.Texts(f.Stack), " "), "accept_conn") || !strings.Contains(f.Summary, "opened at accept_conn") {
		t.Fatalf("socket leak without its opening stack: %q %q", f.Summary, f.Stack)
	}
	// 10 connections a second leaked: the fd leak was seen first.
	if fdLeak == nil || *fdLeak.CausedBy != f.Ref() || len(f.Related) != 1 || f.Related[0] != fdLeak.Ref() {
		t.Fatalf("fd leak %+v not linked to socket leak %+v", fdLeak, f)
	}
	// The fd leak names what it leaks as the socket leak names its peers:
	// the server's port against any client port.
	ev := f.Evidence.(model.SocketLeakEvidence)
	top, targets := ev.TopPairs, fdLeak.Evidence.(model.FDLeakEvidence).LeakedTargets
	if len(top) == 0 || len(targets) == 0 || targets[0].Target != fmt.Sprintf("TCP %s->%s (CLOSE_WAIT)", top[0].Local, top[0].Remote) {
		t.Errorf("fd leak targets %v, socket leak pairs %v", targets, top)
	}
	growth := ev.FDGrowth
	if growth == nil || growth.GrowthPerSecond < 5 || growth.OpenFDs < 50 {
		t.Errorf("fd growth evidence %+v", growth)
	}
	t.Logf("%s\n  related %v, fd growth %v\n  fd leak: %s", f.Summary, f.Related, growth, fdLeak.Summary)
}

// Failed allocations made between the last poll and the process's exit are
// still reported, with their stack symbolized after the process is gone.
func TestFailureJustBeforeExit(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/libcudart.so.11.0"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("libcudart.so.11.0 missing: CI installs it with scripts/install-cuda-libs.sh")
		}
		t.Skip("libcudart.so.11.0 not installed (scripts/install-cuda-libs.sh)")
	}
	bin := testutil.Fixture(t, "realcuda")
	proc, _ := procinfo.New("/proc")
	rec := &recorder{proc: proc, cancel: func() {}, stop: func(*model.Snapshot) bool { return false }}
	cfg := DefaultConfig()
	// One poll right away, the next long after the fixture is gone: only the
	// final observation of the exited process can see its failures.
	cfg.Interval = 8 * time.Second
	p, err := New(cfg, rec)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// Fails cudaMalloc from 1.5 s after start for about a second, then exits.
	cmd := testutil.Start(t, bin, "2", "1500")
	if err := p.Watch(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	final, err := p.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !final.Processes[0].Exited {
		t.Fatal("the fixture did not exit")
	}
	for _, f := range final.Findings {
		if f.Kind == model.KindGPUAllocFailure {
			if !strings.Contains(strings.Join(testutil.Texts(f.Stack), " "), "allocate_weights") {
				t.Fatalf("failure stack not symbolized after exit: %q", f.Stack)
			}
			return
		}
	}
	t.Fatalf("no gpu_alloc_failure reported; findings %+v", final.Findings)
}

// The loop keeps its cadence under load: at 100 k allocations/s and at
// ~800 k context switches/s the published counters move at every interval
// (a poll that stalled behind the kernel's events would publish the same
// figures twice, or fewer snapshots).
func TestCadenceUnderLoad(t *testing.T) {
	testutil.RequireRoot(t)
	rt := testutil.CUDAStubs(t)
	for _, tc := range []struct {
		name    string
		start   func(t *testing.T) (pid int, release func())
		counter func(p *model.Process) uint64
	}{
		{"100k-allocations-per-second", func(t *testing.T) (int, func()) {
			p := testutil.StartProc(t, nil, testutil.Fixture(t, "cudawork"), rt, "rate", "12", "100000", "2")
			p.Wait(t, "loaded", 10*time.Second)
			return p.Cmd.Process.Pid, func() { p.Signal(t) }
		}, func(p *model.Process) uint64 { return p.CUDA.Calls["cudaMalloc"] }},
		{"context-switch-storm", func(t *testing.T) (int, func()) {
			cmd := testutil.Start(t, testutil.Fixture(t, "schedwork"), "storm", "4", "12")
			return cmd.Process.Pid, func() {}
		}, func(p *model.Process) uint64 { return p.Sched.Voluntary + p.Sched.Involuntary }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proc, _ := procinfo.New("/proc")
			const polls = 8
			rec := &recorder{proc: proc, stop: func(s *model.Snapshot) bool { return false }}
			p, err := New(DefaultConfig(), rec)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			p.Ready()
			pid, release := tc.start(t)
			if err := p.Watch(pid); err != nil {
				t.Fatal(err)
			}
			release()
			ctx, cancel := context.WithCancel(context.Background())
			rec.cancel = cancel
			rec.stop = func(*model.Snapshot) bool { return len(rec.snaps) >= polls+2 }
			if _, err := p.Run(ctx); err != nil {
				t.Fatal(err)
			}
			// The first two polls may precede the load (start-up, hooks).
			var prev uint64
			for i, s := range rec.snaps[2:] {
				if len(s.Processes) != 1 || s.Processes[0].Exited {
					t.Fatalf("snapshot %d: %+v", i, s.Processes)
				}
				n := tc.counter(s.Processes[0])
				if i > 0 && n <= prev {
					t.Errorf("poll %d: counter %d did not move from %d", i+2, n, prev)
				}
				prev = n
			}
			t.Logf("%s: %d events in %d polls", tc.name, prev, polls)
		})
	}
}

// A container's id reaches the pod's status only after its process
// started: the pipeline asks again, with what it knows, until the names
// come, and no more after.
func TestPodNamesArriveLater(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Fixture(t, "fdwork")
	var mu sync.Mutex
	var asked []model.Pod
	ids := model.Pod{UID: "3f0e9b7c-1a2b-4c3d-8e9f-0123456789ab", ContainerID: strings.Repeat("ab", 32)}
	cfg := DefaultConfig()
	cfg.Pod = func(pid int, known model.Pod) model.Pod {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, known)
		switch len(asked) {
		case 1:
			return ids // from the cgroup: no names yet
		case 2:
			known.Namespace, known.Name = "ml", "serve-0" // the pod, not yet the container
			return known
		}
		known.Namespace, known.Name, known.Container = "ml", "serve-0", "worker"
		return known
	}
	polls, named := 0, 0
	final, _ := runFromExec(t, cfg, []string{bin, "loop", "1000000000"}, 3*intervals*time.Second, func(s *model.Snapshot) bool {
		polls++
		if len(s.Processes) > 0 && s.Processes[0].Pod.Container == "worker" {
			named++
		}
		return named == 3 || polls > intervals
	})
	mu.Lock()
	defer mu.Unlock()
	if named < 3 {
		t.Fatalf("the container's name never came: asked %d times, last %+v", len(asked), final.Processes)
	}
	if len(asked) != 3 {
		t.Errorf("Pod asked %d times, want 3 (then the names are known): %+v", len(asked), asked)
	}
	if asked[0] != (model.Pod{}) || asked[1] != ids || asked[2].UID != ids.UID || asked[2].Name != "serve-0" {
		t.Errorf("Pod asked with %+v: want nothing known, then the cgroup's ids, then those with the pod's name", asked)
	}
}
