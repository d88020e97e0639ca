package pipeline

import (
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// sharedGPU mocks a device, 79 of its 80 GiB used, on which NVML lists the
// process *pid with self bytes and another, other, with its bytes.
func sharedGPU(pid *atomic.Int64, self uint64, other int, bytes uint64) gonvml.Interface {
	dev := &mock.Device{
		GetUUIDFunc: func() (string, gonvml.Return) { return "GPU-shared", gonvml.SUCCESS },
		GetNameFunc: func() (string, gonvml.Return) { return "mock", gonvml.SUCCESS },
		GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
			return gonvml.Memory{Total: 80 << 30, Used: 79 << 30}, gonvml.SUCCESS
		},
		GetUtilizationRatesFunc: func() (gonvml.Utilization, gonvml.Return) { return gonvml.Utilization{Gpu: 90}, gonvml.SUCCESS },
		GetComputeRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) {
			return []gonvml.ProcessInfo{{Pid: uint32(pid.Load()), UsedGpuMemory: self}, {Pid: uint32(other), UsedGpuMemory: bytes}}, gonvml.SUCCESS
		},
		GetGraphicsRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.SUCCESS },
		GetProcessUtilizationFunc: func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
			return nil, gonvml.ERROR_NOT_SUPPORTED
		},
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

// Out of memory on a GPU shared with a process the agent does not watch:
// the stand-in runtime with 512 MiB (testdata/cudawork oom) keeps 164 MiB
// at two sites, then asks 1 GiB. The snapshot the pipeline hands its
// sinks names the neighbour, its memory and its pod (Config.Pod), has the
// failing process's NVML figure and the gap to its hooked bytes, and a
// history that ends at the failure.
func TestOOMSnapshotNeighbour(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Fixture(t, "cudawork")
	rt := testutil.CUDAStubs(t)
	t.Setenv("CUDA_STUB_MEMORY", strconv.Itoa(512<<20))
	other := exec.Command("sleep", "120")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })

	const mib = 1 << 20
	var pid atomic.Int64
	cfg := DefaultConfig()
	cfg.NVML = sharedGPU(&pid, 300*mib, other.Process.Pid, 51<<30)
	embed := model.Pod{Namespace: "batch", Name: "embed-7", Container: "embed"}
	cfg.Pod = func(p int, known model.Pod) model.Pod {
		if p == other.Process.Pid {
			return embed
		}
		return known
	}
	cfg.OOMProfile = func(p int, at time.Time) string { return fmt.Sprintf("/debug/pprof/gpu?pid=%d&at=failure", p) }

	var snap *model.GPUMemorySnapshot
	var failure bool
	signalled := false
	stop := func(s *model.Snapshot) bool {
		for _, p := range s.Processes {
			if int64(p.PID) != pid.Load() {
				continue
			}
			// The scenario fails once told to, after its runtime is hooked.
			if !signalled && len(p.CUDA.Libraries) > 0 {
				if err := syscall.Kill(p.PID, syscall.SIGUSR1); err != nil {
					t.Error(err)
				}
				signalled = true
			}
			if len(p.CUDA.Snapshots) > 0 {
				snap = p.CUDA.Snapshots[0]
			}
		}
		failure = slices.ContainsFunc(s.Findings, func(f model.Finding) bool { return f.Kind == model.KindGPUAllocFailure && f.PID == int(pid.Load()) })
		return snap != nil && failure
	}
	watchExec(t, cfg, &pid, []string{bin, rt, "oom", "30"}, 40*time.Second, stop)
	if snap == nil || !failure {
		t.Fatalf("snapshot %+v, gpu_alloc_failure found %v: want both (runtime hooked and signalled: %v)", snap, failure, signalled)
	}

	if snap.Why != model.SnapshotOutOfMemory || snap.LiveBytes != 164*mib {
		t.Errorf("snapshot why %q, live %d B; want out of memory, 164 MiB (4 x 16 MiB at oom_weights, 100 x 1 MiB at oom_activations)", snap.Why, snap.LiveBytes)
	}
	at := map[string]uint64{}
	for _, site := range snap.Sites {
		for _, fn := range []string{"oom_weights", "oom_activations"} {
			if slices.ContainsFunc(site.Stack, func(f model.Frame) bool { return f.Function == fn }) {
				at[fn] += site.Bytes
			}
		}
	}
	if at["oom_weights"] != 64*mib || at["oom_activations"] != 100*mib {
		t.Errorf("live at oom_weights %d B, at oom_activations %d B; want 64 MiB and 100 MiB", at["oom_weights"], at["oom_activations"])
	}
	if snap.NVMLUsedBytes == nil || *snap.NVMLUsedBytes != 300*mib || snap.GapBytes == nil || *snap.GapBytes != 136*mib {
		t.Errorf("NVML %v, gap %v; want 300 MiB and 136 MiB", snap.NVMLUsedBytes, snap.GapBytes)
	}
	if len(snap.Devices) != 1 {
		t.Fatalf("devices %+v, want the shared GPU", snap.Devices)
	}
	d := snap.Devices[0]
	if d.UUID != "GPU-shared" || d.MemoryUsedBytes != 79<<30 || len(d.Processes) != 2 {
		t.Fatalf("device %+v, want GPU-shared, 79 GiB used, two processes", d)
	}
	nb, me := d.Processes[0], d.Processes[1]
	if nb.PID != other.Process.Pid || nb.Comm != "sleep" || nb.UsedBytes != 51<<30 || nb.Pod != embed || nb.Watched || nb.Self {
		t.Errorf("neighbour %+v, want sleep, 51 GiB, pod batch/embed-7, not watched", nb)
	}
	if me.PID != int(pid.Load()) || !me.Self || !me.Watched || me.UsedBytes != 300*mib || me.LiveBytes == nil || *me.LiveBytes != 164*mib {
		t.Errorf("failing process %+v, want self, 300 MiB per NVML, 164 MiB live", me)
	}
	if len(snap.History) == 0 || !snap.History[len(snap.History)-1].Time.Equal(snap.Time) || snap.History[len(snap.History)-1].LiveBytes != 164*mib {
		t.Errorf("history %+v, want it to end at the failure with 164 MiB", snap.History)
	}
	if want := fmt.Sprintf("/debug/pprof/gpu?pid=%d&at=failure", pid.Load()); snap.Profile != want {
		t.Errorf("profile %q, want %q", snap.Profile, want)
	}
	t.Logf("snapshot at %v: %d MiB live, %d sites, %d history points; neighbour pid %d (%s) %d GiB", snap.Time, snap.LiveBytes/mib, len(snap.Sites),
		len(snap.History), nb.PID, nb.Comm, nb.UsedBytes>>30)
}
