package nvml

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

const gib = 1 << 30

// fakeGPU is one mocked device whose used memory a test may change while
// the sampler runs.
type fakeGPU struct {
	mu       sync.Mutex
	used     uint64
	util     uint32
	memUtil  uint32
	utilRet  gonvml.Return
	compute  []gonvml.ProcessInfo
	graphics []gonvml.ProcessInfo
	// Per-process utilization samples, as NVML keeps them: each read
	// returns those newer than the timestamp asked for (asked records it).
	samples []gonvml.ProcessUtilizationSample
	sampRet gonvml.Return
	asked   []uint64
}

func (f *fakeGPU) setUsed(b uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.used = b
}

func (f *fakeGPU) device(uuid string) *mock.Device {
	return &mock.Device{
		GetUUIDFunc: func() (string, gonvml.Return) { return uuid, gonvml.SUCCESS },
		GetNameFunc: func() (string, gonvml.Return) { return "NVIDIA H100 80GB HBM3", gonvml.SUCCESS },
		GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return gonvml.Memory{Total: 80 * gib, Used: f.used, Free: 80*gib - f.used}, gonvml.SUCCESS
		},
		GetUtilizationRatesFunc: func() (gonvml.Utilization, gonvml.Return) {
			return gonvml.Utilization{Gpu: f.util, Memory: f.memUtil}, f.utilRet
		},
		GetProcessUtilizationFunc: func(since uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.asked = append(f.asked, since)
			if f.sampRet != gonvml.SUCCESS {
				return nil, f.sampRet
			}
			var out []gonvml.ProcessUtilizationSample
			for _, x := range f.samples {
				if x.TimeStamp > since {
					out = append(out, x)
				}
			}
			if len(out) == 0 {
				return nil, gonvml.ERROR_NOT_FOUND
			}
			return out, gonvml.SUCCESS
		},
		GetComputeRunningProcessesFunc:  func() ([]gonvml.ProcessInfo, gonvml.Return) { return f.compute, gonvml.SUCCESS },
		GetGraphicsRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) { return f.graphics, gonvml.SUCCESS },
		// A GPU without MIG, as most are.
		GetMigModeFunc: func() (int, int, gonvml.Return) { return 0, 0, gonvml.ERROR_NOT_SUPPORTED },
	}
}

// twoGPUs mocks a machine with two devices: pid 100 on both (and with a
// graphics context too on the first), pid 200 on the first, pid 300 listed
// without a memory figure on the second.
func twoGPUs() (*mock.Interface, []*fakeGPU) {
	fakes := []*fakeGPU{
		{
			used: 10 * gib, util: 45, utilRet: gonvml.SUCCESS,
			compute:  []gonvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 4 * gib}, {Pid: 200, UsedGpuMemory: 1 * gib}},
			graphics: []gonvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 4 * gib}},
		},
		{
			used: 3 * gib, utilRet: gonvml.ERROR_NOT_SUPPORTED, sampRet: gonvml.ERROR_NOT_SUPPORTED, // as on a MIG device
			compute: []gonvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 2 * gib}, {Pid: 300, UsedGpuMemory: notAvailable}},
		},
	}
	devs := []gonvml.Device{fakes[0].device("GPU-aaaa"), fakes[1].device("GPU-bbbb")}
	lib := &mock.Interface{
		InitFunc:           func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:       func() gonvml.Return { return gonvml.SUCCESS },
		DeviceGetCountFunc: func() (int, gonvml.Return) { return len(devs), gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) {
			return devs[i], gonvml.SUCCESS
		},
		SystemGetDriverVersionFunc: func() (string, gonvml.Return) { return "550.54.15", gonvml.SUCCESS },
		EventSetCreateFunc:         func() (gonvml.EventSet, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED },
	}
	return lib, fakes
}

func TestSamplerTwoDevices(t *testing.T) {
	lib, fakes := twoGPUs()
	s := New(lib)
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx, MinInterval); err != nil {
		t.Fatal(err)
	}

	gpus := s.GPUs()
	if len(gpus) != 2 {
		t.Fatalf("GPUs() = %d devices, want 2", len(gpus))
	}
	want0 := model.GPU{Index: 0, UUID: "GPU-aaaa", Name: "NVIDIA H100 80GB HBM3", MemoryUsed: 10 * gib, MemoryTotal: 80 * gib, Utilization: 0.45}
	g := gpus[0]
	if g.Index != want0.Index || g.UUID != want0.UUID || g.Name != want0.Name || g.MemoryUsed != want0.MemoryUsed ||
		g.MemoryTotal != want0.MemoryTotal || g.Utilization != want0.Utilization {
		t.Errorf("GPU 0 = %+v, want %+v", g, want0)
	}
	if g.Processes[100] != 4*gib || g.Processes[200] != 1*gib || len(g.Processes) != 2 {
		t.Errorf("GPU 0 processes = %v, want 100: 4 GiB (counted once), 200: 1 GiB", g.Processes)
	}
	if g := gpus[1]; g.UUID != "GPU-bbbb" || g.MemoryUsed != 3*gib || g.Utilization != 0 || len(g.Processes) != 1 {
		t.Errorf("GPU 1 = %+v, want GPU-bbbb, 3 GiB used, no utilization, pid 300 left out", g)
	}

	for _, c := range []struct {
		pid  int
		want uint64
		ok   bool
	}{{100, 6 * gib, true}, {200, 1 * gib, true}, {300, 0, false}, {400, 0, false}} {
		if r, ok := s.ProcessMemory(c.pid); r.Last != c.want || ok != c.ok {
			t.Errorf("ProcessMemory(%d) = %+v, %v; want last %d, %v", c.pid, r, ok, c.want, c.ok)
		}
	}

	// The copy handed out is the caller's.
	gpus[0].Processes[100] = 0
	if s.GPUs()[0].Processes[100] != 4*gib {
		t.Error("GPUs() shares its maps with the sampler")
	}

	// The loop keeps sampling; a Roll shows what it sampled.
	fakes[1].setUsed(5 * gib)
	testutil.Eventually(t, 10*time.Second, "a later sample to show the new memory figure", func() bool {
		s.Roll()
		return s.GPUs()[1].MemoryUsed == 5*gib
	})

	cancel()
	s.Wait()
	if n := len(lib.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times after ctx done, want 1", n)
	}
}

// A window reports the least, the most and the last of its samples; the
// next starts from the last, which holds until a new sample.
func TestWindow(t *testing.T) {
	lib, fakes := twoGPUs()
	fakes[0].graphics = nil // its figure would hide the compute one's
	s := New(lib)
	for _, used := range []uint64{2, 7, 3} {
		fakes[0].setUsed(used * gib)
		fakes[0].compute[0].UsedGpuMemory = used * gib // pid 100
		if err := s.sample(); err != nil {
			t.Fatal(err)
		}
	}
	s.Roll()
	check := func(when string, lo, hi, last uint64) {
		t.Helper()
		g := s.GPUs()[0]
		if g.MemoryUsedMin != lo*gib || g.MemoryUsedMax != hi*gib || g.MemoryUsed != last*gib {
			t.Errorf("%s: GPU 0 used min %d max %d last %d, want %d %d %d GiB", when, g.MemoryUsedMin, g.MemoryUsedMax, g.MemoryUsed, lo, hi, last)
		}
		// pid 100 also has 2 GiB on the second device, unchanged.
		want := Range{(lo + 2) * gib, (hi + 2) * gib, (last + 2) * gib}
		if r, ok := s.ProcessMemory(100); !ok || r != want {
			t.Errorf("%s: pid 100 = %+v, %v; want %+v", when, r, ok, want)
		}
	}
	check("three samples", 2, 7, 3)
	s.Roll()
	check("no sample since", 3, 3, 3)
	fakes[0].setUsed(1 * gib)
	fakes[0].compute[0].UsedGpuMemory = 1 * gib
	if err := s.sample(); err != nil {
		t.Fatal(err)
	}
	check("before the roll", 3, 3, 3)
	s.Roll()
	check("one lower sample", 1, 3, 1)

	// A process that leaves the GPU is not reported by the next window.
	fakes[0].compute = fakes[0].compute[1:]
	fakes[1].compute = fakes[1].compute[1:]
	if err := s.sample(); err != nil {
		t.Fatal(err)
	}
	s.Roll()
	if r, ok := s.ProcessMemory(100); ok {
		t.Errorf("pid 100 gone from the GPUs: ProcessMemory = %+v, true", r)
	}
}

func TestJoin(t *testing.T) {
	lib, _ := twoGPUs()
	s := New(lib)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); s.Wait() }()
	if err := s.Start(ctx, time.Second); err != nil {
		t.Fatal(err)
	}

	// pid 100: 6 GiB on the GPUs, 5.5 GiB seen by the hooks.
	p := &model.Process{PID: 100, CUDA: model.CUDAStats{LiveBytes: 5*gib + gib/2}}
	used, ok := s.ProcessMemory(p.PID)
	Join(p, used, ok)
	if !p.CUDA.HasNVML || p.CUDA.NVMLUsedBytes != 6*gib || p.CUDA.UntrackedBytes != gib/2 ||
		p.CUDA.NVMLMinBytes != 6*gib || p.CUDA.NVMLMaxBytes != 6*gib {
		t.Errorf("join pid 100: %+v, want NVML 6 GiB (min and max too), untracked 0.5 GiB", p.CUDA)
	}

	// The hooks may see more than NVML reports (freed memory the caching
	// allocator already returned): untracked goes negative, not wrapping.
	p = &model.Process{PID: 200, CUDA: model.CUDAStats{LiveBytes: 2 * gib}}
	used, ok = s.ProcessMemory(p.PID)
	Join(p, used, ok)
	if !p.CUDA.HasNVML || p.CUDA.UntrackedBytes != -gib {
		t.Errorf("join pid 200: %+v, want untracked -1 GiB", p.CUDA)
	}

	// A process NVML does not list has no NVML figure, even if a stale one
	// was set before.
	p = &model.Process{PID: 400, CUDA: model.CUDAStats{LiveBytes: gib, NVMLUsedBytes: 3, HasNVML: true, UntrackedBytes: 7}}
	used, ok = s.ProcessMemory(p.PID)
	Join(p, used, ok)
	if p.CUDA.HasNVML || p.CUDA.NVMLUsedBytes != 0 || p.CUDA.UntrackedBytes != 0 {
		t.Errorf("join pid 400 (not on any GPU): %+v, want no NVML figures", p.CUDA)
	}
}

func TestInitFailure(t *testing.T) {
	for _, c := range []struct {
		ret    gonvml.Return
		reason string
		noLib  bool // the error is ErrNoLibrary: NVML not there, rather than failing
	}{
		{gonvml.ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1 not found", true},
		{gonvml.ERROR_DRIVER_NOT_LOADED, "driver is not loaded", false},
	} {
		// Only Init is mocked: any other call would panic.
		lib := &mock.Interface{InitFunc: func() gonvml.Return { return c.ret }}
		s := New(lib)
		err := s.Start(context.Background(), DefaultInterval)
		if err == nil {
			t.Fatalf("%v: Start succeeded", c.ret)
		}
		msg := err.Error()
		if !errors.Is(err, ErrUnavailable) || !strings.HasPrefix(msg, "NVML unavailable: ") ||
			!strings.Contains(msg, c.reason) || !strings.HasSuffix(msg, "; GPU metrics off") {
			t.Errorf("%v: error %q, want NVML unavailable: ...%s...; GPU metrics off", c.ret, msg, c.reason)
		}
		if errors.Is(err, ErrNoLibrary) != c.noLib {
			t.Errorf("%v: errors.Is(err, ErrNoLibrary) = %v, want %v", c.ret, !c.noLib, c.noLib)
		}
		if s.GPUs() != nil {
			t.Errorf("%v: GPUs() = %v after failed Start, want nil", c.ret, s.GPUs())
		}
		if _, ok := s.ProcessMemory(100); ok {
			t.Errorf("%v: ProcessMemory reports a process after failed Start", c.ret)
		}
		if _, err := Probe(lib); err == nil || !strings.Contains(err.Error(), c.reason) {
			t.Errorf("%v: Probe error %v, want the same reason", c.ret, err)
		}
	}
}

func TestFirstSampleFailure(t *testing.T) {
	lib := &mock.Interface{
		InitFunc:           func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:       func() gonvml.Return { return gonvml.SUCCESS },
		DeviceGetCountFunc: func() (int, gonvml.Return) { return 0, gonvml.ERROR_GPU_IS_LOST },
	}
	err := New(lib).Start(context.Background(), DefaultInterval)
	if err == nil || !strings.Contains(err.Error(), "NVML") {
		t.Fatalf("Start = %v, want an NVML error", err)
	}
	if n := len(lib.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times after a failed first sample, want 1", n)
	}
}

func TestIntervalMinimum(t *testing.T) {
	lib := &mock.Interface{} // Init must not be reached
	if err := New(lib).Start(context.Background(), 5*time.Millisecond); err == nil || !strings.Contains(err.Error(), "minimum 10ms") {
		t.Fatalf("Start(5ms) = %v, want a minimum-interval error", err)
	}
}

func TestProbe(t *testing.T) {
	lib, fakes := twoGPUs()
	devs := []*mock.Device{fakes[0].device("GPU-aaaa"), fakes[1].device("GPU-bbbb")}
	devs[0].GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) {
		return gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError | gonvml.EventTypePState | 1<<5, gonvml.SUCCESS
	}
	devs[1].GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	lib.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) { return devs[i], gonvml.SUCCESS }
	got, err := Probe(lib)
	if err != nil {
		t.Fatal(err)
	}
	if want := "driver 550.54.15, 2 devices; GPU 0: per-process utilization, events xid double_bit_ecc pstate; " +
		"GPU 1: no utilization (per process: ERROR_NOT_SUPPORTED, device: ERROR_NOT_SUPPORTED), no events (ERROR_NOT_SUPPORTED)"; got != want {
		t.Errorf("Probe = %q, want %q", got, want)
	}
	if n := len(lib.ShutdownCalls()); n != 1 {
		t.Errorf("Probe left NVML initialized (%d shutdowns)", n)
	}
}

// TestRealLibrary runs the sampler on this machine's NVML: without a driver
// the error must say so; with one the devices must show.
func TestRealLibrary(t *testing.T) {
	s := New(gonvml.New())
	ctx, cancel := context.WithCancel(context.Background())
	err := s.Start(ctx, DefaultInterval)
	if err != nil {
		cancel()
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "NVML unavailable") {
			t.Fatalf("Start without a usable NVML: %v, want an NVML unavailable error", err)
		}
		t.Logf("no NVML here: %v", err)
		return
	}
	gpus := s.GPUs()
	cancel()
	s.Wait()
	if len(gpus) == 0 {
		t.Fatal("NVML initialized but reports no GPU")
	}
	for _, g := range gpus {
		if g.MemoryTotal == 0 || g.UUID == "" {
			t.Errorf("GPU %d: %+v, want a UUID and total memory", g.Index, g)
		}
	}
}

// enriched returns the CUDA part of each of procs after s enriched them.
func enriched(s *Sampler, procs ...*model.Process) []model.CUDAStats {
	s.EnrichAll(procs)
	var out []model.CUDAStats
	for _, p := range procs {
		out = append(out, p.CUDA)
	}
	return out
}

// pidsOf says which processes a fault lists, "pid comm" each.
func pidsOf(e model.GPUEvent) (out []string) {
	for _, p := range e.Processes {
		out = append(out, fmt.Sprintf("%d %s", p.PID, p.Comm))
	}
	return out
}

func TestEnrich(t *testing.T) {
	lib, _ := twoGPUs()
	s := New(lib)
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	got := enriched(s, &model.Process{PID: 100, CUDA: model.CUDAStats{LiveBytes: 5 * gib}})
	cancel()
	s.Wait()
	if len(got) != 1 || !got[0].HasNVML || got[0].UntrackedBytes != gib {
		t.Errorf("enriched %+v, want NVML joined: untracked 1 GiB", got)
	}

	// Without NVML there are no NVML figures, and Wait does not block.
	failed := New(&mock.Interface{InitFunc: func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }})
	if err := failed.Start(context.Background(), time.Second); err == nil {
		t.Fatal("Start succeeded")
	}
	failed.Wait()
	if got := enriched(failed, &model.Process{PID: 100, CUDA: model.CUDAStats{LiveBytes: gib, HasNVML: true}}); got[0].HasNVML {
		t.Errorf("enriched %+v without NVML", got)
	}
}

func t0() time.Time { return time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC) }

// Per-process utilization is the mean, over a window, of the readings
// that found new samples: the samples NVML took since the previous
// reading, 0 for a process listed on the device without one. A device without per-process
// samples (vGPU) lends its own figure to each process on it, and says so;
// one without either (MIG) gives none.
func TestProcessUtilization(t *testing.T) {
	busy := &fakeGPU{used: gib, util: 70, memUtil: 20,
		compute: []gonvml.ProcessInfo{{Pid: 100, UsedGpuMemory: gib}, {Pid: 200, UsedGpuMemory: gib}},
		samples: []gonvml.ProcessUtilizationSample{{Pid: 100, TimeStamp: 10, SmUtil: 80, MemUtil: 30}, {Pid: 100, TimeStamp: 20, SmUtil: 60, MemUtil: 10}}}
	vgpu := &fakeGPU{used: gib, util: 40, memUtil: 5, sampRet: gonvml.ERROR_NOT_SUPPORTED,
		compute: []gonvml.ProcessInfo{{Pid: 100, UsedGpuMemory: gib}}}
	mig := &fakeGPU{used: gib, utilRet: gonvml.ERROR_NOT_SUPPORTED, sampRet: gonvml.ERROR_NOT_SUPPORTED,
		compute: []gonvml.ProcessInfo{{Pid: 300, UsedGpuMemory: gib}}}
	devs := []gonvml.Device{busy.device("GPU-busy"), vgpu.device("GPU-vgpu"), mig.device("MIG-aaaa")}
	lib := &mock.Interface{
		DeviceGetCountFunc:         func() (int, gonvml.Return) { return len(devs), gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) { return devs[i], gonvml.SUCCESS },
	}
	s := New(lib)
	if err := s.sample(); err != nil {
		t.Fatal(err)
	}
	busy.mu.Lock()
	busy.samples = append(busy.samples, gonvml.ProcessUtilizationSample{Pid: 100, TimeStamp: 30, SmUtil: 10, MemUtil: 0})
	busy.mu.Unlock()
	// The third read finds no new sample: no reading, not a 0.
	for range 2 {
		if err := s.sample(); err != nil {
			t.Fatal(err)
		}
	}
	s.Roll()
	if !slices.Equal(busy.asked, []uint64{0, 20, 30}) {
		t.Errorf("samples asked since %v, want 0, 20, 30", busy.asked)
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	u := s.Utilization(100)
	if len(u) != 2 || u[0].Device != 0 || u[0].UUID != "GPU-busy" || u[0].Source != model.UtilProcess || !near(u[0].SM, 0.40) || !near(u[0].Memory, 0.10) {
		t.Errorf("pid 100 on GPU 0: %+v; want SM 0.40 ((70+10)/2 %%), memory 0.10, from its own samples", u)
	}
	if len(u) == 2 && (u[1].Device != 1 || u[1].Source != model.UtilDevice || !near(u[1].SM, 0.40) || !near(u[1].Memory, 0.05)) {
		t.Errorf("pid 100 on GPU 1: %+v; want the device's 0.40 and 0.05, said to be the device's", u[1])
	}
	if u := s.Utilization(200); len(u) != 1 || u[0].SM != 0 || u[0].Source != model.UtilProcess {
		t.Errorf("pid 200, listed without a sample: %+v; want 0 on GPU 0", u)
	}
	if u := s.Utilization(300); len(u) != 0 {
		t.Errorf("pid 300 on a device with no utilization at all: %+v", u)
	}
	g := s.GPUs()
	if !g[0].PerProcessUtil || g[1].PerProcessUtil || g[2].PerProcessUtil || !near(g[0].MemoryUtilization, 0.20) {
		t.Errorf("devices: %+v", g)
	}
	// The next window starts empty.
	s.Roll()
	if u := s.Utilization(100); len(u) != 0 {
		t.Errorf("a window without samples: %+v", u)
	}
}

// Events come from an event set with, on every device, each watched type
// it reports. Each is counted by device and kind, an XID also by number;
// the faults (XID, double-bit ECC) are kept for the window they came in
// and handed with the process to the detectors only when the process uses
// that device; changes of state only counted, however many, never crowd
// a fault out of the window. The event goroutine frees its set before
// NVML is shut down.
func TestEvents(t *testing.T) {
	lib, fakes := twoGPUs()
	events := make(chan gonvml.EventData, 2*maxWindowEvents)
	var freed, shutdown time.Time
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
		FreeFunc: func() gonvml.Return { freed = time.Now(); return gonvml.SUCCESS },
	}
	lib.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return set, gonvml.SUCCESS }
	lib.ShutdownFunc = func() gonvml.Return { shutdown = time.Now(); return gonvml.SUCCESS }
	devs := []*mock.Device{fakes[0].device("GPU-aaaa"), fakes[1].device("GPU-bbbb")}
	supported := []uint64{
		// 1<<5 is no type NVML defines: not asked for.
		gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError | gonvml.EventTypeSingleBitEccError |
			gonvml.EventTypePState | gonvml.EventTypeClock | gonvml.EventMigConfigChange | 1<<5,
		gonvml.EventTypeXidCriticalError | gonvml.EventTypeSingleBitEccError,
	}
	registered := make([]uint64, 2)
	for i, d := range devs {
		d.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) { return supported[i], gonvml.SUCCESS }
		d.RegisterEventsFunc = func(types uint64, _ gonvml.EventSet) gonvml.Return { registered[i] = types; return gonvml.SUCCESS }
	}
	lib.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) { return devs[i], gonvml.SUCCESS }
	s := New(lib)
	ctx, cancel := context.WithCancel(context.Background())
	if err := s.Start(ctx, MinInterval); err != nil {
		t.Fatal(err)
	}
	if want := supported[0] &^ (1 << 5); registered[0] != want || registered[1] != supported[1] {
		t.Errorf("registered %#x, want %#x and %#x: every watched type each device reports", registered, want, supported[1])
	}
	noMIG := func(d *mock.Device, typ uint64, data uint64) gonvml.EventData {
		return gonvml.EventData{Device: d, EventType: typ, EventData: data, GpuInstanceId: model.NoInstance, ComputeInstanceId: model.NoInstance}
	}
	// A GPU going busy and idle: pstate changes past the window's bound.
	for range maxWindowEvents + 10 {
		events <- noMIG(devs[0], gonvml.EventTypePState, 0)
	}
	events <- noMIG(devs[0], gonvml.EventTypeClock, 0)
	events <- noMIG(devs[0], gonvml.EventTypeSingleBitEccError, 0)
	events <- noMIG(devs[0], gonvml.EventTypeDoubleBitEccError, 0)
	events <- noMIG(devs[1], gonvml.EventTypeXidCriticalError, 79)
	events <- noMIG(devs[1], gonvml.EventTypeXidCriticalError, 79)
	want := map[model.GPUEventKey]uint64{
		{Device: 0, UUID: "GPU-aaaa", Kind: model.GPUEventPState}:       maxWindowEvents + 10,
		{Device: 0, UUID: "GPU-aaaa", Kind: model.GPUEventClock}:        1,
		{Device: 0, UUID: "GPU-aaaa", Kind: model.GPUEventSingleBitECC}: 1,
		{Device: 0, UUID: "GPU-aaaa", Kind: model.GPUEventDoubleBitECC}: 1,
		{Device: 1, UUID: "GPU-bbbb", Kind: model.GPUEventXID}:          2,
	}
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("event counts %v", want), func() bool { return maps.Equal(s.EventCounts(), want) })
	if got := s.XIDCounts(); len(got) != 1 || got[model.XIDKey{Device: 1, UUID: "GPU-bbbb", XID: 79}] != 2 {
		t.Errorf("XID counts %v, want XID 79 twice on GPU 1", got)
	}
	s.Roll()
	ev := s.Events()
	if len(ev) != 3 || ev[0].Kind != model.GPUEventDoubleBitECC || ev[0].Device != 0 || ev[0].XID != 0 ||
		ev[1].Kind != model.GPUEventXID || ev[1].Device != 1 || ev[1].UUID != "GPU-bbbb" || ev[1].XID != 79 {
		t.Errorf("window events %+v, want the double-bit ECC error and the two XIDs alone", ev)
	}
	// pid 100 uses both devices (NVML lists it on the second); pid 200
	// only the first, with its ECC error. Each fault lists the processes
	// on its device, named when watched (pid 200 is not enriched here; pid
	// 300, listed without a memory figure, counts nowhere, as for the
	// faults it gets).
	got := enriched(s, &model.Process{PID: 100, Comm: "train"})
	if len(got[0].GPUEvents) != 3 {
		t.Fatalf("events joined: pid 100 %+v", got[0].GPUEvents)
	}
	if ps := pidsOf(got[0].GPUEvents[0]); !slices.Equal(ps, []string{"100 train", "200 "}) {
		t.Errorf("processes of GPU 0's fault: %q", ps)
	}
	if ps := pidsOf(got[0].GPUEvents[2]); !slices.Equal(ps, []string{"100 train"}) {
		t.Errorf("processes of GPU 1's XID: %q", ps)
	}
	got = enriched(s, &model.Process{PID: 100, Comm: "train"}, &model.Process{PID: 200, Comm: "serve"})
	if len(got[0].GPUEvents) != 3 || len(got[1].GPUEvents) != 1 || got[1].GPUEvents[0].Kind != model.GPUEventDoubleBitECC {
		t.Errorf("events joined: pid 100 %+v, pid 200 %+v", got[0].GPUEvents, got[1].GPUEvents)
	}
	if ps := pidsOf(got[1].GPUEvents[0]); !slices.Equal(ps, []string{"100 train", "200 serve"}) {
		t.Errorf("processes of GPU 0's fault, both enriched: %q", ps)
	}
	if ps := pidsOf(s.Events()[1]); !slices.Equal(ps, []string{"100 "}) {
		t.Errorf("the window's own events were named: %q", ps)
	}
	s.Roll()
	if ev := s.Events(); len(ev) != 0 {
		t.Errorf("a window without events: %+v", ev)
	}
	cancel()
	s.Wait()
	if freed.IsZero() || shutdown.Before(freed) {
		t.Errorf("event set freed at %v, NVML shut down at %v: want freed first", freed, shutdown)
	}
}

// A device that claims types it then fails to register still has its
// XIDs watched; one that fails even those, nothing.
func TestEventsRegistrationFallback(t *testing.T) {
	lib, fakes := twoGPUs()
	set := &mock.EventSet{
		WaitFunc: func(timeout uint32) (gonvml.EventData, gonvml.Return) {
			// The fake's wait for an event that never comes (pacing, not
			// the test waiting).
			time.Sleep(time.Millisecond)
			return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
		},
		FreeFunc: func() gonvml.Return { return gonvml.SUCCESS },
	}
	lib.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return set, gonvml.SUCCESS }
	devs := []*mock.Device{fakes[0].device("GPU-aaaa"), fakes[1].device("GPU-bbbb")}
	var mu sync.Mutex
	asked := make([][]uint64, 2)
	for i, d := range devs {
		d.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) {
			return gonvml.EventTypeXidCriticalError | gonvml.EventTypePState, gonvml.SUCCESS
		}
		d.RegisterEventsFunc = func(types uint64, _ gonvml.EventSet) gonvml.Return {
			mu.Lock()
			defer mu.Unlock()
			asked[i] = append(asked[i], types)
			if i == 0 && types == gonvml.EventTypeXidCriticalError {
				return gonvml.SUCCESS
			}
			return gonvml.ERROR_NO_PERMISSION
		}
	}
	lib.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) { return devs[i], gonvml.SUCCESS }
	s := New(lib)
	ctx, cancel := context.WithCancel(context.Background())
	s.watchEvents(ctx)
	cancel()
	s.events.Wait()
	all := uint64(gonvml.EventTypeXidCriticalError | gonvml.EventTypePState)
	for i, want := range [][]uint64{{all, gonvml.EventTypeXidCriticalError}, {all, gonvml.EventTypeXidCriticalError}} {
		if !slices.Equal(asked[i], want) {
			t.Errorf("GPU %d: registered %#x, want %#x", i, asked[i], want)
		}
	}
}

// migMachine mocks three GPUs. GPU 0 is in MIG mode with MIG devices in
// slots 0 and 3 of 7 (GPU instances 1 and 5): pid 100 on the second, pid
// 300 on both; the parent's own list adds them up, as NVML's does for
// root. GPUs 1 and 2 are whole, with pid 200 on both. MIG device 0 reports
// no utilization, MIG device 3 only its own; GPU 1 keeps per-process
// samples, GPU 2 does not.
func migMachine() (*mock.Interface, []*mock.Device) {
	parent := &fakeGPU{used: 12 * gib, utilRet: gonvml.ERROR_NOT_SUPPORTED, sampRet: gonvml.ERROR_NOT_SUPPORTED,
		compute: []gonvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 5 * gib}, {Pid: 300, UsedGpuMemory: 2 * gib}}}
	mig0 := &fakeGPU{used: 1 * gib, utilRet: gonvml.ERROR_NOT_SUPPORTED, sampRet: gonvml.ERROR_NOT_SUPPORTED,
		compute: []gonvml.ProcessInfo{{Pid: 300, UsedGpuMemory: 1 * gib}}}
	mig3 := &fakeGPU{used: 6 * gib, util: 30, memUtil: 10, utilRet: gonvml.SUCCESS, sampRet: gonvml.ERROR_NOT_SUPPORTED,
		compute: []gonvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 5 * gib}, {Pid: 300, UsedGpuMemory: 1 * gib}}}
	gpu1 := &fakeGPU{used: 2 * gib, util: 50, utilRet: gonvml.SUCCESS,
		compute: []gonvml.ProcessInfo{{Pid: 200, UsedGpuMemory: 2 * gib}},
		samples: []gonvml.ProcessUtilizationSample{{Pid: 200, TimeStamp: 10, SmUtil: 40, MemUtil: 20}}}
	gpu2 := &fakeGPU{used: 3 * gib, util: 60, memUtil: 30, utilRet: gonvml.SUCCESS, sampRet: gonvml.ERROR_NOT_SUPPORTED,
		compute: []gonvml.ProcessInfo{{Pid: 200, UsedGpuMemory: 3 * gib}}}
	migs := map[int]*mock.Device{0: mig0.device("MIG-0000"), 3: mig3.device("MIG-3333")}
	migs[0].GetGpuInstanceIdFunc = func() (int, gonvml.Return) { return 1, gonvml.SUCCESS }
	migs[3].GetGpuInstanceIdFunc = func() (int, gonvml.Return) { return 5, gonvml.SUCCESS }
	devs := []*mock.Device{parent.device("GPU-aaaa"), gpu1.device("GPU-bbbb"), gpu2.device("GPU-cccc")}
	devs[0].GetMigModeFunc = func() (int, int, gonvml.Return) {
		return gonvml.DEVICE_MIG_ENABLE, gonvml.DEVICE_MIG_ENABLE, gonvml.SUCCESS
	}
	devs[0].GetMaxMigDeviceCountFunc = func() (int, gonvml.Return) { return 7, gonvml.SUCCESS }
	devs[0].GetMigDeviceHandleByIndexFunc = func(j int) (gonvml.Device, gonvml.Return) {
		if m, ok := migs[j]; ok {
			return m, gonvml.SUCCESS
		}
		return nil, gonvml.ERROR_NOT_FOUND
	}
	// A GPU in MIG mode registers events; its instances have none of
	// their own.
	devs[0].GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) {
		return gonvml.EventTypeXidCriticalError | gonvml.EventMigConfigChange, gonvml.SUCCESS
	}
	for _, d := range devs[1:] {
		d.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) { return gonvml.EventTypeXidCriticalError, gonvml.SUCCESS }
	}
	lib := &mock.Interface{
		InitFunc:                   func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:               func() gonvml.Return { return gonvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, gonvml.Return) { return len(devs), gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) { return devs[i], gonvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, gonvml.Return) { return "550.54.15", gonvml.SUCCESS },
	}
	return lib, devs
}

// Each MIG instance is a device of its own, labelled by its parent and
// its slot; the parent in MIG mode lists no process, so none counts twice.
// A process on two devices, GPUs or MIG instances, has its memory summed
// and its utilization on each.
func TestMIG(t *testing.T) {
	lib, _ := migMachine()
	s := New(lib)
	if err := s.sample(); err != nil {
		t.Fatal(err)
	}
	s.Roll()
	gpus := s.GPUs()
	var labels []string
	for _, g := range gpus {
		labels = append(labels, g.Label())
	}
	if want := []string{"0", "0/mig0", "0/mig3", "1", "2"}; !slices.Equal(labels, want) {
		t.Fatalf("devices %v, want %v", labels, want)
	}
	if g := gpus[0]; g.MIG != nil || g.UUID != "GPU-aaaa" || g.MemoryUsed != 12*gib || len(g.Processes) != 0 {
		t.Errorf("GPU 0 in MIG mode: %+v; want its memory and no process", g)
	}
	if g := gpus[2]; g.Index != 0 || g.MIG == nil || *g.MIG != 3 || g.UUID != "MIG-3333" || g.GPUInstance != 5 ||
		g.MemoryUsed != 6*gib || g.Processes[100] != 5*gib || g.Processes[300] != 1*gib || g.PerProcessUtil {
		t.Errorf("MIG device 0/mig3: %+v", g)
	}
	for _, c := range []struct {
		pid  int
		want uint64
	}{{100, 5 * gib}, {200, 5 * gib}, {300, 2 * gib}} {
		if r, ok := s.ProcessMemory(c.pid); !ok || r != (Range{c.want, c.want, c.want}) {
			t.Errorf("ProcessMemory(%d) = %+v, %v; want %d GiB", c.pid, r, ok, c.want/gib)
		}
	}
	// MIG device 3 lends its own figure, said to be the device's; MIG
	// device 0 has none to lend.
	label := func(us []model.GPUUtil) (out []string) {
		for _, u := range us {
			out = append(out, u.Label()+" "+u.Source+" "+u.UUID)
		}
		return out
	}
	if u := s.Utilization(100); len(u) != 1 || u[0].SM != 0.3 || u[0].Memory != 0.1 ||
		!slices.Equal(label(u), []string{"0/mig3 device MIG-3333"}) {
		t.Errorf("pid 100 on MIG device 3: %+v", u)
	}
	if u := s.Utilization(300); !slices.Equal(label(u), []string{"0/mig3 device MIG-3333"}) {
		t.Errorf("pid 300 on MIG devices 0 and 3: %v", label(u))
	}
	if u := s.Utilization(200); !slices.Equal(label(u), []string{"1 process GPU-bbbb", "2 device GPU-cccc"}) ||
		u[0].SM != 0.4 || u[1].SM != 0.6 {
		t.Errorf("pid 200 on GPUs 1 and 2: %+v", u)
	}

	// A fault pinned to a GPU instance goes to the processes on it; one of
	// the whole GPU to every process on any of its instances.
	mig := func(dev int, xid uint64, gi uint32) model.GPUEvent {
		return model.GPUEvent{Device: dev, UUID: "GPU", Kind: model.GPUEventXID, XID: xid, GPUInstance: gi, ComputeInstance: 0}
	}
	s.record(mig(0, 31, 5), true)
	s.record(mig(0, 13, 1), true)
	s.record(mig(0, 79, model.NoInstance), true)
	s.record(mig(1, 48, model.NoInstance), true)
	s.Roll()
	got := enriched(s, &model.Process{PID: 100}, &model.Process{PID: 200}, &model.Process{PID: 300})
	xids := func(es []model.GPUEvent) (out []uint64) {
		for _, e := range es {
			out = append(out, e.XID)
		}
		return out
	}
	for i, want := range [][]uint64{{31, 79}, {48}, {31, 13, 79}} {
		if got := xids(got[i].GPUEvents); !slices.Equal(got, want) {
			t.Errorf("pid %d: XIDs %v, want %v", []int{100, 200, 300}[i], got, want)
		}
	}
	// Each fault lists the processes it concerns: those of its instance,
	// or of any instance for one of the whole GPU.
	for i, want := range [][]string{{"100 ", "300 "}, {"300 "}, {"100 ", "300 "}, {"200 "}} {
		if got := pidsOf(s.Events()[i]); !slices.Equal(got, want) {
			t.Errorf("XID %d: processes %q, want %q", s.Events()[i].XID, got, want)
		}
	}
}

// check says, for a GPU in MIG mode, what each instance reports.
func TestProbeMIG(t *testing.T) {
	lib, _ := migMachine()
	got, err := Probe(lib)
	if err != nil {
		t.Fatal(err)
	}
	// How an error reads depends on whether a real libnvidia-ml is there
	// to name it.
	ns := gonvml.ERROR_NOT_SUPPORTED.Error()
	want := "driver 550.54.15, 3 devices; GPU 0: MIG mode, 2 instances, events xid mig_config_change; " +
		"GPU 0/mig0: no utilization (per process: " + ns + ", device: " + ns + "); " +
		"GPU 0/mig3: device utilization only (no per-process samples: " + ns + "); " +
		"GPU 1: per-process utilization, events xid; " +
		"GPU 2: device utilization only (no per-process samples: " + ns + "), events xid"
	if got != want {
		t.Errorf("Probe =\n%q\nwant\n%q", got, want)
	}
}

// A sampler without a library (no GPU device node given to the agent)
// fails to start with ErrNoDevices, reports nothing, and Wait returns.
func TestNoDevices(t *testing.T) {
	s := New(nil)
	err := s.Start(context.Background(), DefaultInterval)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrNoDevices) {
		t.Fatalf("Start without a library: %v, want ErrNoDevices", err)
	}
	s.Wait()
	if s.GPUs() != nil || s.DeviceFull(1, time.Now()) {
		t.Error("a sampler that never started reports devices")
	}
	if _, ok := s.At(time.Now()); ok {
		t.Error("a sampler that never started has a sample")
	}
}
