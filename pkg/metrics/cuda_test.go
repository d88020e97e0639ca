package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var cudaNames = []string{"autoglm_cuda_alloc_bytes_total", "autoglm_cuda_free_bytes_total", "autoglm_cuda_alloc_calls_total",
	"autoglm_cuda_live_bytes", "autoglm_cuda_alloc_failures_total", "autoglm_cuda_untracked_bytes",
	"autoglm_gpu_memory_used_bytes", "autoglm_gpu_memory_total_bytes", "autoglm_gpu_utilization_ratio",
	"autoglm_gpu_process_memory_used_bytes", "autoglm_gpu_sm_utilization_ratio", "autoglm_gpu_memory_controller_utilization_ratio",
	"autoglm_gpu_xid_errors_total", "autoglm_gpu_events_total"}

func failure(ms int, api, errName string) model.CUDAFailure {
	return model.CUDAFailure{Time: t0.Add(time.Duration(ms) * time.Millisecond), API: api, Size: 1 << 30, Code: 2, Error: errName}
}

func cudaProc(pid int, comm string, exited bool, fails ...model.CUDAFailure) *model.Process {
	p := proc(pid, comm, 10, 1, 0, exited)
	p.CUDA = model.CUDAStats{
		LiveBytes:  3 << 30,
		AllocBytes: map[string]uint64{"cudaMalloc": 5 << 30, "cuMemAlloc_v2": 1 << 20},
		FreeBytes:  map[string]uint64{"cudaFree": 2 << 30},
		AllocCalls: map[string]uint64{"cudaMalloc": 40, "cuMemAlloc_v2": 1},
		Failures:   fails,
		Libraries:  []string{"/usr/lib/libcudart.so.12"},
	}
	// Counted as the source counts them.
	for _, f := range fails {
		if p.CUDA.FailedCalls == nil {
			p.CUDA.FailedCalls = map[model.CUDAFailureKind]uint64{}
		}
		p.CUDA.FailedCalls[model.CUDAFailureKind{API: f.API, Error: f.Error}]++
	}
	return p
}

func gpus() []model.GPU {
	return []model.GPU{
		{Index: 0, UUID: "GPU-aaaa", Name: "H100", MemoryUsed: 10 << 30, MemoryTotal: 80 << 30, Utilization: 0.5,
			Processes: map[int]uint64{100: 3<<30 + 512<<20, 999: 1 << 30}},
		{Index: 1, UUID: "GPU-bbbb", Name: "H100", MemoryUsed: 0, MemoryTotal: 80 << 30},
	}
}

// migGPUs is GPU 2 in MIG mode and its MIG device 1, with pid 100 on it.
func migGPUs() []model.GPU {
	one := 1
	return []model.GPU{
		{Index: 2, UUID: "GPU-cccc", Name: "A100", MemoryUsed: 6 << 30, MemoryTotal: 40 << 30, Processes: map[int]uint64{}},
		{Index: 2, MIG: &one, GPUInstance: 5, UUID: "MIG-dddd", Name: "A100 MIG 3g.20gb", MemoryUsed: 1 << 30, MemoryTotal: 20 << 30,
			Processes: map[int]uint64{100: 1 << 30}},
	}
}

func TestCUDAValues(t *testing.T) {
	m, reg := newMetrics(t)
	cp := cudaProc(100, "trainer", false,
		failure(1, "cudaMalloc", "cudaErrorMemoryAllocation"),
		failure(2, "cudaMalloc", "cudaErrorMemoryAllocation"),
		failure(3, "cuMemAlloc_v2", "CUDA_ERROR_OUT_OF_MEMORY"))
	cp.CUDA.HasNVML, cp.CUDA.NVMLUsedBytes, cp.CUDA.UntrackedBytes = true, 3<<30+512<<20, 512<<20
	one := 1
	cp.CUDA.GPUUtil = []model.GPUUtil{{Device: 0, UUID: "GPU-aaaa", SM: 0.25, Memory: 0.125, Source: model.UtilProcess},
		{Device: 1, UUID: "GPU-bbbb", SM: 0.5, Memory: 0.0625, Source: model.UtilDevice},
		{Device: 2, MIG: &one, UUID: "MIG-dddd", SM: 0.75, Memory: 0.25, Source: model.UtilDevice}}
	plain := proc(200, "fdwork", 5, 1, 0, false) // no CUDA activity: no CUDA series
	s := snap(1, []*model.Process{cp, plain}, nil, nil)
	s.GPUs = append(gpus(), migGPUs()...)
	s.GPUXIDs = map[model.XIDKey]uint64{{Device: 0, UUID: "GPU-aaaa", XID: 79}: 1, {Device: 0, UUID: "GPU-aaaa", XID: 31}: 3}
	s.GPUEventCounts = map[model.GPUEventKey]uint64{{Device: 0, UUID: "GPU-aaaa", Kind: model.GPUEventXID}: 4,
		{Device: 0, UUID: "GPU-aaaa", Kind: model.GPUEventPState}: 12, {Device: 2, UUID: "GPU-cccc", Kind: model.GPUEventDoubleBitECC}: 1}
	m.Update(s)

	want := `
# HELP autoglm_cuda_alloc_bytes_total Bytes allocated through hooked CUDA calls since attach, by API.
# TYPE autoglm_cuda_alloc_bytes_total counter
autoglm_cuda_alloc_bytes_total{api="cuMemAlloc_v2",comm="trainer",pid="100"} 1.048576e+06
autoglm_cuda_alloc_bytes_total{api="cudaMalloc",comm="trainer",pid="100"} 5.36870912e+09
# HELP autoglm_cuda_free_bytes_total Bytes freed through hooked CUDA calls since attach, by API.
# TYPE autoglm_cuda_free_bytes_total counter
autoglm_cuda_free_bytes_total{api="cudaFree",comm="trainer",pid="100"} 2.147483648e+09
# HELP autoglm_cuda_alloc_calls_total Hooked CUDA allocation calls since attach, by API.
# TYPE autoglm_cuda_alloc_calls_total counter
autoglm_cuda_alloc_calls_total{api="cuMemAlloc_v2",comm="trainer",pid="100"} 1
autoglm_cuda_alloc_calls_total{api="cudaMalloc",comm="trainer",pid="100"} 40
# HELP autoglm_cuda_live_bytes Bytes allocated through hooked CUDA calls and not freed.
# TYPE autoglm_cuda_live_bytes gauge
autoglm_cuda_live_bytes{comm="trainer",pid="100"} 3.221225472e+09
# HELP autoglm_cuda_alloc_failures_total Failed CUDA allocation calls since attach, by API and error.
# TYPE autoglm_cuda_alloc_failures_total counter
autoglm_cuda_alloc_failures_total{api="cuMemAlloc_v2",comm="trainer",error="CUDA_ERROR_OUT_OF_MEMORY",pid="100"} 1
autoglm_cuda_alloc_failures_total{api="cudaMalloc",comm="trainer",error="cudaErrorMemoryAllocation",pid="100"} 2
# HELP autoglm_cuda_untracked_bytes Device memory NVML reports for the process minus the bytes the CUDA hooks see live.
# TYPE autoglm_cuda_untracked_bytes gauge
autoglm_cuda_untracked_bytes{comm="trainer",pid="100"} 5.36870912e+08
# HELP autoglm_gpu_memory_used_bytes Device memory in use on the GPU, per NVML; gpu="0/mig1" is MIG device 1 of GPU 0, a device of its own.
# TYPE autoglm_gpu_memory_used_bytes gauge
autoglm_gpu_memory_used_bytes{gpu="0",uuid="GPU-aaaa"} 1.073741824e+10
autoglm_gpu_memory_used_bytes{gpu="1",uuid="GPU-bbbb"} 0
autoglm_gpu_memory_used_bytes{gpu="2",uuid="GPU-cccc"} 6.442450944e+09
autoglm_gpu_memory_used_bytes{gpu="2/mig1",uuid="MIG-dddd"} 1.073741824e+09
# HELP autoglm_gpu_memory_total_bytes Device memory of the GPU, per NVML.
# TYPE autoglm_gpu_memory_total_bytes gauge
autoglm_gpu_memory_total_bytes{gpu="0",uuid="GPU-aaaa"} 8.589934592e+10
autoglm_gpu_memory_total_bytes{gpu="1",uuid="GPU-bbbb"} 8.589934592e+10
autoglm_gpu_memory_total_bytes{gpu="2",uuid="GPU-cccc"} 4.294967296e+10
autoglm_gpu_memory_total_bytes{gpu="2/mig1",uuid="MIG-dddd"} 2.147483648e+10
# HELP autoglm_gpu_utilization_ratio Share of the last sample period in which a kernel ran on the GPU, per NVML.
# TYPE autoglm_gpu_utilization_ratio gauge
autoglm_gpu_utilization_ratio{gpu="0",uuid="GPU-aaaa"} 0.5
autoglm_gpu_utilization_ratio{gpu="1",uuid="GPU-bbbb"} 0
autoglm_gpu_utilization_ratio{gpu="2",uuid="GPU-cccc"} 0
autoglm_gpu_utilization_ratio{gpu="2/mig1",uuid="MIG-dddd"} 0
# HELP autoglm_gpu_process_memory_used_bytes Device memory a watched process uses on the GPU, per NVML.
# TYPE autoglm_gpu_process_memory_used_bytes gauge
autoglm_gpu_process_memory_used_bytes{comm="trainer",gpu="0",pid="100"} 3.758096384e+09
autoglm_gpu_process_memory_used_bytes{comm="trainer",gpu="2/mig1",pid="100"} 1.073741824e+09
# HELP autoglm_gpu_sm_utilization_ratio Share of the last poll interval in which a kernel of the process ran on the GPU, the mean of NVML's samples; source="device": the whole GPU's figure, where it keeps none per process (MIG, some vGPU).
# TYPE autoglm_gpu_sm_utilization_ratio gauge
autoglm_gpu_sm_utilization_ratio{comm="trainer",gpu="0",pid="100",source="process"} 0.25
autoglm_gpu_sm_utilization_ratio{comm="trainer",gpu="1",pid="100",source="device"} 0.5
autoglm_gpu_sm_utilization_ratio{comm="trainer",gpu="2/mig1",pid="100",source="device"} 0.75
# HELP autoglm_gpu_memory_controller_utilization_ratio Share of the last poll interval in which the GPU's memory was read or written for the process, the mean of NVML's samples; source as for autoglm_gpu_sm_utilization_ratio.
# TYPE autoglm_gpu_memory_controller_utilization_ratio gauge
autoglm_gpu_memory_controller_utilization_ratio{comm="trainer",gpu="0",pid="100",source="process"} 0.125
autoglm_gpu_memory_controller_utilization_ratio{comm="trainer",gpu="1",pid="100",source="device"} 0.0625
autoglm_gpu_memory_controller_utilization_ratio{comm="trainer",gpu="2/mig1",pid="100",source="device"} 0.25
# HELP autoglm_gpu_xid_errors_total XID errors (driver-reported GPU faults) per device and XID since the start, from NVML's events.
# TYPE autoglm_gpu_xid_errors_total counter
autoglm_gpu_xid_errors_total{gpu="0",uuid="GPU-aaaa",xid="31"} 3
autoglm_gpu_xid_errors_total{gpu="0",uuid="GPU-aaaa",xid="79"} 1
# HELP autoglm_gpu_events_total NVML events per device and type since the start: faults (xid, double_bit_ecc, ...), corrected errors and changes of state (single_bit_ecc, pstate, clock, ...); XIDs by number are in autoglm_gpu_xid_errors_total.
# TYPE autoglm_gpu_events_total counter
autoglm_gpu_events_total{gpu="0",type="pstate",uuid="GPU-aaaa"} 12
autoglm_gpu_events_total{gpu="0",type="xid",uuid="GPU-aaaa"} 4
autoglm_gpu_events_total{gpu="2",type="double_bit_ecc",uuid="GPU-cccc"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), cudaNames...); err != nil {
		t.Fatal(err)
	}
}

func TestCUDAUntrackedOnlyWithNVML(t *testing.T) {
	m, reg := newMetrics(t)
	m.Update(snap(1, []*model.Process{cudaProc(100, "trainer", false)}, nil, nil))
	if _, ok := value(t, reg, "autoglm_cuda_untracked_bytes", nil); ok {
		t.Error("untracked_bytes exported without NVML")
	}
	if v, ok := value(t, reg, "autoglm_cuda_live_bytes", map[string]string{"pid": "100"}); !ok || v != 3<<30 {
		t.Errorf("live_bytes = %v (present %v)", v, ok)
	}
	// A process that only loaded a CUDA library still shows, at zero.
	p := proc(300, "idle", 1, 1, 0, false)
	p.CUDA.Libraries = []string{"/usr/lib/libcuda.so.1"}
	m.Update(snap(2, []*model.Process{p}, nil, nil))
	if v, ok := value(t, reg, "autoglm_cuda_live_bytes", map[string]string{"pid": "300"}); !ok || v != 0 {
		t.Errorf("live_bytes of a process with a CUDA library = %v (present %v), want 0", v, ok)
	}
}

// A count the source hands over lower than before is not served lower:
// rate() would read that as a counter reset.
func TestCUDAFailuresNeverGoDown(t *testing.T) {
	m, reg := newMetrics(t)
	for i, n := range []uint64{2, 5, 3} {
		p := cudaProc(100, "trainer", false)
		p.CUDA.FailedCalls = map[model.CUDAFailureKind]uint64{{API: "cudaMalloc", Error: "cudaErrorMemoryAllocation"}: n}
		m.Update(snap(i, []*model.Process{p}, nil, nil))
	}
	if v, _ := value(t, reg, "autoglm_cuda_alloc_failures_total", map[string]string{"pid": "100"}); v != 5 {
		t.Errorf("failures_total = %v, want 5", v)
	}
}

func TestCUDAExitedDropped(t *testing.T) {
	m, reg := newMetrics(t)
	s := snap(1, []*model.Process{cudaProc(100, "trainer", false), cudaProc(200, "other", false, failure(1, "cudaMalloc", "x"))}, nil, nil)
	s.GPUs = gpus()
	s.GPUs[0].Processes[200] = 1 << 30
	m.Update(s)
	if n := count(t, reg, "autoglm_gpu_process_memory_used_bytes", nil); n != 2 {
		t.Fatalf("gpu process series = %d, want 2 (pid 999 is not watched)", n)
	}

	// pid 200 exits: its CUDA series are served once more, its GPU share
	// no more (NVML no longer lists it, and it is gone).
	gone := cudaProc(200, "other", true)
	gone.CUDA.GPUUtil = []model.GPUUtil{{Device: 0, SM: 0.9, Source: model.UtilProcess}}
	s = snap(2, []*model.Process{cudaProc(100, "trainer", false), gone}, nil, nil)
	s.GPUs = gpus()
	s.GPUs[0].Processes[200] = 1 << 30
	m.Update(s)
	if _, ok := value(t, reg, "autoglm_cuda_live_bytes", map[string]string{"pid": "200"}); !ok {
		t.Fatal("live_bytes of the exiting process missing in its last snapshot")
	}
	for _, name := range []string{"autoglm_gpu_process_memory_used_bytes", "autoglm_gpu_sm_utilization_ratio"} {
		if n := count(t, reg, name, map[string]string{"pid": "200"}); n != 0 {
			t.Errorf("%s of an exited process exported", name)
		}
	}

	s = snap(3, []*model.Process{cudaProc(100, "trainer", false)}, nil, nil)
	m.Update(s)
	for _, name := range cudaNames {
		if n := count(t, reg, name, map[string]string{"pid": "200"}); n != 0 {
			t.Errorf("%s{pid=200} still exported after exit", name)
		}
	}
	// Without NVML in a snapshot there are no GPU series.
	for _, name := range []string{"autoglm_gpu_memory_used_bytes", "autoglm_gpu_process_memory_used_bytes"} {
		if n := count(t, reg, name, nil); n != 0 {
			t.Errorf("%s exported without GPUs in the snapshot", name)
		}
	}

	// A reused pid starts from its own counts.
	p := cudaProc(200, "new", false, failure(9, "cudaMalloc", "x"))
	m.Update(snap(4, []*model.Process{p}, nil, nil))
	if v, _ := value(t, reg, "autoglm_cuda_alloc_failures_total", map[string]string{"pid": "200"}); v != 1 {
		t.Errorf("failures_total of the reused pid = %v, want 1", v)
	}
}

func TestCUDALint(t *testing.T) {
	m, _ := newMetrics(t)
	cp := cudaProc(100, "tr\xffiner", false, failure(1, "cudaMalloc", "cudaErrorMemoryAllocation"))
	cp.CUDA.HasNVML, cp.CUDA.UntrackedBytes = true, -5
	s := snap(1, []*model.Process{cp}, nil, nil)
	s.GPUs = append(gpus(), migGPUs()...)
	s.GPUEventCounts = map[model.GPUEventKey]uint64{{Device: 0, UUID: "GPU-aaaa", Kind: model.GPUEventSingleBitECC}: 1}
	m.Update(s)
	problems, err := testutil.CollectAndLint(collector{m})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
