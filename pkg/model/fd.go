package model

import "time"

// Finding kinds of the fd view, as they appear in reports, metrics and
// --fail-on.
const (
	KindFDLeak      = "fd_leak"
	KindFDExhausted = "fd_exhausted"
)

// FD kinds as reported by the fd source; the order matches the BPF enum fd_kind.
var FDKinds = []string{"other", "file", "socket", "pipe", "eventfd", "epoll", "timerfd", "signalfd", "inotify", "pidfd", "memfd"}

// FDSite groups the live fds of a process by the user stack that opened them.
type FDSite struct {
	StackID int64       // BPF stack id; negative when unknown (seeded from /proc, or stack map full)
	Stack   []Frame     // symbolized frames, innermost first
	Opened  []time.Time // open time of each live fd opened here
	FDs     []int32     // the fd numbers, in the order of Opened
	// Since tracking began (monotonic), from the kernel's per-site
	// counters; a close counts for the site that opened the fd.
	OpenedTotal, ClosedTotal uint64
}

// FDStats is the fd view of one process at one instant.
type FDStats struct {
	Open int // live fds in the kernel table
	// OpenSockets is how many of them are sockets.
	OpenSockets int
	Limit       uint64            // soft RLIMIT_NOFILE
	Opened      map[string]uint64 // fds created since attach, by kind (monotonic)
	Closed      map[string]uint64 // fds released since attach, by kind (monotonic)
	Sites       []FDSite          // live fds by opening stack; sites with a known stack only
	// PastSites are the sites that opened fds since attach and hold none
	// now (OpenedTotal and ClosedTotal only): the most opened first, in
	// that order and with their stacks, as many as the pipeline symbolizes
	// (Config.TopSites), then the others in no order.
	PastSites []FDSite
	// Failed counts the fd-creating calls that failed because the process
	// (EMFILE) or the system (ENFILE) was out of fds, since attach, by
	// errno name (FDErrnos; monotonic).
	Failed map[string]uint64
	// LastFailure is the latest of those calls; nil when there was none.
	LastFailure *FDFailure
	// OpenAtAttach is how many fds the process held when watching began
	// (from /proc): one at its limit then was out of fds before any call
	// could be seen failing.
	OpenAtAttach int
}

// FDErrnos name the errnos of FDStats.Failed; the order matches the BPF
// enum fd_fail.
var FDErrnos = []string{"EMFILE", "ENFILE"}

// FDFailure is an fd-creating call that failed for want of fds.
type FDFailure struct {
	Time    time.Time
	Kind    string  // the kind of fd it tried to create (FDKinds)
	StackID int64   // its call site, numbered as FDSite.StackID
	Stack   []Frame // symbolized frames, innermost first
}

// FDReads counts, since the start, how the fd view learnt the fds of the
// processes it watches (monotonic): listings of /proc/PID/fd, fds described
// one by one (a readlink each), fds taken from the parent's table by a
// child tracked from its fork, and descriptions put off to a later poll by
// the per-poll bound (an fd put off at two polls counts twice). Children
// tracked from fork that were gone before any poll took them are counted
// with the fds they opened, and cost no /proc read.
type FDReads struct {
	Listings, Described, Inherited, Deferred uint64
	// Copied counts children whose fds came from the kernel's copy of
	// their open-fd bitmap (taken at fork and at exec), not a listing.
	Copied uint64
	// PerPoll is the bound on descriptions a poll, node-wide.
	PerPoll                     int
	ShortLived, ShortLivedOpens uint64
}

// FDLeakEvidence is an fd_leak's evidence.
type FDLeakEvidence struct {
	ClosedByKind    map[string]uint64 `json:"closed_by_kind"`
	GrowthPerSecond float64           `json:"growth_fds_per_second"`
	// LeakedTargets is what the top site's fds point at, set by the fd
	// view (fdtrack's Annotate) once it has read them.
	LeakedTargets    []LeakedTarget    `json:"leaked_targets,omitempty"`
	Limit            uint64            `json:"limit"`
	OpenFDs          int               `json:"open_fds"`
	OpenedByKind     map[string]uint64 `json:"opened_by_kind"`
	TimeScaleSeconds float64           `json:"time_scale_seconds"`
	// TimeToExhaustionSeconds is nil when the fds do not grow towards a
	// known limit.
	TimeToExhaustionSeconds *float64     `json:"time_to_exhaustion_seconds"`
	TopSites                []FDLeakSite `json:"top_sites"`
	WindowSeconds           float64      `json:"window_seconds"`
}

// FDLeakSite is a call site whose fds stay open.
type FDLeakSite struct {
	OldestAgeSeconds  float64 `json:"oldest_age_seconds"`
	Stack             []Frame `json:"stack"`
	UnclosedFDs       int     `json:"unclosed_fds"`
	UnclosedFDsGrowth int     `json:"unclosed_fds_growth"`
}

// LeakedTarget is a group of leaked fds by what they point at.
type LeakedTarget struct {
	FDs    int    `json:"fds"`
	Target string `json:"target"`
}

func (e FDLeakEvidence) EvidenceKind() string { return KindFDLeak }

func (e FDLeakEvidence) Card(c Card) {
	c.Count("open_fds", "open fds", e.OpenFDs)
	c.CountUint64("limit", "fd limit", e.Limit)
	c.Rate("growth_fds_per_second", "growth", e.GrowthPerSecond, "fds/s")
	if e.TimeToExhaustionSeconds != nil {
		c.Duration("time_to_exhaustion_seconds", "time to limit", *e.TimeToExhaustionSeconds)
	}
	c.Duration("window_seconds", "window", e.WindowSeconds)
	c.Duration("time_scale_seconds", "time scale", e.TimeScaleSeconds)
	c.Counts("opened_by_kind", "opened", e.OpenedByKind)
	c.Counts("closed_by_kind", "closed", e.ClosedByKind)
	var sites []Row
	for _, s := range e.TopSites {
		sites = append(sites, Row{Cells: []Cell{CountCell(s.UnclosedFDs), ChangeCell(s.UnclosedFDsGrowth), DurationCell(s.OldestAgeSeconds)}, Stack: s.Stack})
	}
	c.Table("top_sites", "top sites", []string{"unclosed fds", "growth", "oldest"}, sites)
	var targets []Row
	for _, t := range e.LeakedTargets {
		targets = append(targets, Row{Cells: []Cell{TextCell(t.Target), CountCell(t.FDs)}})
	}
	c.Table("leaked_targets", "leaked fds point at", []string{"target", "fds"}, targets)
}

// FDExhaustedEvidence is an fd_exhausted's evidence.
type FDExhaustedEvidence struct {
	AtLimit         bool   `json:"at_limit"`
	AtLimitAtAttach bool   `json:"at_limit_at_attach"`
	Errno           string `json:"errno"`
	// FailingCall is nil until an fd-creating call failed.
	FailingCall       *FailingCall      `json:"failing_call"`
	FailuresPerSecond float64           `json:"failures_per_second"`
	FailuresTotal     map[string]uint64 `json:"failures_total"`
	Limit             uint64            `json:"limit"`
	OpenFDs           int               `json:"open_fds"`
	TopSites          []FDHoldingSite   `json:"top_sites"`
	UnattributedFDs   int               `json:"unattributed_fds"`
}

// FailingCall is the latest fd-creating call that failed.
type FailingCall struct {
	Kind       string  `json:"kind"` // of fd it tried to create (FDKinds)
	SecondsAgo float64 `json:"seconds_ago"`
	Stack      []Frame `json:"stack"`
}

// FDHoldingSite is a call site holding fds.
type FDHoldingSite struct {
	FDs              int     `json:"fds"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	Stack            []Frame `json:"stack"`
}

func (e FDExhaustedEvidence) EvidenceKind() string { return KindFDExhausted }

func (e FDExhaustedEvidence) Card(c Card) {
	c.Count("open_fds", "open fds", e.OpenFDs)
	c.CountUint64("limit", "fd limit", e.Limit)
	c.YesNo("at_limit", "at the limit", e.AtLimit)
	c.YesNo("at_limit_at_attach", "at the limit at attach", e.AtLimitAtAttach)
	c.Text("errno", "errno", e.Errno)
	c.Counts("failures_total", "failed calls", e.FailuresTotal)
	c.Rate("failures_per_second", "failures", e.FailuresPerSecond, "calls/s")
	c.Count("unattributed_fds", "fds without a site", e.UnattributedFDs)
	if f := e.FailingCall; f != nil {
		c.Table("failing_call", "failing call", []string{"fd kind", "when"},
			[]Row{{Cells: []Cell{TextCell(f.Kind), AgoCell(f.SecondsAgo)}, Stack: f.Stack}})
	}
	var sites []Row
	for _, s := range e.TopSites {
		sites = append(sites, Row{Cells: []Cell{CountCell(s.FDs), DurationCell(s.OldestAgeSeconds)}, Stack: s.Stack})
	}
	c.Table("top_sites", "top sites", []string{"fds", "oldest"}, sites)
}

// The evidence of the view's kinds reads into their structs.
func init() {
	registerEvidence[FDLeakEvidence]()
	registerEvidence[FDExhaustedEvidence]()
}

// The fd view's series in a report's history, and its charts.
const (
	SeriesOpenFDs   = "open_fds"              // gauge, fds
	SeriesFDsOpened = "fds_opened_per_second" // rate, all kinds together
	SeriesFDsClosed = "fds_closed_per_second" // rate

	ChartOpenFDs = "open_fds"
	ChartFDRates = "fd_rates"
)

var fdShown = Shown{
	View: "fd",
	Metrics: []Metric{
		{Name: "autoglm_open_fds", Help: "Live file descriptors of the process.", Type: GaugeMetric,
			Samples: func(p *Process, add func(float64, ...string)) { add(float64(p.FD.Open)) }},
		{Name: "autoglm_fd_limit", Help: "Soft RLIMIT_NOFILE of the process.", Type: GaugeMetric, OwnOnly: true,
			Samples: func(p *Process, add func(float64, ...string)) { add(float64(p.FD.Limit)) }},
		{Name: "autoglm_fds_opened_total", Help: "File descriptors created since attach, by kind.", Type: CounterMetric, Labels: []string{"kind"},
			Samples: func(p *Process, add func(float64, ...string)) { each(p.FD.Opened, add) }},
		{Name: "autoglm_fds_closed_total", Help: "File descriptors released since attach, by kind.", Type: CounterMetric, Labels: []string{"kind"},
			Samples: func(p *Process, add func(float64, ...string)) { each(p.FD.Closed, add) }},
		// Set by the fd view with every errno, zeros included.
		{Name: "autoglm_fd_create_failures_total", Help: "fd-creating calls that failed since attach because the process (EMFILE) or the system (ENFILE) was out of fds.",
			Type: CounterMetric, Labels: []string{"errno"},
			Samples: func(p *Process, add func(float64, ...string)) { each(p.FD.Failed, add) }},
	},
	Figures: []Figure{
		{Name: SeriesOpenFDs, Unit: UnitFDs, Kind: Gauge, Value: func(p *Process) (Range, bool) { return At(float64(p.FD.Open)), true }},
		{Name: SeriesFDsOpened, Unit: UnitFDRate, Kind: Rate, Value: func(p *Process) (Range, bool) { return At(float64(Sum(p.FD.Opened))), true }},
		{Name: SeriesFDsClosed, Unit: UnitFDRate, Kind: Rate, Value: func(p *Process) (Range, bool) { return At(float64(Sum(p.FD.Closed))), true }},
	},
	Charts: []Chart{
		{ID: ChartOpenFDs, Title: "Open file descriptors", Unit: UnitFDs, FDLimit: true, Rank: 0,
			Lines: []Line{{Series: SeriesOpenFDs, Label: "open fds", Color: "blue"}},
			Marks: []string{KindFDLeak, KindFDExhausted}},
		{ID: ChartFDRates, Title: "File descriptors opened and closed", Unit: UnitFDRate, Rank: 30,
			Lines: []Line{{Series: SeriesFDsOpened, Label: "opened", Color: "green"}, {Series: SeriesFDsClosed, Label: "closed", Color: "grey"}}},
	},
}
