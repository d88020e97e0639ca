package pipeline

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/ncclstall"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/offcpu"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// ncclJob is the four-rank fixture (testdata/ncclrank.c) on the stand-in
// libnccl.so.2: the ranks' pids by rank, once forked.
type ncclJob struct {
	cmd   *exec.Cmd
	ranks [4]int
}

// startNCCLJob starts the fixture in mode; its ranks set up their
// communicator only once release is called, so that the pipeline tracks
// them (and hooks libnccl) first.
func startNCCLJob(t *testing.T, mode ...string) *ncclJob {
	t.Helper()
	bin := testutil.Fixture(t, "ncclrank")
	cmd := exec.Command(bin, append([]string{testutil.NCCLStub(t), mode[0], "120"}, mode[1:]...)...)
	cmd.Env = append(os.Environ(), "NCCLRANK_START=signal")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	j := &ncclJob{cmd: cmd}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var r, pid int
			if n, _ := fmt.Sscanf(sc.Text(), "rank %d pid %d", &r, &pid); n == 2 && r >= 0 && r < 4 {
				j.ranks[r] = pid
			}
			if strings.TrimSpace(sc.Text()) == "ready" {
				ready <- true
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(20 * time.Second):
		t.Fatalf("ncclrank %v never printed ready", mode)
	}
	return j
}

// release lets the ranks set up their communicator and step.
func (j *ncclJob) release(t *testing.T) {
	t.Helper()
	if err := j.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
}

// latest keeps the pipeline's latest snapshot and every NCCL finding seen.
type latest struct {
	mu    sync.Mutex
	snap  *model.Snapshot
	found []model.Finding
}

func (l *latest) Update(s *model.Snapshot) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.snap = s
	for _, f := range s.Findings {
		if f.Kind == model.KindNCCLStraggler || f.Kind == model.KindNCCLHang {
			l.found = append(l.found, f)
		}
	}
}

func (l *latest) Close(*model.Snapshot) error { return nil }

// now returns the NCCL findings of the latest snapshot and the most
// collectives any rank of pids has made.
func (l *latest) now(pids []int) (fs []model.Finding, most uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.snap == nil {
		return nil, 0
	}
	for _, f := range l.snap.Findings {
		if f.Kind == model.KindNCCLStraggler || f.Kind == model.KindNCCLHang {
			fs = append(fs, f)
		}
	}
	for _, p := range l.snap.Processes {
		if slices.Contains(pids, p.PID) {
			for i := range p.NCCL.Comms {
				most = max(most, p.NCCL.Comms[i].Collectives())
			}
		}
	}
	return fs, most
}

// runNCCLJob watches the job's ranks under a pipeline judging stalls of
// stall, releases them, and returns what the pipeline reports; the run
// ends with the test.
func runNCCLJob(t *testing.T, j *ncclJob, stall time.Duration) *latest {
	t.Helper()
	cfg := DefaultConfig()
	cfg.NCCLStall = ncclstall.Config{Stall: stall}
	l := &latest{}
	p, err := New(cfg, l)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range j.ranks {
		if err := p.Watch(pid); err != nil {
			t.Fatal(err)
		}
	}
	p.Ready()
	if st, ok := p.status["nccl"]; !ok || st.Down != "" {
		t.Fatalf("the NCCL view is not up: registered %v, down %q", ok, st.Down)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := p.Run(ctx); done <- err }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
		_ = p.Close()
	})
	j.release(t)
	return l
}

// The four-rank fixture, judged with a 10 s stall: rank 2 stalls in
// load_next_batch after 20 steps while the others wait one collective
// ahead: nccl_straggler on rank 2's process within 90 s, naming that
// function (where its thread leaves the CPU) and its last collective's
// site, train_step; no hang.
func TestNCCLStraggler(t *testing.T) {
	testutil.RequireRoot(t)
	j := startNCCLJob(t, "straggler", "2", "20")
	l := runNCCLJob(t, j, 10*time.Second)
	var last []model.Finding
	testutil.Eventually(t, 90*time.Second, "nccl_straggler on rank 2 naming load_next_batch", func() bool {
		last, _ = l.now(j.ranks[:])
		return slices.ContainsFunc(last, func(f model.Finding) bool {
			return f.Kind == model.KindNCCLStraggler && f.PID == j.ranks[2] &&
				(strings.Contains(f.Summary, "load_next_batch") || f.Evidence.(model.NCCLStragglerEvidence).StacksUnavailable == offcpu.NoRegisters)
		})
	})
	for _, f := range l.found {
		if f.Kind == model.KindNCCLHang || f.PID != j.ranks[2] {
			t.Errorf("finding %s on pid %d: %s", f.Kind, f.PID, f.Summary)
		}
	}
	i := slices.IndexFunc(last, func(f model.Finding) bool { return f.Kind == model.KindNCCLStraggler })
	f := last[i]
	ev := f.Evidence.(model.NCCLStragglerEvidence)
	if len(ev.Communicators) != 1 || ev.Communicators[0].Rank != 2 || ev.Communicators[0].Behind != 1 || len(ev.Communicators[0].Peers) != 3 {
		t.Errorf("evidence %+v", ev)
	}
	if !slices.ContainsFunc(f.Stack, func(fr model.Frame) bool { return fr.Function == "train_step" }) {
		t.Errorf("stack %v: want the last collective's, at train_step", f.Stack)
	}
	t.Logf("%s", f.Summary)
}

// Four healthy ranks: 25 s of steps (over twice the stall) make no
// finding, while the view sees their collectives.
func TestNCCLHealthy(t *testing.T) {
	testutil.RequireRoot(t)
	j := startNCCLJob(t, "healthy")
	l := runNCCLJob(t, j, 10*time.Second)
	start := time.Now()
	var most uint64
	testutil.Eventually(t, 40*time.Second, "25 s of collectives", func() bool {
		_, most = l.now(j.ranks[:])
		return time.Since(start) > 25*time.Second && most > 100
	})
	if len(l.found) != 0 {
		t.Errorf("healthy job: %d findings, first %s: %s", len(l.found), l.found[0].Kind, l.found[0].Summary)
	}
}

// All four ranks stop after 20 steps at the same count: one nccl_hang, on
// rank 0's process, naming the four; no straggler.
func TestNCCLHang(t *testing.T) {
	testutil.RequireRoot(t)
	j := startNCCLJob(t, "hang", "20")
	l := runNCCLJob(t, j, 10*time.Second)
	var last []model.Finding
	testutil.Eventually(t, 90*time.Second, "nccl_hang on rank 0", func() bool {
		last, _ = l.now(j.ranks[:])
		return slices.ContainsFunc(last, func(f model.Finding) bool { return f.Kind == model.KindNCCLHang && f.PID == j.ranks[0] })
	})
	for _, f := range l.found {
		if f.Kind != model.KindNCCLHang {
			t.Errorf("finding %s on pid %d: %s", f.Kind, f.PID, f.Summary)
		}
	}
	f := last[slices.IndexFunc(last, func(f model.Finding) bool { return f.Kind == model.KindNCCLHang })]
	ev := f.Evidence.(model.NCCLHangEvidence)
	if len(ev.Communicators) != 1 || len(ev.Communicators[0].Ranks) != 4 {
		t.Errorf("evidence %+v", ev)
	}
	t.Logf("%s", f.Summary)
}
