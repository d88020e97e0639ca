package gpuxid

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/nvml"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// mockMachine mocks, with go-nvml's mock, two GPUs that report XIDs: GPU
// 0 with pids 100 and 200 on it, GPU 1 with pid 300 alone. Each event
// sent on the channel comes out of the event set's wait.
func mockMachine(events <-chan gonvml.EventData) (*mock.Interface, []*mock.Device) {
	procs := [][]gonvml.ProcessInfo{{{Pid: 100, UsedGpuMemory: 4 << 30}, {Pid: 200, UsedGpuMemory: 1 << 30}}, {{Pid: 300, UsedGpuMemory: 2 << 30}}}
	var devs []*mock.Device
	for i, uuid := range []string{"GPU-aaaa", "GPU-bbbb"} {
		devs = append(devs, &mock.Device{
			GetUUIDFunc: func() (string, gonvml.Return) { return uuid, gonvml.SUCCESS },
			GetNameFunc: func() (string, gonvml.Return) { return "NVIDIA H100 80GB HBM3", gonvml.SUCCESS },
			GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
				return gonvml.Memory{Total: 80 << 30, Used: 5 << 30, Free: 75 << 30}, gonvml.SUCCESS
			},
			GetUtilizationRatesFunc: func() (gonvml.Utilization, gonvml.Return) { return gonvml.Utilization{Gpu: 50}, gonvml.SUCCESS },
			GetProcessUtilizationFunc: func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
				return nil, gonvml.ERROR_NOT_FOUND
			},
			GetComputeRunningProcessesFunc:  func() ([]gonvml.ProcessInfo, gonvml.Return) { return procs[i], gonvml.SUCCESS },
			GetGraphicsRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.SUCCESS },
			GetMigModeFunc:                  func() (int, int, gonvml.Return) { return 0, 0, gonvml.ERROR_NOT_SUPPORTED },
			GetSupportedEventTypesFunc: func() (uint64, gonvml.Return) {
				return gonvml.EventTypeXidCriticalError, gonvml.SUCCESS
			},
			RegisterEventsFunc: func(uint64, gonvml.EventSet) gonvml.Return { return gonvml.SUCCESS },
		})
	}
	set := &mock.EventSet{
		WaitFunc: func(timeout uint32) (gonvml.EventData, gonvml.Return) {
			select {
			case e := <-events:
				return e, gonvml.SUCCESS
			// The fake's wait for an event: NVML's timeout, shortened.
			case <-time.After(time.Duration(timeout) * time.Millisecond / 50):
				return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() gonvml.Return { return gonvml.SUCCESS },
	}
	return &mock.Interface{
		InitFunc:                   func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:               func() gonvml.Return { return gonvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, gonvml.Return) { return len(devs), gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) { return devs[i], gonvml.SUCCESS },
		EventSetCreateFunc:         func() (gonvml.EventSet, gonvml.Return) { return set, gonvml.SUCCESS },
	}, devs
}

// From NVML's events (go-nvml's mock) through the sampler to findings, one
// XID of each class: a device's fault is critical on every process of its
// GPU, each finding listing them; an application's a warning, on the
// process alone on its GPU as on each of two; the cleanup after one info;
// an unknown XID a warning with its number. The counts take every XID,
// whatever its class.
func TestClassesFromNVML(t *testing.T) {
	events := make(chan gonvml.EventData, 16)
	lib, devs := mockMachine(events)
	s := nvml.New(lib)
	ctx, cancel := context.WithCancel(context.Background())
	defer s.Wait()
	defer cancel()
	if err := s.Start(ctx, nvml.MinInterval); err != nil {
		t.Fatal(err)
	}
	sent := []struct {
		dev int
		xid uint64
	}{{0, 79}, {0, 13}, {0, 157}, {1, 31}, {1, 45}}
	for _, e := range sent {
		events <- gonvml.EventData{Device: devs[e.dev], EventType: gonvml.EventTypeXidCriticalError, EventData: e.xid,
			GpuInstanceId: model.NoInstance, ComputeInstanceId: model.NoInstance}
	}
	testutil.Eventually(t, 10*time.Second, "the sampler counting every XID sent", func() bool {
		n := 0
		for _, c := range s.XIDCounts() {
			n += int(c)
		}
		return n == len(sent)
	})
	s.Roll()
	procs := []*model.Process{{PID: 100, Comm: "train"}, {PID: 200, Comm: "eval"}, {PID: 300, Comm: "serve"}}
	s.EnrichAll(procs)
	d := New(DefaultConfig())
	got := map[string]model.Finding{} // by "pid xid"
	for _, p := range procs {
		for _, f := range d.Observe(time.Now(), p) {
			got[fmt.Sprintf("%d %d", f.PID, f.Evidence.(model.GPUXIDEvidence).XID)] = f
		}
	}
	gpu0 := []model.DeviceProcess{{PID: 100, Comm: "train"}, {PID: 200, Comm: "eval"}}
	gpu1 := []model.DeviceProcess{{PID: 300, Comm: "serve"}}
	for _, w := range []struct {
		key, severity, class string
		procs                []model.DeviceProcess
		says                 string
	}{
		{"100 79", model.SeverityCritical, model.XIDDevice, gpu0, "a fault of the device, not of train: it affects all 2 processes on it"},
		{"200 79", model.SeverityCritical, model.XIDDevice, gpu0, "a fault of the device, not of eval"},
		{"100 13", model.SeverityWarning, model.XIDApplication, gpu0, "one of the 2 processes on the device caused it"},
		{"200 13", model.SeverityWarning, model.XIDApplication, gpu0, "one of the 2 processes on the device caused it"},
		{"100 157", model.SeverityWarning, model.XIDUnknown, gpu0, "XID 157 is not classified here"},
		{"200 157", model.SeverityWarning, model.XIDUnknown, gpu0, "GPU 0 (GPU-aaaa) reported XID 157 once"},
		{"300 31", model.SeverityWarning, model.XIDApplication, gpu1, "serve, alone on the device, caused it"},
		{"300 45", model.SeverityInfo, model.XIDApplication, gpu1, "informational"},
	} {
		f, ok := got[w.key]
		if !ok {
			t.Errorf("no finding %q (pid xid) among %v", w.key, slices.Sorted(maps.Keys(got)))
			continue
		}
		ev := f.Evidence.(model.GPUXIDEvidence)
		if f.Severity != w.severity || ev.Class != w.class || !slices.Equal(ev.Processes, w.procs) || !strings.Contains(f.Summary, w.says) {
			t.Errorf("%s: %s %s, processes %v, %q; want %s %s, %v, saying %q", w.key, f.Severity, ev.Class, ev.Processes, f.Summary,
				w.severity, w.class, w.procs, w.says)
		}
	}
	if len(got) != 8 {
		t.Errorf("%d findings, want 8 (each XID on each process of its GPU)", len(got))
	}
}
