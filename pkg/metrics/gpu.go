package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// gpuSeries appends NVML's series: the devices', and those of the watched
// processes on them that have series of their own (NVML's figures joined
// with the processes, whatever view is up). The caller holds m.mu.
func (m *Metrics) gpuSeries(s *model.Snapshot, out []prometheus.Metric) []prometheus.Metric {
	ids := make(map[int][]string, len(s.Processes))
	for _, p := range s.Processes {
		if !p.Exited && m.own(s, p.PID) {
			ids[p.PID] = m.procLabels(p)
			for _, u := range p.CUDA.GPUUtil {
				labels := append(append([]string{u.Label()}, ids[p.PID]...), u.Source)
				out = append(out,
					constMetric(m.d.gpuSMUtilDesc, prometheus.GaugeValue, u.SM, labels...),
					constMetric(m.d.gpuMemUtilDesc, prometheus.GaugeValue, u.Memory, labels...))
			}
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
