package metrics

import (
	"math"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// waitsProc is a CUDA process that waited at three sites (two APIs) and,
// when launches is set, launched kernels.
func waitsProc(pid int, launches bool) *model.Process {
	p := cudaProc(pid, "trainer", false)
	h := model.Histogram{Bounds: []float64{math.Ldexp(1, -20), math.Ldexp(1, -10), 1}, Counts: []uint64{0, 5, 1}, Count: 6, Sum: 1.5}
	p.CUDA.Waits = model.CUDAWaits{Calls: 6, Seconds: 1.5, Histogram: h, Share: 0.25, Sites: []model.CUDAWaitSite{
		{API: "cudaStreamSynchronize", StackID: 1, Calls: 3, Seconds: 1},
		{API: "cudaStreamSynchronize", StackID: 2, Calls: 2, Seconds: 0.25},
		{API: "cudaMemcpy", StackID: 3, Calls: 1, Seconds: 0.25},
	}}
	if launches {
		p.CUDA.Launches = &model.CUDALaunches{Calls: map[string]uint64{"cudaLaunchKernel": 100}, Histogram: model.Histogram{Bounds: h.Bounds, Counts: []uint64{100, 0, 0}, Count: 100, Sum: 0.0005}}
	}
	return p
}

// Waits by API, summed over sites, and each wait's histogram; launches only
// where they were hooked.
func TestCUDAWaitsValues(t *testing.T) {
	m, reg := newMetrics(t)
	m.Update(snap(1, []*model.Process{waitsProc(100, true), waitsProc(101, false)}, nil, nil))
	want := `
# HELP autoglm_cuda_sync_calls_total Synchronising CUDA calls (the host waiting on the GPU: cudaStreamSynchronize, synchronous cudaMemcpy, ...) since attach, by API; a driver call made inside a runtime call counts once, under the runtime's.
# TYPE autoglm_cuda_sync_calls_total counter
autoglm_cuda_sync_calls_total{api="cudaMemcpy",comm="trainer",pid="100"} 1
autoglm_cuda_sync_calls_total{api="cudaMemcpy",comm="trainer",pid="101"} 1
autoglm_cuda_sync_calls_total{api="cudaStreamSynchronize",comm="trainer",pid="100"} 5
autoglm_cuda_sync_calls_total{api="cudaStreamSynchronize",comm="trainer",pid="101"} 5
# HELP autoglm_cuda_sync_wait_seconds_total Time the process's threads waited in synchronising CUDA calls since attach, by API.
# TYPE autoglm_cuda_sync_wait_seconds_total counter
autoglm_cuda_sync_wait_seconds_total{api="cudaMemcpy",comm="trainer",pid="100"} 0.25
autoglm_cuda_sync_wait_seconds_total{api="cudaMemcpy",comm="trainer",pid="101"} 0.25
autoglm_cuda_sync_wait_seconds_total{api="cudaStreamSynchronize",comm="trainer",pid="100"} 1.25
autoglm_cuda_sync_wait_seconds_total{api="cudaStreamSynchronize",comm="trainer",pid="101"} 1.25
# HELP autoglm_cuda_sync_wait_seconds Each synchronising CUDA call's wait since attach, all APIs.
# TYPE autoglm_cuda_sync_wait_seconds histogram
autoglm_cuda_sync_wait_seconds_bucket{comm="trainer",pid="100",le="+Inf"} 6
autoglm_cuda_sync_wait_seconds_sum{comm="trainer",pid="100"} 1.5
autoglm_cuda_sync_wait_seconds_count{comm="trainer",pid="100"} 6
autoglm_cuda_sync_wait_seconds_bucket{comm="trainer",pid="101",le="+Inf"} 6
autoglm_cuda_sync_wait_seconds_sum{comm="trainer",pid="101"} 1.5
autoglm_cuda_sync_wait_seconds_count{comm="trainer",pid="101"} 6
# HELP autoglm_cuda_launches_total CUDA kernel launches since attach, by API (hooked only with --launches).
# TYPE autoglm_cuda_launches_total counter
autoglm_cuda_launches_total{api="cudaLaunchKernel",comm="trainer",pid="100"} 100
# HELP autoglm_cuda_launch_seconds Each CUDA kernel launch call's latency since attach (hooked only with --launches).
# TYPE autoglm_cuda_launch_seconds histogram
autoglm_cuda_launch_seconds_bucket{comm="trainer",pid="100",le="+Inf"} 100
autoglm_cuda_launch_seconds_sum{comm="trainer",pid="100"} 0.0005
autoglm_cuda_launch_seconds_count{comm="trainer",pid="100"} 100
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoglm_cuda_sync_calls_total", "autoglm_cuda_sync_wait_seconds_total",
		"autoglm_cuda_sync_wait_seconds", "autoglm_cuda_launches_total", "autoglm_cuda_launch_seconds"); err != nil {
		t.Fatal(err)
	}
}

// Per container, the waits of a container's processes are summed: two
// ranks of one pod make one series per API.
func TestCUDAWaitsPerContainer(t *testing.T) {
	m, reg := containerMetrics(t)
	procs := []*model.Process{inPod(waitsProc(100, false), "ml", "train", "worker"), inPod(waitsProc(101, false), "ml", "train", "worker")}
	m.Update(snap(1, procs, nil, nil))
	if v, ok := value(t, reg, "autoglm_container_cuda_sync_calls_total", map[string]string{"pod": "train", "api": "cudaStreamSynchronize"}); !ok || v != 10 {
		t.Errorf("container sync calls = %v (present %v), want 10", v, ok)
	}
	if v, ok := value(t, reg, "autoglm_container_cuda_sync_wait_seconds_total", map[string]string{"pod": "train", "api": "cudaMemcpy"}); !ok || v != 0.5 {
		t.Errorf("container wait seconds = %v (present %v), want 0.5", v, ok)
	}
	if n := count(t, reg, "autoglm_cuda_sync_calls_total", nil); n != 0 {
		t.Errorf("%d per-process series of uninteresting processes", n)
	}
}
