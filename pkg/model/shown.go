package model

import "fmt"

// What a view shows of each process besides its findings, declared with
// the view's data so that the sinks need no code of their own for it: its
// series on /metrics, the figures pkg/history records at every poll, the
// charts the HTML report draws from them, and its part of the terminal
// view. Shows (model.go) lists every view's; a new view adds its Shown
// there.

// FigureKind says how a figure is measured at each poll.
type FigureKind int

const (
	// Gauge is a value at the poll, with the least and most since the
	// previous poll where the view knows them.
	Gauge FigureKind = iota
	// Rate is a monotonic count: the history records its events per
	// second over each interval.
	Rate
	// Quantile is a cumulative histogram: the history records the
	// quantile Q of what was added to it in each interval.
	Quantile
)

// Range is a gauge's value at a poll, and its least and most since the
// previous poll.
type Range struct{ Min, Max, Last float64 }

// At is the range of a value known at polls only.
func At(v float64) Range { return Range{v, v, v} }

// Figure is one series of a process's history.
type Figure struct {
	// Name is the series' name in the report's history; for a family
	// (Members), the prefix of its members' names.
	Name string
	Unit string // see the Unit constants
	Kind FigureKind
	// Value is p's figure at this poll: a Gauge's range, or a Rate's
	// count as Last; false when the view did not measure it for p.
	Value func(p *Process) (Range, bool)
	// Histogram and Q make a Quantile.
	Histogram func(p *Process) Histogram
	Q         float64
	// Members makes a family of gauges, one series per member named
	// Name+member (TCP sockets by state): their values at this poll, the
	// members without any left out. A member once seen stays a series,
	// 0 while absent, so that a chart shows it going away.
	Members func(p *Process) map[string]int
}

// Units of figures.
const (
	UnitFDs      = "fds"
	UnitFDRate   = "fds/s"
	UnitSwitches = "switches/s"
	UnitSeconds  = "seconds"
	UnitBytes    = "bytes"
	UnitSockets  = "sockets"
	UnitRatio    = "ratio" // 0..1
)

// Chart is a chart of the HTML report's process section, drawn from the
// process's history.
type Chart struct {
	ID    string // its anchor and class in the page
	Title string
	Unit  string
	// Empty is said in place of the chart when none of its series has a
	// point; "" says "no data".
	Empty string
	// Optional charts are drawn only for processes with one of their
	// series (GPU memory for processes that use a GPU).
	Optional bool
	// FDLimit draws the process's fd limit as a reference line.
	FDLimit bool
	Lines   []Line
	// Marks are the finding kinds marked on this chart: each kind on one.
	Marks []string
	// Rank orders the charts of a process: lowest first.
	Rank int
}

// Line is one series on a chart.
type Line struct {
	Series string // the Figure's name (a family member's full name)
	Label  string
	Color  string // one of Colors
	Band   string // what the band between a point's least and most means; "": none drawn
}

// Colors are the colour names a Line may use; the report maps them to
// colours readable on white and told apart by most colour vision
// deficiencies when paired as used.
var Colors = []string{"blue", "orange", "green", "purple", "teal", "red", "grey", "pink", "brown"}

// Column is a column of the live terminal table: the per-second rate of a
// monotonic count since the previous poll.
type Column struct {
	Head  string
	Count func(p *Process) uint64
}

// Shown is what one view shows of each process besides its findings.
type Shown struct {
	View    string // as in Views
	Metrics []Metric
	Figures []Figure
	Charts  []Chart
	Columns []Column
	// State is p's figures for the terminal log's line ("" when none):
	// a change in it prints a new line.
	State func(p *Process) string
	// Line is a line about p under the live table and in the summary
	// ("" when none).
	Line func(p *Process) string
}

// Figures returns every view's figures.
func Figures() []Figure {
	var out []Figure
	for _, s := range Shows {
		out = append(out, s.Figures...)
	}
	return out
}

// MetricType is the type of a view's metric on /metrics.
type MetricType int

const (
	// CounterMetric is monotonic: /metrics never shows it lower than it
	// did for the process (a source handing over less is not a reset).
	CounterMetric MetricType = iota
	GaugeMetric
	// HistogramMetric is a cumulative histogram whose bounds are powers
	// of two of a second, exported as a native histogram.
	HistogramMetric
)

// Metric is a per-process metric a view exports on /metrics: its series
// carry the process's labels, then Labels.
type Metric struct {
	Name, Help string
	Type       MetricType
	Labels     []string
	// Samples calls add with each of p's values and the values of Labels;
	// nothing when the view did not observe p (p then has no series).
	Samples func(p *Process, add func(v float64, labels ...string))
	// Histogram is p's histogram, for a HistogramMetric; false when the
	// view did not observe p.
	Histogram func(p *Process) (Histogram, bool)
	// EveryProcess is a figure served for every process that has it, in
	// either granularity, and never summed: what a rule compares process
	// by process (an NCCL rank's progress against its communicator's
	// other ranks), whose series are few (one per rank and communicator).
	EveryProcess bool
	// OwnOnly is a figure of each process that means nothing summed (a
	// limit): it has no per-container series.
	OwnOnly bool
}

// each adds every count of m, labelled with its key.
func each(m map[string]uint64, add func(float64, ...string)) {
	for k, n := range m {
		add(float64(n), k)
	}
}

// Sum adds up a map of counts.
func Sum(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

// IEC renders a byte count with a binary unit, e.g. "1.5 GiB".
func IEC(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTP"[exp])
}
