package pipeline

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/inputbound"
	"github.com/open-autoglm/autoglm-ebpf/pkg/launch"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// oneGPU mocks a device on which the process *pid runs kernels sm % of
// the time: NVML lists it and hands a new per-process sample at each read.
func oneGPU(pid *atomic.Int64, sm uint32) gonvml.Interface {
	dev := &mock.Device{
		GetUUIDFunc: func() (string, gonvml.Return) { return "GPU-mock", gonvml.SUCCESS },
		GetNameFunc: func() (string, gonvml.Return) { return "mock", gonvml.SUCCESS },
		GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
			return gonvml.Memory{Total: 80 << 30, Used: 1 << 30}, gonvml.SUCCESS
		},
		GetUtilizationRatesFunc: func() (gonvml.Utilization, gonvml.Return) {
			return gonvml.Utilization{Gpu: sm}, gonvml.SUCCESS
		},
		GetComputeRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) {
			return []gonvml.ProcessInfo{{Pid: uint32(pid.Load()), UsedGpuMemory: 1 << 30}}, gonvml.SUCCESS
		},
		GetGraphicsRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.SUCCESS },
		GetProcessUtilizationFunc: func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
			return []gonvml.ProcessUtilizationSample{{Pid: uint32(pid.Load()), TimeStamp: uint64(time.Now().UnixMicro()), SmUtil: sm, MemUtil: sm / 2}}, gonvml.SUCCESS
		},
		// Not in MIG mode: the sampler asks every GPU.
		GetMigModeFunc: func() (int, int, gonvml.Return) { return 0, 0, gonvml.ERROR_NOT_SUPPORTED },
	}
	return &mock.Interface{
		InitFunc:                   func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:               func() gonvml.Return { return gonvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, gonvml.Return) { return 1, gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(int) (gonvml.Device, gonvml.Return) { return dev, gonvml.SUCCESS },
		EventSetCreateFunc:         func() (gonvml.EventSet, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED },
	}
}

// The verdict on real processes, with a mock GPU: a "trainer" (a shell)
// whose four worker processes are CPU-bound on one CPU while its GPU idles
// is input bound, the finding naming the workers; the same GPU busy while
// its workers mostly sleep is GPU bound and quiet.
func TestInputBoundVerdict(t *testing.T) {
	testutil.RequireRoot(t)
	spin := "taskset -c 0 sh -c 'while :; do :; done' & "
	nap := "sh -c 'while :; do sleep 0.1; done' & "
	// The verdict is NVML's and the scheduler's: the CUDA view, refusing
	// the process or down, takes nothing from it.
	refusing := func(vs []view) []view {
		for i := range vs {
			if vs[i].name == "cuda" {
				vs[i].load = func() (Concern, error) { return &fakeView{name: "cuda", all: unix.EPERM, tracked: map[int]bool{}}, nil }
			}
		}
		return vs
	}
	down := func(vs []view) []view {
		for i := range vs {
			if vs[i].name == "cuda" {
				vs[i].load = func() (Concern, error) { return nil, errors.New("no uprobes here") }
			}
		}
		return vs
	}
	for _, tc := range []struct {
		name    string
		sm      uint32
		workers string
		verdict string
		views   func([]view) []view
	}{
		{"idle GPU, starved workers", 5, strings.Repeat(spin, 4), inputbound.InputBound, nil},
		{"busy GPU, calm workers", 95, strings.Repeat(nap, 4), inputbound.GPUBound, nil},
		{"CUDA view refuses the process", 5, strings.Repeat(spin, 4), inputbound.InputBound, refusing},
		{"CUDA view down", 5, strings.Repeat(spin, 4), inputbound.InputBound, down},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pid atomic.Int64
			cfg := DefaultConfig()
			cfg.views = tc.views
			cfg.Children = true
			cfg.NVML = oneGPU(&pid, tc.sm)
			cfg.InputBound = inputbound.Config{Window: 8 * time.Second}
			var verdict string
			var found []model.Finding
			var last *model.Snapshot
			proc, _ := procinfo.New("/proc")
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			polls := 0
			rec := &recorder{proc: proc, cancel: cancel, stop: func(s *model.Snapshot) bool {
				polls++
				last = s
				for _, p := range s.Processes {
					if int64(p.PID) == pid.Load() {
						verdict = p.CUDA.Verdict
					}
				}
				found = nil
				for _, f := range s.Findings {
					if f.Kind == model.KindGPUInputBound {
						found = append(found, f)
					}
				}
				return verdict != "" && polls > 12
			}}
			p, err := New(cfg, rec)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			g, err := launch.Start([]string{"/bin/sh", "-c", tc.workers + "wait"}, nil, nil, os.Stderr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(g.Abort)
			// The workers first (cleanups run last first): once the
			// shell is gone they are init's.
			t.Cleanup(func() { _ = exec.Command("pkill", "-KILL", "-P", strconv.Itoa(g.Cmd.Process.Pid)).Run() })
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
			switch {
			case tc.views == nil:
			case last.Views["cuda"].Down == "" && last.TrackFailures[model.TrackFailure{View: "cuda", Reason: "EPERM"}] == 0:
				t.Fatalf("the CUDA view is up and tracks the process: views %v, track failures %v", last.Views, last.TrackFailures)
			}
			if verdict != tc.verdict {
				t.Fatalf("verdict %q after %d polls, want %q; input-bound findings %+v", verdict, polls, tc.verdict, found)
			}
			if tc.verdict == inputbound.InputBound {
				if len(found) != 1 || !strings.Contains(found[0].Summary, "child") || len(found[0].Evidence.(model.GPUInputBoundEvidence).Waiting) < 2 {
					t.Fatalf("findings %+v: want one naming the starved workers", found)
				}
				t.Logf("%s", found[0].Summary)
			} else if len(found) != 0 {
				t.Fatalf("findings %+v for a busy GPU", found)
			}
		})
	}
}
