package metrics

import (
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// cudaCounts are the high-water marks of one process's CUDA counters.
type cudaCounts struct {
	alloc, free, calls map[string]uint64
	failures           map[string]uint64  // by api and error, joined by failureSep
	lastFailure        *model.CUDAFailure // the last failure counted
}

// failureSep joins api and error in a key; neither contains it.
const failureSep = "\x00"

// raiseCUDA returns the high-water marks of c over prev (nil: none yet).
func raiseCUDA(prev *cudaCounts, c *model.CUDAStats) *cudaCounts {
	if prev == nil {
		prev = &cudaCounts{}
	}
	cur := &cudaCounts{
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
	return cur
}

// cudaSeries appends the CUDA series of s's processes and the GPU series.
// The caller holds m.mu.
func (m *Metrics) cudaSeries(s *model.Snapshot, out []prometheus.Metric) []prometheus.Metric {
	ids := make(map[int][]string, len(s.Processes))
	for _, p := range s.Processes {
		if !p.Exited {
			ids[p.PID] = m.procLabels(p)
			for _, u := range p.CUDA.GPUUtil {
				labels := append(append([]string{u.Label()}, ids[p.PID]...), u.Source)
				out = append(out,
					constMetric(m.d.gpuSMUtilDesc, prometheus.GaugeValue, u.SM, labels...),
					constMetric(m.d.gpuMemUtilDesc, prometheus.GaugeValue, u.Memory, labels...))
			}
		}
		cur := m.counts[p.PID].cuda
		if cur == nil {
			continue // no CUDA activity (see account)
		}
		c := &p.CUDA
		id := m.procLabels(p)
		for api, n := range cur.alloc {
			out = append(out, constMetric(m.d.cudaAllocBytesDesc, prometheus.CounterValue, float64(n), with(id, label(api))...))
		}
		for api, n := range cur.free {
			out = append(out, constMetric(m.d.cudaFreeBytesDesc, prometheus.CounterValue, float64(n), with(id, label(api))...))
		}
		for api, n := range cur.calls {
			out = append(out, constMetric(m.d.cudaAllocCallsDesc, prometheus.CounterValue, float64(n), with(id, label(api))...))
		}
		for k, n := range cur.failures {
			api, errName, _ := strings.Cut(k, failureSep)
			out = append(out, constMetric(m.d.cudaFailuresDesc, prometheus.CounterValue, float64(n), with(id, label(api), label(errName))...))
		}
		out = append(out, constMetric(m.d.cudaLiveBytesDesc, prometheus.GaugeValue, float64(c.LiveBytes), id...))
		if c.HasNVML {
			out = append(out, constMetric(m.d.cudaUntrackedDesc, prometheus.GaugeValue, float64(c.UntrackedBytes), id...))
		}
	}

	for k, n := range s.GPUXIDs {
		out = append(out, constMetric(m.d.gpuXIDDesc, prometheus.CounterValue, float64(n), strconv.Itoa(k.Device), label(k.UUID), strconv.FormatUint(k.XID, 10)))
	}
	for k, n := range s.GPUEventCounts {
		out = append(out, constMetric(m.d.gpuEventsDesc, prometheus.CounterValue, float64(n), strconv.Itoa(k.Device), label(k.UUID), k.Kind))
	}
	for _, g := range s.GPUs {
		idx := g.Label()
		uuid := label(g.UUID)
		out = append(out,
			constMetric(m.d.gpuUsedDesc, prometheus.GaugeValue, float64(g.MemoryUsed), idx, uuid),
			constMetric(m.d.gpuTotalDesc, prometheus.GaugeValue, float64(g.MemoryTotal), idx, uuid),
			constMetric(m.d.gpuUtilDesc, prometheus.GaugeValue, g.Utilization, idx, uuid))
		// Other processes on the GPU are not ours to export.
		for pid, b := range g.Processes {
			if id, ok := ids[pid]; ok {
				out = append(out, constMetric(m.d.gpuProcessUsedDesc, prometheus.GaugeValue, float64(b), append([]string{idx}, id...)...))
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
