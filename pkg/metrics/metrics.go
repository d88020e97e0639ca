// Package metrics exports snapshots as Prometheus metrics.
//
// Every series is rebuilt from the latest snapshot, so a process that exited
// disappears from the exposition one snapshot after the one that reported its
// exit, which keeps cardinality bounded by the live targets.
package metrics

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var (
	openFDsDesc = prometheus.NewDesc("autoglm_open_fds",
		"Live file descriptors of the process.", []string{"pid", "comm"}, nil)
	fdLimitDesc = prometheus.NewDesc("autoglm_fd_limit",
		"Soft RLIMIT_NOFILE of the process.", []string{"pid", "comm"}, nil)
	openedDesc = prometheus.NewDesc("autoglm_fds_opened_total",
		"File descriptors created since attach, by kind.", []string{"pid", "comm", "kind"}, nil)
	closedDesc = prometheus.NewDesc("autoglm_fds_closed_total",
		"File descriptors released since attach, by kind.", []string{"pid", "comm", "kind"}, nil)
	socketsDesc = prometheus.NewDesc("autoglm_sockets",
		"TCP sockets the process holds, by state.", []string{"pid", "comm", "state"}, nil)
	socketFDsDesc = prometheus.NewDesc("autoglm_socket_fds",
		"Socket file descriptors of the process, by kind (tcp, udp, unix, other).", []string{"pid", "comm", "kind"}, nil)
	findingDesc = prometheus.NewDesc("autoglm_finding",
		"1 while a finding is active, 0 once it no longer holds.", []string{"kind", "severity", "pid", "comm"}, nil)
	findingsTotalDesc = prometheus.NewDesc("autoglm_findings_total",
		"Distinct findings that became active, by kind.", []string{"kind"}, nil)
	lostDesc = prometheus.NewDesc("autoglm_bpf_events_lost_total",
		"Lost BPF events and failed map updates, by source.", []string{"source"}, nil)
	buildInfoDesc = prometheus.NewDesc("autoglm_build_info",
		"Always 1; labelled with the version of autoglm-ebpf.", []string{"version"}, nil)
)

// Metrics is a sink that serves the latest snapshot to Prometheus.
type Metrics struct {
	mu        sync.Mutex
	buildInfo prometheus.Metric
	series    []prometheus.Metric // what Collect serves, built by Update

	// High-water marks, so that a counter never goes down even if a source
	// hands over a smaller value: rate() would read that as a counter reset.
	opened, closed map[int]map[string]uint64 // by pid, then fd kind
	lost           map[string]uint64         // by source
	cuda           map[int]cudaCounts        // by pid
	switches       map[int]map[string]uint64 // context switches by pid, then type

	counted map[findingID]bool // findings already in findings_total
	total   map[string]uint64  // findings_total by kind
	// Exited pids and when. Snapshot.Findings keeps every finding forever,
	// so without this an exited process's autoglm_finding series would stay.
	gone map[int]time.Time
}

// findingID identifies one finding across snapshots, as detectors do.
type findingID struct {
	kind      string
	pid       int
	firstSeen int64 // UnixNano: time.Time is not a reliable map key
}

// findingSeries is the label set of one autoglm_finding series.
type findingSeries struct {
	kind, severity, pid, comm string
}

// New creates the metrics and registers them on reg; it panics, like
// prometheus.MustRegister, if reg already holds metrics of the same names.
func New(reg prometheus.Registerer, version string) *Metrics {
	m := &Metrics{
		buildInfo: prometheus.MustNewConstMetric(buildInfoDesc, prometheus.GaugeValue, 1, label(version)),
		opened:    map[int]map[string]uint64{},
		closed:    map[int]map[string]uint64{},
		lost:      map[string]uint64{},
		cuda:      map[int]cudaCounts{},
		switches:  map[int]map[string]uint64{},
		counted:   map[findingID]bool{},
		total:     map[string]uint64{},
		gone:      map[int]time.Time{},
	}
	// Pre-create every kind, so that increase() sees the first finding.
	for _, k := range model.Kinds {
		m.total[k] = 0
	}
	m.series = m.build(nil)
	reg.MustRegister(collector{m})
	return m
}

// Update replaces the exported series with those of s.
func (m *Metrics) Update(s *model.Snapshot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.series = m.build(s)
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
	return &c
}

// build updates the monotonic state from s (nil: none yet) and returns every
// series to serve. The caller holds m.mu.
func (m *Metrics) build(s *model.Snapshot) []prometheus.Metric {
	out := []prometheus.Metric{m.buildInfo}
	if s != nil {
		s = m.current(s)
		out = m.processSeries(s, out)
		out = m.cudaSeries(s, out)
		out = m.schedSeries(s, out)
		out = m.findingSeries(s, out)
		for src, n := range s.Lost {
			m.lost[src] = max(m.lost[src], n)
		}
	}
	for src, n := range m.lost {
		out = append(out, constMetric(lostDesc, prometheus.CounterValue, float64(n), label(src)))
	}
	for kind, n := range m.total {
		out = append(out, constMetric(findingsTotalDesc, prometheus.CounterValue, float64(n), kind))
	}
	return out
}

func (m *Metrics) processSeries(s *model.Snapshot, out []prometheus.Metric) []prometheus.Metric {
	opened := make(map[int]map[string]uint64, len(s.Processes))
	closed := make(map[int]map[string]uint64, len(s.Processes))
	for _, p := range s.Processes {
		pid, comm := strconv.Itoa(p.PID), label(p.Comm)
		out = append(out,
			constMetric(openFDsDesc, prometheus.GaugeValue, float64(p.FD.Open), pid, comm),
			constMetric(fdLimitDesc, prometheus.GaugeValue, float64(p.FD.Limit), pid, comm))
		o := raise(m.opened[p.PID], p.FD.Opened)
		c := raise(m.closed[p.PID], p.FD.Closed)
		for kind, n := range o {
			out = append(out, constMetric(openedDesc, prometheus.CounterValue, float64(n), pid, comm, label(kind)))
		}
		for kind, n := range c {
			out = append(out, constMetric(closedDesc, prometheus.CounterValue, float64(n), pid, comm, label(kind)))
		}
		out = socketSeries(p, pid, comm, out)
		if p.Exited {
			// Served this once (see current); the state goes, so that a
			// reused pid starts from its own counts.
			continue
		}
		opened[p.PID], closed[p.PID] = o, c
	}
	m.opened, m.closed = opened, closed
	return out
}

// socketSeries exports the socket view of p when the socket concern filled
// it: every state and kind, zeros included, so that a count that drops to
// zero reads 0 rather than vanishing.
func socketSeries(p *model.Process, pid, comm string, out []prometheus.Metric) []prometheus.Metric {
	if p.Sock.TCPByState != nil {
		for _, st := range model.TCPStates {
			out = append(out, constMetric(socketsDesc, prometheus.GaugeValue, float64(p.Sock.TCPByState[st]), pid, comm, st))
		}
	}
	if p.Sock.ByKind != nil {
		for _, k := range model.SockKinds {
			out = append(out, constMetric(socketFDsDesc, prometheus.GaugeValue, float64(p.Sock.ByKind[k]), pid, comm, k))
		}
	}
	return out
}

func (m *Metrics) findingSeries(s *model.Snapshot, out []prometheus.Metric) []prometheus.Metric {
	// Several findings of one kind and pid (one per FirstSeen) share a
	// series; it is 1 if any of them is active.
	active := map[findingSeries]bool{}
	for _, f := range s.Findings {
		id := findingID{f.Kind, f.PID, f.FirstSeen.UnixNano()}
		if f.Active && !m.counted[id] {
			m.counted[id] = true
			m.total[f.Kind]++
		}
		// Findings of a process that exited in an earlier snapshot are
		// dropped; those newer than the exit belong to a reused pid.
		if exit, ok := m.gone[f.PID]; ok && exit.Before(s.Time) && !f.FirstSeen.After(exit) {
			continue
		}
		k := findingSeries{label(f.Kind), label(f.Severity), strconv.Itoa(f.PID), label(f.Comm)}
		active[k] = active[k] || f.Active
	}
	for k, a := range active {
		v := 0.0
		if a {
			v = 1
		}
		out = append(out, constMetric(findingDesc, prometheus.GaugeValue, v, k.kind, k.severity, k.pid, k.comm))
	}
	return out
}

// raise returns the element-wise maximum of prev and cur as a new map.
func raise(prev, cur map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(cur))
	for k, v := range prev {
		out[k] = v
	}
	for k, v := range cur {
		out[k] = max(out[k], v)
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
	for _, d := range []*prometheus.Desc{openFDsDesc, fdLimitDesc, openedDesc, closedDesc, socketsDesc, socketFDsDesc, findingDesc, findingsTotalDesc, lostDesc, buildInfoDesc} {
		ch <- d
	}
	for _, d := range cudaDescs {
		ch <- d
	}
	for _, d := range schedDescs {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	series := c.m.series
	c.m.mu.Unlock()
	// Update replaces the slice instead of changing it, so sending
	// without the lock is safe and does not block the pipeline on a
	// slow scrape.
	for _, s := range series {
		ch <- s
	}
}

// Handler serves the metrics gathered from g in the Prometheus text format.
// A series that fails to collect is left out instead of failing the scrape.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
