// Package metrics exports snapshots as Prometheus metrics.
//
// Every series is rebuilt from the latest snapshot, so a process that exited
// disappears from the exposition one snapshot after the one that reported its
// exit, which keeps cardinality bounded by the live targets. The counters'
// state follows every snapshot; the series themselves are built when a
// scrape asks for them, at most once per snapshot: a node agent polls every
// second and is scraped every 15 to 60.
//
// The daemon sums the processes of one container and comm into
// autoglm_container_* series; in container granularity, its default, a
// process has series of its own only while it is interesting (units.go):
// a fleet pays per container, not per forked worker.
package metrics

import (
	"maps"
	"net/http"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/open-autoglm/autoglm-ebpf/pkg/buildinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/stack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// descs are the metric descriptions of one Metrics: the per-process label
// set depends on whether pod labels are exported.
type descs struct {
	findingDesc       *prometheus.Desc
	findingCauseDesc  *prometheus.Desc
	findingsTotalDesc *prometheus.Desc
	lostDesc          *prometheus.Desc
	refusedDesc       *prometheus.Desc
	trackFailuresDesc *prometheus.Desc
	viewUpDesc        *prometheus.Desc
	viewAbsentDesc    *prometheus.Desc
	bpfMemoryDesc     *prometheus.Desc
	fdListingsDesc    *prometheus.Desc
	fdCopiesDesc      *prometheus.Desc
	fdDescribedDesc   *prometheus.Desc
	fdDeferredDesc    *prometheus.Desc
	fdReadsBoundDesc  *prometheus.Desc
	shortLivedDesc    *prometheus.Desc
	shortLivedFDsDesc *prometheus.Desc
	buildInfoDesc     *prometheus.Desc
	// views are the views' per-process metrics (model.Shows), each with
	// its description and, where it has one, that of its per-container
	// sum (nil for an OwnOnly or EveryProcess metric).
	views              []viewMetric
	gpuUsedDesc        *prometheus.Desc
	gpuTotalDesc       *prometheus.Desc
	gpuUtilDesc        *prometheus.Desc
	gpuProcessUsedDesc *prometheus.Desc
	gpuSMUtilDesc      *prometheus.Desc
	gpuMemUtilDesc     *prometheus.Desc
	gpuXIDDesc         *prometheus.Desc
	gpuEventsDesc      *prometheus.Desc
	unit               unitDescs
}

func newDescs(pods bool) *descs {
	names := func(extra ...string) []string { return procNames(pods, extra...) }
	d := &descs{}
	d.findingDesc = prometheus.NewDesc("autoglm_finding",
		"A finding's severity while it is active (1 info, 2 warning, 3 critical), and once it no longer holds, minus the severity it ended with; site is the function at the finding's call site. The severity is the value, not a label, so that an escalating finding stays one series.",
		append([]string{"kind", "site"}, names()...), nil)
	d.findingCauseDesc = prometheus.NewDesc("autoglm_finding_caused_by",
		"1 while a finding explained by another (cause: its kind) is active, 0 after; such a finding is not in autoglm_finding or autoglm_findings_total.",
		append([]string{"kind", "cause"}, names()...), nil)
	d.findingsTotalDesc = prometheus.NewDesc("autoglm_findings_total",
		"Distinct findings that became active, by kind; those explained by another finding are not counted.", []string{"kind"}, nil)
	d.lostDesc = prometheus.NewDesc("autoglm_bpf_events_lost_total",
		"Lost BPF events and failed map updates, by source.", []string{"source"}, nil)
	d.refusedDesc = prometheus.NewDesc("autoglm_inputs_refused_total",
		"What watched processes presented over a parser's bounds and was not read, by parser: symbolize (a mapped file's symbol table over 64 MiB, a name over 64 KiB, a call-frame program malformed or nested too deep, line tables over their bound), python (a code object's name, file name or line table over its bound). Their frames are left unsymbolized; not losses: any process can make them.",
		[]string{"parser"}, nil)
	d.trackFailuresDesc = prometheus.NewDesc("autoglm_track_failures_total",
		"Processes a view could not follow (the other views watched them on), by view and reason (an errno name, or other).",
		[]string{"view", "reason"}, nil)
	d.viewUpDesc = prometheus.NewDesc("autoglm_view_up",
		"1 when the view runs, 0 when it is down (failed to load, or still loading): fd, sched, sock, cuda, nccl, python, nvml. The log says why. A view not expected on this node has autoglm_view_absent instead.",
		[]string{"view"}, nil)
	d.viewAbsentDesc = prometheus.NewDesc("autoglm_view_absent",
		"1 for a view that does not run because it is not expected on this node, which is no fault; it has no autoglm_view_up. reason: no_gpu (the node has no NVIDIA GPU), no_nvml (NVML was not given to the agent: no libnvidia-ml or no GPU device nodes in its container).",
		[]string{"view", "reason"}, nil)
	d.bpfMemoryDesc = prometheus.NewDesc("autoglm_bpf_memory_bytes",
		"Kernel memory of each view's BPF maps and programs (memlock; charged to the agent's memory cgroup on Linux >= 5.11), read every 10 polls.",
		[]string{"view"}, nil)
	d.fdListingsDesc = prometheus.NewDesc("autoglm_fd_proc_listings_total",
		"Listings of a /proc/PID/fd directory by number, to find what changed in a table the fd view knows.", nil, nil)
	d.fdCopiesDesc = prometheus.NewDesc("autoglm_fd_table_copies_total",
		"Children of watched processes whose open fds came from the kernel's copy of their fd bitmap (taken at fork and at exec), not from a listing of /proc.", nil, nil)
	d.fdDescribedDesc = prometheus.NewDesc("autoglm_fd_descriptions_total",
		"Fds of watched processes described without a kernel event: by a readlink in /proc (source=proc) or from the parent's table, for a child tracked from its fork (source=parent).",
		[]string{"source"}, nil)
	d.fdDeferredDesc = prometheus.NewDesc("autoglm_fd_descriptions_deferred_total",
		"Fd descriptions put off to a later interval by the per-interval bound (--fd-reads-per-poll); an fd put off twice counts twice.", nil, nil)
	d.fdReadsBoundDesc = prometheus.NewDesc("autoglm_fd_descriptions_per_poll_limit",
		"The most fds described from /proc per interval, all processes together.", nil, nil)
	d.shortLivedDesc = prometheus.NewDesc("autoglm_short_lived_processes_total",
		"Children of watched processes, tracked from their fork, that exited before an interval watched them: counted, never listed.", nil, nil)
	d.shortLivedFDsDesc = prometheus.NewDesc("autoglm_short_lived_fds_opened_total",
		"Fds those short-lived children opened.", nil, nil)
	d.buildInfoDesc = prometheus.NewDesc("autoglm_build_info",
		"Always 1; labelled with the version of autoglm-ebpf, the VCS revision it was built from, and the Go version and architecture it was built with.",
		[]string{"version", "revision", "goversion", "goarch"}, nil)
	d.gpuUsedDesc = prometheus.NewDesc("autoglm_gpu_memory_used_bytes",
		"Device memory in use on the GPU, per NVML; gpu=\"0/mig1\" is MIG device 1 of GPU 0, a device of its own.", []string{"gpu", "uuid"}, nil)
	d.gpuTotalDesc = prometheus.NewDesc("autoglm_gpu_memory_total_bytes",
		"Device memory of the GPU, per NVML.", []string{"gpu", "uuid"}, nil)
	d.gpuUtilDesc = prometheus.NewDesc("autoglm_gpu_utilization_ratio",
		"Share of the last sample period in which a kernel ran on the GPU, per NVML.", []string{"gpu", "uuid"}, nil)
	d.gpuProcessUsedDesc = prometheus.NewDesc("autoglm_gpu_process_memory_used_bytes",
		"Device memory a watched process uses on the GPU, per NVML.", append([]string{"gpu"}, names()...), nil)
	d.gpuSMUtilDesc = prometheus.NewDesc("autoglm_gpu_sm_utilization_ratio",
		"Share of the last poll interval in which a kernel of the process ran on the GPU, the mean of NVML's samples; source=\"device\": the whole GPU's figure, where it keeps none per process (MIG, some vGPU).",
		append([]string{"gpu"}, names("source")...), nil)
	d.gpuMemUtilDesc = prometheus.NewDesc("autoglm_gpu_memory_controller_utilization_ratio",
		"Share of the last poll interval in which the GPU's memory was read or written for the process, the mean of NVML's samples; source as for autoglm_gpu_sm_utilization_ratio.",
		append([]string{"gpu"}, names("source")...), nil)
	d.gpuXIDDesc = prometheus.NewDesc("autoglm_gpu_xid_errors_total",
		"XID errors (driver-reported GPU faults) per device and XID since the start, from NVML's events.", []string{"gpu", "uuid", "xid"}, nil)
	d.gpuEventsDesc = prometheus.NewDesc("autoglm_gpu_events_total",
		"NVML events per device and type since the start: faults (xid, double_bit_ecc, ...), corrected errors and changes of state (single_bit_ecc, pstate, clock, ...); XIDs by number are in autoglm_gpu_xid_errors_total.",
		[]string{"gpu", "uuid", "type"}, nil)
	for _, sh := range model.Shows {
		for _, vm := range sh.Metrics {
			v := viewMetric{Metric: vm, desc: prometheus.NewDesc(vm.Name, vm.Help, names(vm.Labels...), nil)}
			if !vm.OwnOnly && !vm.EveryProcess {
				v.unitDesc = unitDesc(vm.Name, vm.Help, vm.Labels...)
			}
			d.views = append(d.views, v)
		}
	}
	d.unit = newUnitDescs()
	return d
}

// viewMetric is a view's metric and its descriptions.
type viewMetric struct {
	model.Metric
	desc     *prometheus.Desc
	unitDesc *prometheus.Desc // its per-container sum; nil for OwnOnly and EveryProcess
}

// all lists every description, for Describe.
func (d *descs) all() []*prometheus.Desc {
	out := []*prometheus.Desc{d.findingDesc, d.findingCauseDesc, d.findingsTotalDesc, d.lostDesc, d.refusedDesc, d.trackFailuresDesc, d.viewUpDesc, d.viewAbsentDesc, d.bpfMemoryDesc, d.fdListingsDesc, d.fdCopiesDesc, d.fdDescribedDesc, d.fdDeferredDesc, d.fdReadsBoundDesc, d.shortLivedDesc, d.shortLivedFDsDesc, d.buildInfoDesc, d.gpuUsedDesc, d.gpuTotalDesc, d.gpuUtilDesc, d.gpuProcessUsedDesc, d.gpuSMUtilDesc, d.gpuMemUtilDesc, d.gpuXIDDesc, d.gpuEventsDesc}
	for _, v := range d.views {
		out = append(out, v.desc)
		if v.unitDesc != nil {
			out = append(out, v.unitDesc)
		}
	}
	return append(out, d.unit.all()...)
}

// Metrics is a sink that serves the latest snapshot to Prometheus.
type Metrics struct {
	d         *descs
	pods      bool // per-process series carry pod labels
	classic   bool // the run-queue histogram also has classic buckets
	gran      Granularity
	hold      time.Duration // see Options.Hold
	mu        sync.Mutex
	buildInfo prometheus.Metric
	latest    *model.Snapshot     // the last Update's, without processes already served as exited
	series    []prometheus.Metric // what Collect serves, built from latest; nil: not yet

	// High-water marks, so that a counter never goes down even if a source
	// hands over a smaller value: rate() would read that as a counter reset.
	counts  map[int]*procCounts // latest's processes by pid
	lost    map[string]uint64   // by source
	refused map[string]uint64   // by parser
	// units are the containers' counts of their processes that are gone
	// (with Pods).
	units map[unitKey]*unitState

	counted map[findingID]bool // findings already in findings_total
	total   map[string]uint64  // findings_total by kind
	// Exited pids and when. Snapshot.Findings keeps every finding forever,
	// so without this an exited process's autoglm_finding series would stay.
	gone map[int]time.Time
}

// procCounts are the high-water marks of one process's counters, by
// view metric and label values.
type procCounts struct {
	counters map[seriesKey]counter
	// exited: served this once (see current); the state goes, so that a
	// reused pid starts from its own counts.
	exited bool
	// unit is the container the process's counts are summed in, hists its
	// histograms by view metric, to hand them over when it leaves.
	unit  unitKey
	hists map[int]model.Histogram
	// own: until when the process has series of its own in container
	// granularity (the last time it was interesting, plus Options.Hold).
	own time.Time
}

// seriesKey is one series of a process: a view metric (its index in
// descs.views) and its label values joined by NUL.
type seriesKey struct {
	metric int
	labels string
}

// counter is a counter series' label values and high-water mark.
type counter struct {
	labels []string
	v      float64
}

// findingID identifies one finding across snapshots, as detectors do.
type findingID struct {
	kind      string
	pid       int
	firstSeen int64 // UnixNano: time.Time is not a reliable map key
}

// findingSeries is the label set of one autoglm_finding series: kind,
// site and the process's labels (procNames) joined by NUL.
type findingSeries struct {
	kind, site, proc string
}

// Granularity says which processes have series of their own.
type Granularity int

const (
	// PerProcess: every watched process has its own series (attach, run,
	// and daemon --metrics.granularity=process).
	PerProcess Granularity = iota
	// PerContainer: the processes of one container (outside a pod, one
	// cgroup) and comm are summed into autoglm_container_* series; a
	// process has series of its own only while it is interesting.
	PerContainer
)

// DefaultHold is how long a process keeps its own series after it was last
// interesting, unless Options.Hold says otherwise: longer than the rules'
// for: clauses, so that a finding that flickers does not flap its alert.
const DefaultHold = 10 * time.Minute

// Options change what is exported.
type Options struct {
	// Pods adds the pod labels (namespace, pod, container) to every
	// per-process series, and serves the per-container sums and each
	// container's pod UID and container id in autoglm_container_info: the
	// daemon sets it.
	Pods bool
	// Granularity is PerProcess unless set; PerContainer needs Pods.
	Granularity Granularity
	// Hold replaces DefaultHold where positive.
	Hold time.Duration
	// RunqueueClassicBuckets adds a few classic buckets (RunqueueBuckets)
	// to the run-queue histogram, for scrapers without native histograms.
	RunqueueClassicBuckets bool
}

// Revision is the VCS revision the binary was built from, as the build
// stamped it ("+dirty" when the tree had changes), or "unknown".
func Revision() string {
	rev, dirty := buildinfo.Revision(debug.ReadBuildInfo())
	switch {
	case rev == "":
		return "unknown"
	case dirty:
		return rev + "+dirty"
	}
	return rev
}

// New creates the metrics and registers them on reg; it panics, like
// prometheus.MustRegister, if reg already holds metrics of the same names.
func New(reg prometheus.Registerer, version string, opts ...Options) *Metrics {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	d := newDescs(o.Pods)
	m := &Metrics{
		d:         d,
		pods:      o.Pods,
		classic:   o.RunqueueClassicBuckets,
		gran:      o.Granularity,
		hold:      o.Hold,
		units:     map[unitKey]*unitState{},
		buildInfo: prometheus.MustNewConstMetric(d.buildInfoDesc, prometheus.GaugeValue, 1, label(version), Revision(), runtime.Version(), runtime.GOARCH),
		counts:    map[int]*procCounts{},
		lost:      map[string]uint64{},
		refused:   map[string]uint64{},
		counted:   map[findingID]bool{},
		total:     map[string]uint64{},
		gone:      map[int]time.Time{},
	}
	if m.hold <= 0 {
		m.hold = DefaultHold
	}
	if !m.pods {
		// attach and run: no containers to sum by.
		m.gran = PerProcess
	}
	// Pre-create every kind, so that increase() sees the first finding.
	for _, k := range model.Kinds {
		m.total[k] = 0
	}
	// The agent's own health beside what it watches, as every exporter
	// serves it: go_* (heap, GC, goroutines) and process_* (CPU, RSS, fds).
	reg.MustRegister(collector{m}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Update makes s the snapshot served and brings the counters up to it.
func (m *Metrics) Update(s *model.Snapshot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.latest = m.current(s)
	m.account(m.latest)
	m.series = nil
}

// Close exports final, if any. The metrics stay registered: the endpoint may
// still be scraped until the program exits.
func (m *Metrics) Close(final *model.Snapshot) error {
	if final != nil {
		m.Update(final)
	}
	return nil
}

// current returns s without the processes that exited in an earlier
// snapshot: the pipeline keeps reporting them (the JSON report wants their
// last state), but their series go once their exit has been served.
func (m *Metrics) current(s *model.Snapshot) *model.Snapshot {
	c := *s
	c.Processes = nil
	for _, p := range s.Processes {
		if !p.Exited {
			c.Processes = append(c.Processes, p)
			continue
		}
		exit, seen := m.gone[p.PID]
		if !seen {
			m.gone[p.PID] = s.Time
			exit = s.Time
		}
		if !exit.Before(s.Time) {
			c.Processes = append(c.Processes, p)
		}
	}
	// A process the pipeline no longer lists, nor any finding of it (the
	// daemon forgets exited ones), needs no exit record: memory stays
	// bounded by what is listed.
	listed := make(map[int]bool, len(s.Processes))
	for _, p := range s.Processes {
		listed[p.PID] = true
	}
	for _, f := range s.Findings {
		listed[f.PID] = true
	}
	for pid := range m.gone {
		if !listed[pid] {
			delete(m.gone, pid)
		}
	}
	current := make(map[findingID]bool, len(s.Findings))
	for _, f := range s.Findings {
		current[findingID{f.Kind, f.PID, f.FirstSeen.UnixNano()}] = true
	}
	for id := range m.counted {
		if !current[id] {
			delete(m.counted, id)
		}
	}
	return &c
}

// account updates the monotonic state from s, which every snapshot must
// pass through: a counter's high-water mark, the CUDA failures the source
// lists only while they are recent, the findings that became active. The
// caller holds m.mu.
func (m *Metrics) account(s *model.Snapshot) {
	counts := make(map[int]*procCounts, len(s.Processes))
	interesting := m.interesting(s)
	for _, p := range s.Processes {
		prev := m.counts[p.PID]
		if prev == nil || prev.exited {
			prev = &procCounts{}
		}
		c := &procCounts{counters: maps.Clone(prev.counters), exited: p.Exited, unit: unitOf(p), own: prev.own}
		if c.counters == nil {
			c.counters = map[seriesKey]counter{}
		}
		for i, vm := range m.d.views {
			switch vm.Type {
			case model.CounterMetric:
				vm.Samples(p, func(v float64, labels ...string) {
					k := seriesKey{i, strings.Join(labels, "\x00")}
					c.counters[k] = counter{labels, max(c.counters[k].v, v)}
				})
			case model.HistogramMetric:
				if h, ok := vm.Histogram(p); ok && m.pods {
					if c.hists == nil {
						c.hists = map[int]model.Histogram{}
					}
					c.hists[i] = h
				}
			}
		}
		if interesting[p.PID] {
			c.own = s.Time.Add(m.hold)
		}
		counts[p.PID] = c
	}
	if m.pods {
		m.handOver(s, counts)
	}
	m.counts = counts
	for _, f := range s.Findings {
		id := findingID{f.Kind, f.PID, f.FirstSeen.UnixNano()}
		if f.Active && !m.counted[id] && f.CausedBy == nil {
			m.counted[id] = true
			m.total[f.Kind]++
		}
	}
	for src, n := range s.Lost {
		m.lost[src] = max(m.lost[src], n)
	}
	for parser, n := range s.Refused {
		m.refused[parser] = max(m.refused[parser], n)
	}
}

// render returns every series to serve for the latest snapshot. The caller
// holds m.mu.
func (m *Metrics) render() []prometheus.Metric {
	out := []prometheus.Metric{m.buildInfo}
	s := m.latest
	if s != nil {
		out = m.viewSeries(s, out)
		out = m.gpuSeries(s, out)
		out = m.findingSeries(s, out)
		out = m.infoSeries(s, out)
		if m.pods {
			out = m.unitSeries(s, out)
		}
	}
	for src, n := range m.lost {
		out = append(out, constMetric(m.d.lostDesc, prometheus.CounterValue, float64(n), label(src)))
	}
	for parser, n := range m.refused {
		out = append(out, constMetric(m.d.refusedDesc, prometheus.CounterValue, float64(n), parser))
	}
	if s != nil {
		for f, n := range s.TrackFailures {
			out = append(out, constMetric(m.d.trackFailuresDesc, prometheus.CounterValue, float64(n), f.View, f.Reason))
		}
		for view, st := range s.Views {
			// An absent view is no fault: AutoglmViewDown reads
			// autoglm_view_up == 0, so it has none.
			if st.Absent != "" {
				out = append(out, constMetric(m.d.viewAbsentDesc, prometheus.GaugeValue, 1, view, string(st.Absent)))
				continue
			}
			up := 0.0
			if st.Down == "" {
				up = 1
			}
			out = append(out, constMetric(m.d.viewUpDesc, prometheus.GaugeValue, up, view))
		}
		for view, n := range s.BPFMemory {
			out = append(out, constMetric(m.d.bpfMemoryDesc, prometheus.GaugeValue, float64(n), view))
		}
		if r := s.FDReads; r.PerPoll > 0 { // the fd view is loaded
			out = append(out,
				constMetric(m.d.fdListingsDesc, prometheus.CounterValue, float64(r.Listings)),
				constMetric(m.d.fdCopiesDesc, prometheus.CounterValue, float64(r.Copied)),
				constMetric(m.d.fdDescribedDesc, prometheus.CounterValue, float64(r.Described), "proc"),
				constMetric(m.d.fdDescribedDesc, prometheus.CounterValue, float64(r.Inherited), "parent"),
				constMetric(m.d.fdDeferredDesc, prometheus.CounterValue, float64(r.Deferred)),
				constMetric(m.d.fdReadsBoundDesc, prometheus.GaugeValue, float64(r.PerPoll)),
				constMetric(m.d.shortLivedDesc, prometheus.CounterValue, float64(r.ShortLived)),
				constMetric(m.d.shortLivedFDsDesc, prometheus.CounterValue, float64(r.ShortLivedOpens)))
		}
	}
	for kind, n := range m.total {
		out = append(out, constMetric(m.d.findingsTotalDesc, prometheus.CounterValue, float64(n), kind))
	}
	return out
}

// viewSeries appends the views' series of those of s's processes that have
// series of their own. The caller holds m.mu.
func (m *Metrics) viewSeries(s *model.Snapshot, out []prometheus.Metric) []prometheus.Metric {
	for _, p := range s.Processes {
		own := m.own(s, p.PID)
		id := m.procLabels(p)
		for _, vm := range m.d.views {
			if !own && !vm.EveryProcess {
				continue
			}
			switch vm.Type {
			case model.GaugeMetric:
				vm.Samples(p, func(v float64, labels ...string) {
					out = append(out, constMetric(vm.desc, prometheus.GaugeValue, v, with(id, labels...)...))
				})
			case model.HistogramMetric:
				if h, ok := vm.Histogram(p); ok {
					out = append(out, runqHistogram(vm.desc, h, p.Started, m.classic, id...))
				}
			}
		}
		for k, c := range m.counts[p.PID].counters {
			if !own && !m.d.views[k.metric].EveryProcess {
				continue
			}
			out = append(out, constMetric(m.d.views[k.metric].desc, prometheus.CounterValue, c.v, with(id, c.labels...)...))
		}
	}
	return out
}

func (m *Metrics) findingSeries(s *model.Snapshot, out []prometheus.Metric) []prometheus.Metric {
	// Several findings of one kind and pid (one per FirstSeen) share a
	// series: the highest severity among the active ones, or without any,
	// minus the highest among the ended ones. An ended finding keeps its
	// severity so that a rule can tell one that began and ended between
	// two scrapes, and how serious it was.
	active, ended := map[findingSeries]int{}, map[findingSeries]int{}
	procs := make(map[int]*model.Process, len(s.Processes))
	for _, p := range s.Processes {
		procs[p.PID] = p
	}
	caused := map[findingSeries]bool{} // kind is "kind\x00cause"
	for _, f := range s.Findings {
		// Findings of a process that exited in an earlier snapshot are
		// dropped; those newer than the exit belong to a reused pid.
		if exit, ok := m.gone[f.PID]; ok && exit.Before(s.Time) && !f.FirstSeen.After(exit) {
			continue
		}
		proc := m.procLabels(&model.Process{PID: f.PID, Comm: f.Comm})
		if p := procs[f.PID]; p != nil {
			proc = m.procLabels(p)
		}
		site := ""
		if fr, ok := stack.CallFrame(f.Stack); ok {
			site = label(stack.Function(fr))
		}
		if f.CausedBy != nil {
			// One cause, one finding: this one is the cause's evidence.
			k := findingSeries{kind: label(f.Kind) + "\x00" + label(f.CausedBy.Kind), proc: strings.Join(proc, "\x00")}
			caused[k] = caused[k] || f.Active
			continue
		}
		k := findingSeries{label(f.Kind), site, strings.Join(proc, "\x00")}
		if f.Active {
			active[k] = max(active[k], model.SeverityLevel(f.Severity))
		} else {
			ended[k] = max(ended[k], model.SeverityLevel(f.Severity))
		}
	}
	for k, a := range caused {
		v := 0.0
		if a {
			v = 1
		}
		out = append(out, constMetric(m.d.findingCauseDesc, prometheus.GaugeValue, v, append(strings.Split(k.kind, "\x00"), strings.Split(k.proc, "\x00")...)...))
	}
	for k, l := range ended {
		if _, ok := active[k]; !ok {
			active[k] = -l
		}
	}
	for k, l := range active {
		out = append(out, constMetric(m.d.findingDesc, prometheus.GaugeValue, float64(l), append([]string{k.kind, k.site}, strings.Split(k.proc, "\x00")...)...))
	}
	return out
}

// procNames are the labels of every per-process series, then extra: the pid
// and comm, and with pods, the pod's namespace, name and container name
// (from the API server). Outside a pod those are empty, which Prometheus
// treats as absent. The pod UID and container id, which change at every
// restart, are in autoglm_container_info only.
func procNames(pods bool, extra ...string) []string {
	names := []string{"pid", "comm"}
	if pods {
		names = append(names, "namespace", "pod", "container")
	}
	return append(names, extra...)
}

// procLabels are the values of procNames for p.
func (m *Metrics) procLabels(p *model.Process) []string {
	id := []string{strconv.Itoa(p.PID), label(p.Comm)}
	if m.pods {
		id = append(id, label(p.Pod.Namespace), label(p.Pod.Name), label(p.Pod.Container))
	}
	return id
}

// with returns id followed by extra, made valid label values, in a new
// slice.
func with(id []string, extra ...string) []string {
	out := slices.Clone(id)
	for _, e := range extra {
		out = append(out, label(e))
	}
	return out
}

func constMetric(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, t, v, labels...)
}

// label makes s a valid label value: comm comes from the kernel and may hold
// any bytes, and an invalid value would make the whole scrape fail.
func label(s string) string {
	return strings.ToValidUTF8(s, "\uFFFD")
}

// collector adapts Metrics to prometheus.Collector without putting Describe
// and Collect in the sink's API.
type collector struct{ m *Metrics }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.m.d.all() {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	if c.m.series == nil {
		c.m.series = c.m.render()
	}
	series := c.m.series
	c.m.mu.Unlock()
	// Update replaces the slice instead of changing it, so sending
	// without the lock is safe and does not block the pipeline on a
	// slow scrape.
	for _, s := range series {
		ch <- s
	}
}

// Handler serves the metrics gathered from g in the format the scraper
// asks for (text, OpenMetrics or protobuf, which native histograms need).
// A series that fails to collect is left out instead of failing the scrape.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, EnableOpenMetrics: true})
}
