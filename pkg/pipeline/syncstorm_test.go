package pipeline

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/inputbound"
	"github.com/open-autoglm/autoglm-ebpf/pkg/launch"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// stormPolls is how many polls a sync-storm scenario gets: the storm must
// be found within them (its window is 10 s, the runtime is hooked a poll or
// two after the script loads it), and the healthy loops stay quiet as long.
const stormPolls = 25

// A training loop's host side in real Python on the stand-in runtime
// (testdata/python/syncstorm.py), watched from exec: 1 000 short
// cudaStreamSynchronize calls a second from the .item() line of
// train_step is a gpu_sync_storm naming that line, with or without NVML;
// the same loop syncing once a step, and a GPU-bound loop whose host waits
// long on a busy GPU, make none; the latter's verdict is gpu_bound,
// confirmed by the host's waits.
func TestPythonSyncStorm(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat(testutil.DebianPython); err != nil {
		testutil.Pythons(t) // fails in CI, skips elsewhere
		t.Skipf("%s missing", testutil.DebianPython)
	}
	rt := testutil.CUDAStubs(t)
	script := testutil.PythonScript("syncstorm.py")
	itemLine := testutil.LineOf(t, script, "# sync: item")
	for _, tc := range []struct {
		name   string
		mode   string
		syncUS int
		sm     uint32 // a mock GPU's utilization; 0: no NVML
		storm  bool
	}{
		{"storm, no NVML", "storm", 50, 0, true},
		{"storm, idle GPU", "storm", 50, 10, true},
		{"once a step", "step", 50, 0, false},
		{"GPU-bound", "bound", 90000, 95, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("CUDA_STUB_SYNC_US", strconv.Itoa(tc.syncUS))
			var pid atomic.Int64
			cfg := DefaultConfig()
			if tc.sm > 0 {
				cfg.NVML = oneGPU(&pid, tc.sm)
			}
			cfg.InputBound = inputbound.Config{Window: 8 * time.Second}
			var storm *model.Finding
			var proc *model.Process
			polls := 0
			stop := func(s *model.Snapshot) bool {
				polls++
				for _, p := range s.Processes {
					if int64(p.PID) == pid.Load() {
						proc = p
					}
				}
				if i := slices.IndexFunc(s.Findings, func(f model.Finding) bool { return f.Kind == model.KindGPUSyncStorm && f.Active }); i >= 0 {
					storm = &s.Findings[i]
				}
				return polls >= stormPolls || storm != nil
			}
			watchExec(t, cfg, &pid, []string{testutil.DebianPython, script, rt, tc.mode, "0"}, 2*stormPolls*time.Second, stop)
			if proc == nil || proc.CUDA.Waits.Calls == 0 {
				t.Fatalf("no waits seen in %d polls: %+v", polls, proc)
			}
			if !tc.storm {
				if storm != nil {
					t.Fatalf("a storm after %d polls: %s", polls, storm.Summary)
				}
				if tc.mode == "bound" {
					if h := proc.CUDA.VerdictHost; proc.CUDA.Verdict != inputbound.GPUBound || h == nil || !h.Confirmed {
						t.Errorf("verdict %q, host side %+v; want gpu_bound, confirmed", proc.CUDA.Verdict, h)
					}
				}
				t.Logf("%d polls, %d waits, %.3f s", polls, proc.CUDA.Waits.Calls, proc.CUDA.Waits.Seconds)
				return
			}
			if storm == nil {
				t.Fatalf("no gpu_sync_storm in %d polls; waits %d calls, %.3f s, sites %+v", polls, proc.CUDA.Waits.Calls, proc.CUDA.Waits.Seconds, proc.CUDA.Waits.Sites)
			}
			want := model.Frame{Kind: model.FramePython, Function: "train_step", File: script, Line: itemLine}
			if !slices.Contains(storm.Stack, want) {
				t.Errorf("stack has no %q:\n  %s", want, strings.Join(testutil.Texts(storm.Stack), "\n  "))
			}
			if site := fmt.Sprintf("cudaStreamSynchronize at train_step (syncstorm.py:%d)", itemLine); !strings.Contains(storm.Summary, site) {
				t.Errorf("summary %q does not say %q", storm.Summary, site)
			}
			ev := storm.Evidence.(model.GPUSyncStormEvidence)
			if (ev.SMUtilizationMean == nil) != (tc.sm == 0) || (tc.sm == 0) != strings.Contains(storm.Summary, "GPU utilization not known") {
				t.Errorf("utilization %v in evidence, summary %q", ev.SMUtilizationMean, storm.Summary)
			}
			t.Logf("found at poll %d: %s", polls, storm.Summary)
		})
	}
}

// watchExec runs a pipeline with cfg on argv, watched from exec, until stop
// says so or timeout; *pid is the process's once it started.
func watchExec(t *testing.T, cfg Config, pid *atomic.Int64, argv []string, timeout time.Duration, stop func(*model.Snapshot) bool) {
	t.Helper()
	proc, _ := procinfo.New("/proc")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	p, err := New(cfg, &recorder{proc: proc, cancel: cancel, stop: stop})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	g, err := launch.Start(argv, nil, nil, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Abort)
	pid.Store(int64(g.Cmd.Process.Pid))
	if err := p.Watch(g.Cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	p.Ready()
	if err := g.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Run(ctx); err != nil {
		t.Fatal(err)
	}
}
