package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

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
		id := m.procLabels(p)
		cur := raise(m.switches[p.PID], map[string]uint64{"voluntary": p.Sched.Voluntary, "involuntary": p.Sched.Involuntary})
		for typ, n := range cur {
			out = append(out, constMetric(m.d.ctxSwitchesDesc, prometheus.CounterValue, float64(n), with(id, typ)...))
		}
		buckets := make(map[float64]uint64, len(h.Bounds))
		var cum uint64
		for i, b := range h.Bounds {
			cum += h.Counts[i]
			buckets[b] = cum
		}
		out = append(out, prometheus.MustNewConstHistogram(m.d.runqLatencyDesc, h.Count, h.Sum, buckets, id...))
		// An exited process is served this once, like its fd series.
		if !p.Exited {
			counts[p.PID] = cur
		}
	}
	m.switches = counts
	return out
}
