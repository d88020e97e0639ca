package ncclstall

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var t0 = time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)

const commID = "9f86d081884c7d659a2feaa0c55ad015"

// job is four rank processes of one communicator on this node.
type job struct {
	procs []*model.Process
}

func newJob(ranks int) *job {
	j := &job{}
	for r := range ranks {
		j.procs = append(j.procs, &model.Process{PID: 100 + r, Comm: "train", NCCL: model.NCCLStats{Library: "libnccl.so.2",
			Comms: []model.NCCLComm{{ID: commID, Rank: r, NRanks: ranks, Calls: map[string]uint64{}, Bytes: map[string]uint64{}}}}})
	}
	return j
}

// call has rank r make one allreduce at t.
func (j *job) call(r int, t time.Time) {
	c := &j.procs[r].NCCL.Comms[0]
	c.Calls = map[string]uint64{"allreduce": c.Calls["allreduce"] + 1}
	c.LastTime, c.LastOp = t, "allreduce"
	c.LastStack = []model.Frame{{Kind: model.FrameNative, Function: "ncclAllReduce"}, {Kind: model.FramePython, Function: "step", File: "train.py", Line: 42}}
}

// run polls every second from second from for secs seconds; each poll the
// ranks for which progress says so make a collective first. It returns
// every finding reported.
func (j *job) run(d *Detector, from, secs int, progress func(sec, rank int) bool) []model.Finding {
	var out []model.Finding
	for s := from; s < from+secs; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		for r := range j.procs {
			if progress(s, r) {
				j.call(r, now)
			}
		}
		out = append(out, d.Observe(now, j.procs)...)
	}
	return out
}

func threads(pid int) []model.NCCLThread {
	return []model.NCCLThread{{TID: pid, Name: "train", State: "sleeping", WaitChannel: "hrtimer_nanosleep"},
		{TID: pid + 1000, Name: "pt_data_worker", State: "blocked", WaitChannel: "folio_wait_bit"}}
}

func kinds(fs []model.Finding) map[string]int {
	m := map[string]int{}
	for _, f := range fs {
		m[f.Kind]++
	}
	return m
}

// Rank 2 stops after step 10 while the others make one more collective
// and wait: once it has made none and been behind for Stall,
// nccl_straggler on its
// process, naming its rank, its last collective's site and its threads;
// none before; it ends when the rank catches up.
func TestStraggler(t *testing.T) {
	j := newJob(4)
	d := New(Config{Stall: 10 * time.Second}, threads, nil)
	healthy := func(s, r int) bool { return true }
	if fs := j.run(d, 0, 10, healthy); len(fs) != 0 {
		t.Fatalf("healthy steps: %v", fs)
	}
	stalled := func(s, r int) bool { return r != 2 && s == 10 }
	if fs := j.run(d, 10, 10, stalled); len(fs) != 0 {
		t.Fatalf("before Stall: %v", fs)
	}
	fs := j.run(d, 20, 3, stalled)
	if len(fs) != 3 || kinds(fs)[model.KindNCCLStraggler] != 3 {
		t.Fatalf("want nccl_straggler at each of 3 polls, got %v", fs)
	}
	f := fs[len(fs)-1]
	if f.PID != 102 || !f.Active || f.FirstSeen != t0.Add(20*time.Second) || f.Severity != model.SeverityWarning {
		t.Errorf("finding %+v", f)
	}
	ev := f.Evidence.(model.NCCLStragglerEvidence)
	if len(ev.Communicators) != 1 {
		t.Fatalf("evidence %+v", ev)
	}
	l := ev.Communicators[0]
	if l.Rank != 2 || l.NRanks != 4 || l.Collectives != 10 || l.Behind != 1 || len(l.Peers) != 3 || l.LastCall == nil || l.LastCall.Op != "allreduce" {
		t.Errorf("lag %+v", l)
	}
	if ev.StalledSeconds < 11 || len(ev.Threads) != 2 || ev.Threads[0].State != "blocked" {
		t.Errorf("stalled %v, threads %+v", ev.StalledSeconds, ev.Threads)
	}
	if len(f.Stack) != 2 || f.Stack[1].Line != 42 {
		t.Errorf("stack %v, want the last collective's", f.Stack)
	}
	for _, want := range []string{"rank 2 of 4", "1 behind ranks 0, 1, 3", "pt_data_worker 1102 blocked in folio_wait_bit"} {
		if !strings.Contains(f.Summary, want) {
			t.Errorf("summary %q lacks %q", f.Summary, want)
		}
	}
	// It catches up: the finding ends, once.
	fs = j.run(d, 23, 2, func(s, r int) bool { return r == 2 && s == 23 })
	if len(fs) != 1 || fs[0].Active || fs[0].Kind != model.KindNCCLStraggler || fs[0].FirstSeen != f.FirstSeen {
		t.Errorf("after catching up: %v", fs)
	}
}

// Four ranks calling together make no finding, however long.
func TestHealthy(t *testing.T) {
	j := newJob(4)
	d := New(Config{Stall: 10 * time.Second}, threads, nil)
	if fs := j.run(d, 0, 120, func(s, r int) bool { return s%3 == 0 }); len(fs) != 0 {
		t.Errorf("healthy job: %v", fs)
	}
	// Set up but never used: no finding either.
	if fs := newJob(4).run(New(Config{Stall: 10 * time.Second}, nil, nil), 0, 30, func(int, int) bool { return false }); len(fs) != 0 {
		t.Errorf("unused communicator: %v", fs)
	}
}

// All four stop at the same count: one nccl_hang, on rank 0's process,
// naming every rank; no straggler.
func TestHang(t *testing.T) {
	j := newJob(4)
	d := New(Config{Stall: 10 * time.Second}, threads, nil)
	fs := j.run(d, 0, 25, func(s, r int) bool { return s < 10 })
	if k := kinds(fs); k[model.KindNCCLStraggler] != 0 || k[model.KindNCCLHang] == 0 {
		t.Fatalf("want nccl_hang only, got %v", fs)
	}
	f := fs[len(fs)-1]
	if f.PID != 100 || f.Severity != model.SeverityCritical || f.FirstSeen != t0.Add(19*time.Second) {
		t.Errorf("finding %+v", f)
	}
	ev := f.Evidence.(model.NCCLHangEvidence)
	if len(ev.Communicators) != 1 || len(ev.Communicators[0].Ranks) != 4 || ev.Communicators[0].Collectives != 10 || ev.StalledSeconds < 10 {
		t.Errorf("evidence %+v", ev)
	}
	if !strings.Contains(f.Summary, "ranks 0 (pid 100), 1 (pid 101), 2 (pid 102), 3 (pid 103)") {
		t.Errorf("summary %q", f.Summary)
	}
	// One rank moves: the hang ends, and the others, behind it now, are no
	// stragglers (yet).
	fs = j.run(d, 25, 1, func(s, r int) bool { return r == 3 })
	if len(fs) != 1 || fs[0].Active || fs[0].Kind != model.KindNCCLHang {
		t.Errorf("after progress: %v", fs)
	}
}

// An agent started on a job already stuck, rank 1 behind: the ranks' last
// calls are long past, but rank 1 has been seen behind only since the
// agent came: no hang (counts differ), and the straggler once it has
// been behind for Stall.
func TestStuckBeforeStart(t *testing.T) {
	j := newJob(3)
	for r := range j.procs {
		j.call(r, t0.Add(-time.Hour))
		if r != 1 {
			j.call(r, t0.Add(-time.Hour))
		}
	}
	d := New(Config{Stall: 10 * time.Second}, nil, nil)
	none := func(int, int) bool { return false }
	if fs := j.run(d, 0, 10, none); len(fs) != 0 {
		t.Fatalf("within Stall of the start: %v", fs)
	}
	fs := j.run(d, 10, 1, none)
	if len(fs) != 1 || fs[0].Kind != model.KindNCCLStraggler || fs[0].PID != 101 || fs[0].Evidence.(model.NCCLStragglerEvidence).StalledSeconds < 3600 {
		t.Errorf("after Stall: %+v", fs)
	}
}

// A destroyed communicator and an exited rank are not judged: the other
// ranks of a job whose rank 2 tore its communicator down, or exited, make
// no straggler of it and no hang of the rest.
func TestDestroyedAndExited(t *testing.T) {
	for name, gone := range map[string]func(p *model.Process){
		"destroyed": func(p *model.Process) { p.NCCL.Comms[0].Destroyed = true },
		"exited":    func(p *model.Process) { p.Exited = true },
	} {
		t.Run(name, func(t *testing.T) {
			j := newJob(4)
			d := New(Config{Stall: 10 * time.Second}, threads, nil)
			j.run(d, 0, 10, func(int, int) bool { return true })
			gone(j.procs[2])
			// The others go on: no straggler of rank 2.
			if fs := j.run(d, 10, 30, func(s, r int) bool { return r != 2 }); len(fs) != 0 {
				t.Errorf("%s rank: %v", name, fs)
			}
			for _, p := range j.procs {
				p.NCCL.Comms[0].Destroyed = true
			}
			if fs := j.run(d, 40, 30, func(int, int) bool { return false }); len(fs) != 0 {
				t.Errorf("all destroyed: %v", fs)
			}
		})
	}
}

// Handles set up before tracking began have no id: not one communicator
// of the processes that have them, so no straggler among them.
func TestNoID(t *testing.T) {
	j := newJob(4)
	for _, p := range j.procs {
		p.NCCL.Comms[0].ID, p.NCCL.Comms[0].Rank, p.NCCL.Comms[0].NRanks = "", -1, -1
	}
	d := New(Config{Stall: 10 * time.Second}, nil, nil)
	if fs := j.run(d, 0, 40, func(s, r int) bool { return r != 2 }); len(fs) != 0 {
		t.Errorf("handles without id: %v", fs)
	}
}

// A process whose rank lags in two communicators at once (data and tensor
// parallel) makes one finding naming both.
func TestStragglerTwoCommunicators(t *testing.T) {
	j := newJob(2)
	for _, p := range j.procs {
		c := p.NCCL.Comms[0]
		c.ID = "other"
		c.Calls = map[string]uint64{"allgather": 5}
		p.NCCL.Comms = append(p.NCCL.Comms, c)
	}
	j.procs[0].NCCL.Comms[1].Calls = map[string]uint64{"allgather": 7}
	d := New(Config{Stall: 10 * time.Second}, nil, nil)
	fs := j.run(d, 0, 15, func(s, r int) bool { return r == 0 && s == 0 })
	if len(fs) == 0 {
		t.Fatal("no finding")
	}
	f := fs[len(fs)-1]
	ev := f.Evidence.(model.NCCLStragglerEvidence)
	if f.PID != 101 || len(ev.Communicators) != 2 || kinds(fs)[model.KindNCCLHang] != 0 {
		t.Errorf("finding %+v", f)
	}
}

// The reader of the tool's own threads: the test's process has a running
// thread (this one).
func TestProcThreads(t *testing.T) {
	read, err := ProcThreads("/proc")
	if err != nil {
		t.Fatal(err)
	}
	ts := read(selfPID())
	running := false
	for _, th := range ts {
		running = running || th.State == "running"
		if th.TID == 0 || th.Name == "" || th.State == "" {
			t.Errorf("thread %+v", th)
		}
	}
	if !running {
		t.Errorf("no running thread in %+v", ts)
	}
	if ts := read(1 << 30); ts != nil {
		t.Errorf("a process that is not there: %+v", ts)
	}
}

func selfPID() int { return os.Getpid() }

// fakeWhere is a Where that records what it was told to watch and has the
// stacks it was given.
type fakeWhere struct {
	watched [][]int
	stacks  map[int][]model.Frame
	why     string
}

func (w *fakeWhere) Watch(_ time.Time, pids []int) { w.watched = append(w.watched, pids) }

func (w *fakeWhere) Stacks(pid int) (map[int][]model.Frame, string) { return w.stacks, w.why }

// The lagging rank is watched from half the stall on, and the finding names
// where its threads left the CPU: the program's own frames past the C
// library, and the Python line. Once it ends, nothing is watched.
func TestStragglerWhere(t *testing.T) {
	libc := func(fn string) model.Frame {
		return model.Frame{Kind: model.FrameNative, Function: fn, Module: "libc.so.6", Offset: 0x23}
	}
	own := func(fn string, line int) model.Frame {
		return model.Frame{Kind: model.FrameNative, Function: fn, Module: "python3.12", File: "/src/loader.c", Line: line}
	}
	w := &fakeWhere{stacks: map[int][]model.Frame{1102: {libc("clock_nanosleep"), libc("nanosleep"), own("nap", 13), own("poll_batch", 20),
		{Kind: model.FramePython, Function: "Loader.next", File: "train.py", Line: 88}, own("_PyEval_EvalFrameDefault", 1), own("main", 30)}}}
	j := newJob(4)
	d := New(Config{Stall: 10 * time.Second}, threads, w)
	j.run(d, 0, 10, func(int, int) bool { return true })
	stalled := func(s, r int) bool { return r != 2 && s == 10 }
	j.run(d, 10, 4, stalled) // rank 2 idle 4 s: not yet
	if got := w.watched[len(w.watched)-1]; len(got) != 0 {
		t.Errorf("watched %v after 4 s", got)
	}
	j.run(d, 14, 1, stalled) // 5 s: half the stall
	if got := w.watched[len(w.watched)-1]; len(got) != 1 || got[0] != 102 {
		t.Errorf("watched %v after 5 s, want [102]", got)
	}
	fs := j.run(d, 15, 6, stalled)
	if len(fs) == 0 {
		t.Fatal("no finding")
	}
	f := fs[len(fs)-1]
	ev := f.Evidence.(model.NCCLStragglerEvidence)
	if ev.StacksUnavailable != "" || len(ev.Threads) != 2 || len(ev.Threads[0].Stack) != 7 || ev.Threads[1].Stack != nil {
		t.Errorf("threads %+v, unavailable %q", ev.Threads, ev.StacksUnavailable)
	}
	if want := "pt_data_worker 1102 blocked in folio_wait_bit at nap (loader.c:13) < poll_batch (loader.c:20) < Loader.next (train.py:88)"; !strings.Contains(f.Summary, want) {
		t.Errorf("summary %q lacks %q", f.Summary, want)
	}
	// Caught up: nothing watched any more.
	j.run(d, 21, 1, func(s, r int) bool { return r == 2 })
	if got := w.watched[len(w.watched)-1]; len(got) != 0 {
		t.Errorf("watched %v after catching up", got)
	}
	// A kernel without the registers: the finding says why.
	w2 := &fakeWhere{why: "no registers"}
	j2 := newJob(2)
	d2 := New(Config{Stall: 10 * time.Second}, nil, w2)
	fs = j2.run(d2, 0, 15, func(s, r int) bool { return r == 0 && s == 0 })
	if len(fs) == 0 || fs[len(fs)-1].Evidence.(model.NCCLStragglerEvidence).StacksUnavailable != "no registers" {
		t.Errorf("findings %+v", fs)
	}
}
