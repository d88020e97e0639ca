package model

// Finding kinds of the scheduler view, as they appear in reports, metrics and
// --fail-on.
const (
	KindCtxSwitchStorm = "ctx_switch_storm"
)

// SchedStats is the scheduler view of one process at one instant.
type SchedStats struct {
	Voluntary   uint64        // context switches since attach, all threads (monotonic)
	Involuntary uint64        // preemptions since attach, all threads (monotonic)
	Threads     []ThreadSched // per-thread totals, busiest first
	AllowedCPUs int           // CPUs in the process's affinity mask
	RunqLatency Histogram     // wake-up to on-CPU latency, cumulative since attach
}

// ThreadSched is one thread's context switches since attach.
type ThreadSched struct {
	TID         int
	Name        string
	Voluntary   uint64
	Involuntary uint64
}

// CtxSwitchStormEvidence is a ctx_switch_storm's evidence.
type CtxSwitchStormEvidence struct {
	AllowedCPUs int `json:"allowed_cpus"`
	// BaselineMean is nil until an interval has been learnt.
	BaselineMean         *float64 `json:"baseline_mean"`
	Hint                 string   `json:"hint"`
	InvoluntaryPerSecond float64  `json:"involuntary_per_second"`
	RatePerSecond        float64  `json:"rate_per_second"`
	// RunqueueP99Seconds is nil when nothing waited in the window.
	RunqueueP99Seconds    *float64     `json:"runqueue_p99_seconds"`
	RunqueueWindowSeconds float64      `json:"runqueue_window_seconds"`
	Threads               int          `json:"threads"`
	ThresholdPerSecond    float64      `json:"threshold_per_second"`
	TopThreads            []ThreadRate `json:"top_threads"`
	VoluntaryPerSecond    float64      `json:"voluntary_per_second"`
	VoluntaryRatio        float64      `json:"voluntary_ratio"`
}

// ThreadRate is a thread's context switches per second.
type ThreadRate struct {
	Name string  `json:"name"`
	Rate float64 `json:"rate"`
	TID  int     `json:"tid"`
}

func (e CtxSwitchStormEvidence) EvidenceKind() string { return KindCtxSwitchStorm }

func (e CtxSwitchStormEvidence) Card(c Card) {
	c.Rate("rate_per_second", "rate", e.RatePerSecond, "switches/s")
	c.Rate("voluntary_per_second", "voluntary", e.VoluntaryPerSecond, "switches/s")
	c.Rate("involuntary_per_second", "involuntary", e.InvoluntaryPerSecond, "switches/s")
	c.Share("voluntary_ratio", "voluntary share", e.VoluntaryRatio)
	c.Rate("threshold_per_second", "storm threshold", e.ThresholdPerSecond, "switches/s")
	if e.BaselineMean != nil {
		c.Rate("baseline_mean", "baseline", *e.BaselineMean, "switches/s")
	}
	c.Count("threads", "threads", e.Threads)
	c.Count("allowed_cpus", "allowed CPUs", e.AllowedCPUs)
	if e.RunqueueP99Seconds != nil {
		c.Duration("runqueue_p99_seconds", "run-queue p99", *e.RunqueueP99Seconds)
	}
	c.Duration("runqueue_window_seconds", "run-queue window", e.RunqueueWindowSeconds)
	c.Text("hint", "hint", e.Hint)
	var threads []Row
	for _, t := range e.TopThreads {
		threads = append(threads, Row{Cells: []Cell{CountCell(t.TID), TextCell(t.Name), RateCell(t.Rate, "switches/s")}})
	}
	c.Table("top_threads", "top threads", []string{"tid", "name", "rate"}, threads)
}

// The evidence of the view's kinds reads into their structs.
func init() {
	registerEvidence[CtxSwitchStormEvidence]()
}

// The sched view's series in a report's history, and its charts.
const (
	SeriesVoluntarySwitches   = "voluntary_switches_per_second"   // rate
	SeriesInvoluntarySwitches = "involuntary_switches_per_second" // rate
	SeriesRunqueueP99         = "runqueue_p99_seconds"            // the p99 of the waits within each interval

	ChartContextSwitches = "context_switches"
	ChartRunqueue        = "runqueue_p99"
)

// observed says whether the sched view observed p: it always sets the
// bounds, and without them zeros would be made up.
func observed(p *Process) bool { return len(p.Sched.RunqLatency.Bounds) > 0 }

var schedShown = Shown{
	View: "sched",
	Metrics: []Metric{
		{Name: "autoglm_context_switches_total", Help: "Context switches of the process's threads since attach, by type (voluntary: blocked; involuntary: preempted).",
			Type: CounterMetric, Labels: []string{"type"},
			Samples: func(p *Process, add func(float64, ...string)) {
				if observed(p) {
					add(float64(p.Sched.Voluntary), "voluntary")
					add(float64(p.Sched.Involuntary), "involuntary")
				}
			}},
		{Name: "autoglm_runqueue_latency_seconds", Help: "Time the process's threads waited runnable for a CPU, from wake-up or preemption, since attach.",
			Type: HistogramMetric, Histogram: func(p *Process) (Histogram, bool) { return p.Sched.RunqLatency, observed(p) }},
	},
	Figures: []Figure{
		{Name: SeriesVoluntarySwitches, Unit: UnitSwitches, Kind: Rate, Value: func(p *Process) (Range, bool) { return At(float64(p.Sched.Voluntary)), true }},
		{Name: SeriesInvoluntarySwitches, Unit: UnitSwitches, Kind: Rate, Value: func(p *Process) (Range, bool) { return At(float64(p.Sched.Involuntary)), true }},
		{Name: SeriesRunqueueP99, Unit: UnitSeconds, Kind: Quantile, Q: 0.99, Histogram: func(p *Process) Histogram { return p.Sched.RunqLatency }},
	},
	Charts: []Chart{
		{ID: ChartContextSwitches, Title: "Context switches", Unit: UnitSwitches, Rank: 40,
			Lines: []Line{{Series: SeriesVoluntarySwitches, Label: "voluntary", Color: "purple"}, {Series: SeriesInvoluntarySwitches, Label: "involuntary", Color: "orange"}},
			// A straggling NCCL rank's threads keep switching where they
			// wait (a loader's sleeps), or stop switching where blocked.
			Marks: []string{KindCtxSwitchStorm, KindNCCLStraggler, KindNCCLHang}},
		{ID: ChartRunqueue, Title: "Run-queue latency, p99 of each interval", Unit: UnitSeconds, Empty: "no run-queue waits seen", Rank: 50,
			Lines: []Line{{Series: SeriesRunqueueP99, Label: "p99 wait", Color: "teal"}}},
	},
	Columns: []Column{{Head: "CS/S", Count: func(p *Process) uint64 { return p.Sched.Voluntary + p.Sched.Involuntary }}},
}
