package metrics

import (
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var (
	cudaAllocBytesDesc = prometheus.NewDesc("autoglm_cuda_alloc_bytes_total",
		"Bytes allocated through hooked CUDA calls since attach, by API.", []string{"pid", "comm", "api"}, nil)
	cudaFreeBytesDesc = prometheus.NewDesc("autoglm_cuda_free_bytes_total",
		"Bytes freed through hooked CUDA calls since attach, by API.", []string{"pid", "comm", "api"}, nil)
	cudaAllocCallsDesc = prometheus.NewDesc("autoglm_cuda_alloc_calls_total",
		"Hooked CUDA allocation calls since attach, by API.", []string{"pid", "comm", "api"}, nil)
	cudaLiveBytesDesc = prometheus.NewDesc("autoglm_cuda_live_bytes",
		"Bytes allocated through hooked CUDA calls and not freed.", []string{"pid", "comm"}, nil)
	cudaFailuresDesc = prometheus.NewDesc("autoglm_cuda_alloc_failures_total",
		"Failed CUDA allocation calls since attach, by API and error.", []string{"pid", "comm", "api", "error"}, nil)
	cudaUntrackedDesc = prometheus.NewDesc("autoglm_cuda_untracked_bytes",
		"Device memory NVML reports for the process minus the bytes the CUDA hooks see live.", []string{"pid", "comm"}, nil)
	gpuUsedDesc = prometheus.NewDesc("autoglm_gpu_memory_used_bytes",
		"Device memory in use on the GPU, per NVML.", []string{"gpu", "uuid"}, nil)
	gpuTotalDesc = prometheus.NewDesc("autoglm_gpu_memory_total_bytes",
		"Device memory of the GPU, per NVML.", []string{"gpu", "uuid"}, nil)
	gpuUtilDesc = prometheus.NewDesc("autoglm_gpu_utilization_ratio",
		"Share of the last sample period in which a kernel ran on the GPU, per NVML.", []string{"gpu", "uuid"}, nil)
	gpuProcessUsedDesc = prometheus.NewDesc("autoglm_gpu_process_memory_used_bytes",
		"Device memory a watched process uses on the GPU, per NVML.", []string{"gpu", "pid", "comm"}, nil)
)

var cudaDescs = []*prometheus.Desc{cudaAllocBytesDesc, cudaFreeBytesDesc, cudaAllocCallsDesc, cudaLiveBytesDesc,
	cudaFailuresDesc, cudaUntrackedDesc, gpuUsedDesc, gpuTotalDesc, gpuUtilDesc, gpuProcessUsedDesc}

// cudaCounts are the high-water marks of one process's CUDA counters.
type cudaCounts struct {
	alloc, free, calls map[string]uint64
	failures           map[string]uint64  // by api and error, joined by failureSep
	lastFailure        *model.CUDAFailure // the last failure counted
}

// failureSep joins api and error in a key; neither contains it.
const failureSep = "\x00"

// cudaSeries appends the CUDA series of s's processes and the GPU series.
// The caller holds m.mu.
func (m *Metrics) cudaSeries(s *model.Snapshot, out []prometheus.Metric) []prometheus.Metric {
	counts := make(map[int]cudaCounts, len(s.Processes))
	comms := make(map[int]string, len(s.Processes))
	for _, p := range s.Processes {
		if !p.Exited {
			comms[p.PID] = label(p.Comm)
		}
		c := &p.CUDA
		// Only processes with CUDA activity get CUDA series: fewer series.
		if !c.Active() {
			continue
		}
		pid, comm := strconv.Itoa(p.PID), label(p.Comm)
		prev := m.cuda[p.PID]
		cur := cudaCounts{
			alloc:       raise(prev.alloc, c.AllocBytes),
			free:        raise(prev.free, c.FreeBytes),
			calls:       raise(prev.calls, c.AllocCalls),
			failures:    raise(prev.failures, nil),
			lastFailure: prev.lastFailure,
		}
		// Counted as they come: the source keeps only the newest failures,
		// so counting the list would stall at its length.
		for _, f := range newFailures(c.Failures, prev.lastFailure) {
			cur.failures[f.API+failureSep+f.Error]++
			cur.lastFailure = &f
		}
		for api, n := range cur.alloc {
			out = append(out, constMetric(cudaAllocBytesDesc, prometheus.CounterValue, float64(n), pid, comm, label(api)))
		}
		for api, n := range cur.free {
			out = append(out, constMetric(cudaFreeBytesDesc, prometheus.CounterValue, float64(n), pid, comm, label(api)))
		}
		for api, n := range cur.calls {
			out = append(out, constMetric(cudaAllocCallsDesc, prometheus.CounterValue, float64(n), pid, comm, label(api)))
		}
		for k, n := range cur.failures {
			api, errName, _ := strings.Cut(k, failureSep)
			out = append(out, constMetric(cudaFailuresDesc, prometheus.CounterValue, float64(n), pid, comm, label(api), label(errName)))
		}
		out = append(out, constMetric(cudaLiveBytesDesc, prometheus.GaugeValue, float64(c.LiveBytes), pid, comm))
		if c.HasNVML {
			out = append(out, constMetric(cudaUntrackedDesc, prometheus.GaugeValue, float64(c.UntrackedBytes), pid, comm))
		}
		// An exited process is served this once, like its fd series.
		if !p.Exited {
			counts[p.PID] = cur
		}
	}
	m.cuda = counts

	for _, g := range s.GPUs {
		idx := strconv.Itoa(g.Index)
		uuid := label(g.UUID)
		out = append(out,
			constMetric(gpuUsedDesc, prometheus.GaugeValue, float64(g.MemoryUsed), idx, uuid),
			constMetric(gpuTotalDesc, prometheus.GaugeValue, float64(g.MemoryTotal), idx, uuid),
			constMetric(gpuUtilDesc, prometheus.GaugeValue, g.Utilization, idx, uuid))
		// Other processes on the GPU are not ours to export.
		for pid, b := range g.Processes {
			if comm, ok := comms[pid]; ok {
				out = append(out, constMetric(gpuProcessUsedDesc, prometheus.GaugeValue, float64(b), idx, strconv.Itoa(pid), comm))
			}
		}
	}
	return out
}

// newFailures returns the entries of list after last, all of them if last
// is nil or no longer listed.
func newFailures(list []model.CUDAFailure, last *model.CUDAFailure) []model.CUDAFailure {
	if last == nil {
		return list
	}
	for i := len(list) - 1; i >= 0; i-- {
		f := list[i]
		if f.Time.Equal(last.Time) && f.API == last.API && f.Code == last.Code && f.Size == last.Size && slices.Equal(f.Stack, last.Stack) {
			return list[i+1:]
		}
	}
	return list
}
