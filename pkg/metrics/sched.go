package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var (
	ctxSwitchesDesc = prometheus.NewDesc("autoglm_context_switches_total",
		"Context switches of the process's threads since attach, by type (voluntary: blocked; involuntary: preempted).",
		[]string{"pid", "comm", "type"}, nil)
	runqLatencyDesc = prometheus.NewDesc("autoglm_runqueue_latency_seconds",
		"Time the process's threads waited runnable for a CPU, from wake-up or preemption, since attach.",
		[]string{"pid", "comm"}, nil)
)

var schedDescs = []*prometheus.Desc{ctxSwitchesDesc, runqLatencyDesc}

// schedSeries appends the scheduler series of s's processes. The caller
// holds m.mu.
func (m *Metrics) schedSeries(s *model.Snapshot, out []prometheus.Metric) []prometheus.Metric {
	counts := make(map[int]map[string]uint64, len(s.Processes))
	for _, p := range s.Processes {
		h := p.Sched.RunqLatency
		// The sched concern always sets the bounds: without them it did
		// not observe this process, and zeros would be made up.
		if len(h.Bounds) == 0 {
			continue
		}
		pid, comm := strconv.Itoa(p.PID), label(p.Comm)
		cur := raise(m.switches[p.PID], map[string]uint64{"voluntary": p.Sched.Voluntary, "involuntary": p.Sched.Involuntary})
		for typ, n := range cur {
			out = append(out, constMetric(ctxSwitchesDesc, prometheus.CounterValue, float64(n), pid, comm, typ))
		}
		buckets := make(map[float64]uint64, len(h.Bounds))
		var cum uint64
		for i, b := range h.Bounds {
			cum += h.Counts[i]
			buckets[b] = cum
		}
		out = append(out, prometheus.MustNewConstHistogram(runqLatencyDesc, h.Count, h.Sum, buckets, pid, comm))
		// An exited process is served this once, like its fd series.
		if !p.Exited {
			counts[p.PID] = cur
		}
	}
	m.switches = counts
	return out
}
