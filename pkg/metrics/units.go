package metrics

import (
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Per-container series. A fleet cannot afford series per process: a
// training node's DataLoader workers are forked by the dozen, and pids
// change at every restart. So the daemon sums the processes of one unit
// into autoglm_container_* series whose labels survive restarts, and in
// container granularity a process has series of its own (with pid) only
// while it is interesting: a finding of it is active, or it holds at least
// half of a limit (its fds, a GPU's memory), which the rules predicting
// exhaustion of a process's own limit judge. It keeps them for
// Options.Hold after, so that its alerts do not flap.
//
// Metrics marked EveryProcess escape both: an NCCL rank's collective count
// and last call's time are served per process, always, and never summed.
// The cross-node rule compares each rank with its communicator's others,
// which a sum over a container's ranks would hide; they are few (one
// series per rank, communicator and operation) and only processes that
// call NCCL have them.
//
// A container's sums include the processes that have series of their own,
// which only add detail under other names, so that summing one metric never
// counts a process twice, and rules on the sums work in either granularity.

// limitShare is the share of a limit from which a process is interesting.
const limitShare = 0.5

// unitKey is what a process's series are summed by: its container
// (namespace, pod and container, as the API server names them) or,
// outside a named pod, its cgroup; and its comm, so that a container's
// ranks and its DataLoader workers stay apart.
type unitKey struct{ namespace, pod, container, cgroup, comm string }

// unitNames are the labels of every per-container series, then extra.
func unitNames(extra ...string) []string {
	return append([]string{"namespace", "pod", "container", "cgroup", "comm"}, extra...)
}

func unitOf(p *model.Process) unitKey {
	k := unitKey{comm: label(p.Comm)}
	if p.Pod.Name != "" {
		k.namespace, k.pod, k.container = label(p.Pod.Namespace), label(p.Pod.Name), label(p.Pod.Container)
	} else {
		// A pod's cgroup path holds its UID and container id, which
		// change at every restart: only a process the API server has
		// not named is summed by it.
		k.cgroup = label(p.Pod.Cgroup)
	}
	return k
}

// values are the values of unitNames, then extra.
func (k unitKey) values(extra ...string) []string {
	return with([]string{k.namespace, k.pod, k.container, k.cgroup, k.comm}, extra...)
}

// unitState is what a unit keeps between snapshots: the final counts of its
// processes that are gone, so that its counters and histograms never go
// down when one exits, and when it last had a process, so that a container
// that restarts within Options.Hold goes on counting from where it was.
type unitState struct {
	retired map[seriesKey]counter
	hists   map[int]model.Histogram
	started time.Time // the histograms' start
	seen    time.Time
}

// unitDescs are the descriptions of the per-container series besides the
// views' sums (viewMetric.unitDesc).
type unitDescs struct {
	processes, info, gpuUsed, gpuSM, gpuMem *prometheus.Desc
}

func newUnitDescs() unitDescs {
	return unitDescs{
		processes: prometheus.NewDesc("autoglm_container_processes",
			"Watched processes of a container (outside a pod, a cgroup) with this comm.", unitNames(), nil),
		info: prometheus.NewDesc("autoglm_container_info",
			"Always 1: the pod UID and container id of a container watched processes run in, to join on (namespace, pod, container); they change at every restart, so no other series carries them.",
			[]string{"namespace", "pod", "container", "pod_uid", "container_id"}, nil),
		gpuUsed: prometheus.NewDesc("autoglm_container_gpu_memory_used_bytes",
			"Device memory the watched processes of a container (outside a pod, a cgroup) with this comm use on the GPU, per NVML: the sum of autoglm_gpu_process_memory_used_bytes.",
			unitNames("gpu"), nil),
		gpuSM: prometheus.NewDesc("autoglm_container_gpu_sm_utilization_ratio",
			"Share of the last poll interval in which a kernel of the container's processes with this comm ran on the GPU: the sum of autoglm_gpu_sm_utilization_ratio, or with source=\"device\" the device's figure.",
			unitNames("gpu", "source"), nil),
		gpuMem: prometheus.NewDesc("autoglm_container_gpu_memory_controller_utilization_ratio",
			"Share of the last poll interval in which the GPU's memory was read or written for the container's processes with this comm; summed as autoglm_container_gpu_sm_utilization_ratio.",
			unitNames("gpu", "source"), nil),
	}
}

func (d unitDescs) all() []*prometheus.Desc {
	return []*prometheus.Desc{d.processes, d.info, d.gpuUsed, d.gpuSM, d.gpuMem}
}

// ContainerName is the name of the per-container sum of a view's metric:
// name's autoglm_ prefix becomes autoglm_container_.
func ContainerName(name string) string {
	return "autoglm_container_" + strings.TrimPrefix(name, "autoglm_")
}

// unitDesc describes the per-container sum of a view's metric.
func unitDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(ContainerName(name),
		"Summed over the watched processes of a container (outside a pod, a cgroup) with this comm, those gone included for counters: "+help,
		unitNames(labels...), nil)
}

// interesting returns the pids of s's processes that have series of their
// own at s: with an active finding, or holding limitShare of their fd limit
// or of a GPU's memory.
func (m *Metrics) interesting(s *model.Snapshot) map[int]bool {
	out := map[int]bool{}
	if m.gran != PerContainer {
		return out
	}
	for _, f := range s.Findings {
		if f.Active {
			out[f.PID] = true
		}
	}
	for _, p := range s.Processes {
		if p.FD.Limit > 0 && float64(p.FD.Open) >= limitShare*float64(p.FD.Limit) {
			out[p.PID] = true
		}
	}
	for _, g := range s.GPUs {
		for pid, b := range g.Processes {
			if g.MemoryTotal > 0 && float64(b) >= limitShare*float64(g.MemoryTotal) {
				out[pid] = true
			}
		}
	}
	return out
}

// own says whether pid, a process of s, has series of its own.
func (m *Metrics) own(s *model.Snapshot, pid int) bool {
	if m.gran != PerContainer {
		return true
	}
	c := m.counts[pid]
	return c != nil && !c.own.Before(s.Time)
}

// handOver moves the final counts of each process that left its unit (it
// is gone, its pid was reused, or it moved: the API server named its pod)
// into that unit's state, forgets units empty for longer than the hold,
// and marks those s has processes in. The caller holds m.mu.
func (m *Metrics) handOver(s *model.Snapshot, counts map[int]*procCounts) {
	for pid, old := range m.counts {
		if c, ok := counts[pid]; ok && !old.exited && c.unit == old.unit {
			continue
		}
		u := m.unit(old.unit, s.Time)
		for k, c := range old.counters {
			if m.d.views[k.metric].unitDesc == nil {
				continue // not summed (EveryProcess)
			}
			r := u.retired[k]
			u.retired[k] = counter{c.labels, r.v + c.v}
		}
		for i, h := range old.hists {
			u.hists[i] = addHist(u.hists[i], h)
		}
	}
	for k, u := range m.units {
		if s.Time.Sub(u.seen) > m.hold {
			delete(m.units, k)
		}
	}
	for _, c := range counts {
		m.unit(c.unit, s.Time).seen = s.Time
	}
}

// unit returns k's state, new since t if it had none.
func (m *Metrics) unit(k unitKey, t time.Time) *unitState {
	u := m.units[k]
	if u == nil {
		u = &unitState{retired: map[seriesKey]counter{}, hists: map[int]model.Histogram{}, started: t, seen: t}
		m.units[k] = u
	}
	return u
}

// addHist returns the sum of two histograms of one view metric, in new
// slices: the bounds are the view's, the same for every process.
func addHist(a, b model.Histogram) model.Histogram {
	if len(a.Counts) == 0 {
		return model.Histogram{Bounds: b.Bounds, Counts: slices.Clone(b.Counts), Count: b.Count, Sum: b.Sum}
	}
	out := model.Histogram{Bounds: a.Bounds, Counts: slices.Clone(a.Counts), Count: a.Count + b.Count, Sum: a.Sum + b.Sum}
	for i := range min(len(out.Counts), len(b.Counts)) {
		out.Counts[i] += b.Counts[i]
	}
	return out
}

// unitSum is one per-container series being summed.
type unitSum struct {
	desc   *prometheus.Desc
	t      prometheus.ValueType
	labels []string
	v      float64
}

// unitSums are the series of one unit being summed, by description and
// label values.
type unitSums struct {
	procs  int
	series map[unitSumKey]*unitSum
	hists  map[int]model.Histogram
}

type unitSumKey struct {
	desc   *prometheus.Desc
	labels string
}

// add adds v to a series; with most it keeps the highest instead.
func (u *unitSums) add(d *prometheus.Desc, t prometheus.ValueType, v float64, most bool, labels ...string) {
	k := unitSumKey{d, strings.Join(labels, "\x00")}
	sum := u.series[k]
	switch {
	case sum == nil:
		u.series[k] = &unitSum{d, t, labels, v}
	case most:
		sum.v = max(sum.v, v)
	default:
		sum.v += v
	}
}

// unitSeries appends the per-container series of the units s has
// processes in: gauges summed over those processes, counters and
// histograms over them and the unit's processes that are gone. The caller
// holds m.mu.
func (m *Metrics) unitSeries(s *model.Snapshot, out []prometheus.Metric) []prometheus.Metric {
	units := map[unitKey]*unitSums{}
	sums := func(k unitKey) *unitSums {
		u := units[k]
		if u != nil {
			return u
		}
		u = &unitSums{series: map[unitSumKey]*unitSum{}, hists: map[int]model.Histogram{}}
		if st := m.units[k]; st != nil {
			for sk, c := range st.retired {
				u.add(m.d.views[sk.metric].unitDesc, prometheus.CounterValue, c.v, false, c.labels...)
			}
			for i, h := range st.hists {
				u.hists[i] = h
			}
		}
		units[k] = u
		return u
	}
	of := make(map[int]*unitSums, len(s.Processes))
	for _, p := range s.Processes {
		c := m.counts[p.PID]
		u := sums(c.unit)
		of[p.PID] = u
		u.procs++
		for i, vm := range m.d.views {
			switch {
			case vm.unitDesc == nil:
			case vm.Type == model.GaugeMetric:
				vm.Samples(p, func(v float64, labels ...string) {
					u.add(vm.unitDesc, prometheus.GaugeValue, v, false, labels...)
				})
			case vm.Type == model.HistogramMetric:
				if h, ok := c.hists[i]; ok {
					u.hists[i] = addHist(u.hists[i], h)
				}
			}
		}
		for k, cn := range c.counters {
			if d := m.d.views[k.metric].unitDesc; d != nil {
				u.add(d, prometheus.CounterValue, cn.v, false, cn.labels...)
			}
		}
		if p.Exited {
			continue
		}
		for _, g := range p.CUDA.GPUUtil {
			// A device's own figure is the same for each of its
			// processes: summing it would count it again and again.
			device := g.Source == model.UtilDevice
			u.add(m.d.unit.gpuSM, prometheus.GaugeValue, g.SM, device, g.Label(), g.Source)
			u.add(m.d.unit.gpuMem, prometheus.GaugeValue, g.Memory, device, g.Label(), g.Source)
		}
	}
	for _, g := range s.GPUs {
		for pid, b := range g.Processes {
			if u := of[pid]; u != nil && !m.exited(pid) {
				u.add(m.d.unit.gpuUsed, prometheus.GaugeValue, float64(b), false, g.Label())
			}
		}
	}
	for k, u := range units {
		out = append(out, constMetric(m.d.unit.processes, prometheus.GaugeValue, float64(u.procs), k.values()...))
		for _, sum := range u.series {
			out = append(out, constMetric(sum.desc, sum.t, sum.v, k.values(sum.labels...)...))
		}
		for i, h := range u.hists {
			out = append(out, runqHistogram(m.d.views[i].unitDesc, h, m.units[k].started, m.classic, k.values()...))
		}
	}
	return out
}

// exited says whether pid's last snapshot is the one being served.
func (m *Metrics) exited(pid int) bool {
	c := m.counts[pid]
	return c != nil && c.exited
}

// infoSeries appends autoglm_container_info for each container s has
// processes in. The caller holds m.mu.
func (m *Metrics) infoSeries(s *model.Snapshot, out []prometheus.Metric) []prometheus.Metric {
	if !m.pods {
		return out
	}
	seen := map[[5]string]bool{}
	for _, p := range s.Processes {
		id := [5]string{label(p.Pod.Namespace), label(p.Pod.Name), label(p.Pod.Container), label(p.Pod.UID), label(p.Pod.ContainerID)}
		if p.Pod.UID == "" || seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, constMetric(m.d.unit.info, prometheus.GaugeValue, 1, id[:]...))
	}
	return out
}
