package report

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/history"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Chart geometry, in SVG user units (pixels at 100 % zoom).
const (
	chartW    = 860
	chartH    = 170
	plotLeft  = 70
	plotRight = chartW - 14
	plotTop   = 24 // room for finding labels
	plotBot   = chartH - 26
)

// chart is one SVG time chart, ready for the template.
type chart struct {
	ID      string // what it shows, e.g. "open_fds"; the DOM's data-chart
	PID     int    // 0 for a GPU chart
	Source  string // whose history, for the page's script: "p3" (processes[3]) or "g0" (gpus[0])
	Title   string
	Unit    string // of the y axis, e.g. "GiB"
	Series  []chartSeries
	XTicks  []tick
	YTicks  []tick
	Lines   []hline // reference lines: the fd limit, a GPU's total memory
	Markers []marker
	Note    string // shown when there is nothing to draw
	W, H    int
	Left    float64
	Right   float64
	Top     float64
	Bottom  float64
	// Positions the template would otherwise compute.
	MidX, MidY, YLabelX, XLabelY float64
}

// PlotW and PlotH are the size of the plot area.
func (c chart) PlotW() float64 { return c.Right - c.Left }
func (c chart) PlotH() float64 { return c.Bottom - c.Top }

// Names and Labels list the series for the page's script.
func (c chart) Names() string {
	var out []string
	for _, s := range c.Series {
		out = append(out, s.Name)
	}
	return strings.Join(out, ",")
}

func (c chart) Labels() string {
	var out []string
	for _, s := range c.Series {
		out = append(out, s.Label)
	}
	return strings.Join(out, "|")
}

// chartSeries is one line (and the band of its least and greatest values
// where they differ from it).
type chartSeries struct {
	Name  string // series name in the report
	Label string
	Band  string // SVG path data; empty when min = max throughout
	Line  string
	Color string
	// BandLabel names the band in the legend when it means more than the
	// spread of merged points (the kernel's high-water mark).
	BandLabel string
}

type tick struct {
	Pos   float64
	Label string
}

type hline struct {
	Y     float64
	Label string
	Off   bool // the value lies above the scale: only the label is shown
}

// marker shows when a finding began and ended.
type marker struct {
	X, W     float64
	LabelY   float64
	Kind     string
	Severity string
	Label    string // "#3 fd_leak"
	Title    string // tooltip
	Href     string // its card
	Instant  bool   // began and ended at one poll: drawn as a line
}

// axis maps times onto the x range shared by every chart of a report.
type axis struct {
	start, end time.Time
}

func (a axis) x(t time.Time) float64 {
	span := a.end.Sub(a.start)
	if span <= 0 {
		return plotLeft
	}
	f := float64(t.Sub(a.start)) / float64(span)
	return plotLeft + math.Max(0, math.Min(1, f))*(plotRight-plotLeft)
}

// ticks are elapsed times since the start at a round step, at most ten.
func (a axis) ticks() []tick {
	span := a.end.Sub(a.start)
	steps := []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
		time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour}
	if span < 0 {
		return nil
	}
	step := time.Duration(0)
	for _, s := range steps {
		if span/s <= 10 {
			step = s
			break
		}
	}
	if step == 0 {
		// Over ten days: whole days. A report's times are its file's to
		// say: a span of centuries must not make millions of ticks, nor
		// (near the largest Duration) wrap the loop around.
		const day = 24 * time.Hour
		step = (span/10/day + 1) * day
	}
	var out []tick
	for i := range span/step + 1 {
		d := i * step
		out = append(out, tick{Pos: a.x(a.start.Add(d)), Label: elapsed(d)})
	}
	return out
}

// elapsed writes d briefly: 45s, 2m30s, 1h, 3h20m.
func elapsed(d time.Duration) string {
	d = d.Round(time.Second)
	h, m, s := int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60
	switch {
	case h > 0 && m > 0:
		return fmt.Sprintf("%dh%02dm", h, m)
	case h > 0:
		return fmt.Sprintf("%dh", h)
	case m > 0 && s > 0:
		return fmt.Sprintf("%dm%02ds", m, s)
	case m > 0:
		return fmt.Sprintf("%dm", m)
	}
	return fmt.Sprintf("%ds", s)
}

// scale maps values in a series' own unit onto the y range, and names the
// unit shown on the axis (bytes are shown in KiB, MiB or GiB, seconds in
// µs, ms or s).
type scale struct {
	max  float64 // top of the axis, in the series' unit
	div  float64 // series unit per shown unit
	unit string
}

func newScale(unit string, top float64) scale {
	sc := scale{max: top, div: 1, unit: unit}
	switch unit {
	case model.UnitBytes:
		sc.div, sc.unit = 1, "bytes"
		for i, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
			if d := math.Pow(1024, float64(i+1)); top >= d {
				sc.div, sc.unit = d, u
			}
		}
	case model.UnitRatio:
		// Shown in percent, on the whole 0-100 range: an idle GPU must
		// look idle, not fill the chart.
		sc.div, sc.unit, top = 0.01, "%", 1
	case model.UnitSeconds:
		sc.div, sc.unit = 1e-6, "µs"
		if top >= 1e-3 {
			sc.div, sc.unit = 1e-3, "ms"
		}
		if top >= 1 {
			sc.div, sc.unit = 1, "s"
		}
	}
	if top <= 0 {
		// Nothing above zero: one of the smallest unit shown.
		sc.max = sc.div
		return sc
	}
	// A round step in the shown unit, and the top at a whole step.
	step := niceStep(top / sc.div / 4)
	sc.max = math.Ceil(top/sc.div/step) * step * sc.div
	return sc
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 || math.IsNaN(x) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

func (sc scale) y(v float64) float64 {
	f := v / sc.max
	return plotBot - math.Max(0, math.Min(1, f))*(plotBot-plotTop)
}

func (sc scale) ticks() []tick {
	step := niceStep(sc.max / sc.div / 4)
	var out []tick
	for v := 0.0; v <= sc.max/sc.div+step/1e6; v += step {
		out = append(out, tick{Pos: sc.y(v * sc.div), Label: number(v)})
	}
	return out
}

// number writes an axis or legend value briefly: 12k, 1.5M, 0.25.
func number(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case a >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64)
}

// plot is one series of one history, resolved for drawing.
type plot struct {
	name, label, color, bandLabel string
	vals, min, max                history.Values
}

// ref is a reference value to draw across a chart, in its series' unit.
type ref struct {
	v     float64
	label string
}

// refReach is how far above the data a reference line may raise the y
// axis: further, and the data would be flattened against the bottom.
const refReach = 4

// newChart draws plots and reference lines on the report's time axis; note
// is shown when no plot has a value.
func newChart(id string, pid int, title, unit, note string, ax axis, times []int64, plots []plot, refs []ref) chart {
	c := chart{ID: id, PID: pid, Title: title, W: chartW, H: chartH, Left: plotLeft, Right: plotRight, Top: plotTop, Bottom: plotBot, XTicks: ax.ticks(),
		MidX: (plotLeft + plotRight) / 2, MidY: (plotTop + plotBot) / 2, YLabelX: plotLeft - 6, XLabelY: plotBot + 16}
	hi, seen := 0.0, false
	for _, p := range plots {
		for i := range p.vals {
			for _, v := range []float64{p.vals[i], p.max[i]} {
				if !math.IsNaN(v) {
					hi, seen = math.Max(hi, v), true
				}
			}
		}
	}
	if !seen {
		c.Note = note
	}
	top := hi
	for _, r := range refs {
		if hi == 0 || r.v <= refReach*hi {
			top = math.Max(top, r.v)
		}
	}
	sc := newScale(unit, top)
	c.Unit, c.YTicks = sc.unit, sc.ticks()
	for _, r := range refs {
		if r.v > sc.max {
			c.Lines = append(c.Lines, hline{Y: plotTop + 16, Label: r.label + " (above the scale)", Off: true})
		} else {
			c.Lines = append(c.Lines, hline{Y: sc.y(r.v), Label: r.label})
		}
	}
	xs := make([]float64, len(times))
	for i, ms := range times {
		xs[i] = ax.x(time.UnixMilli(ms))
	}
	for _, p := range plots {
		s := chartSeries{Name: p.name, Label: p.label, Color: p.color, BandLabel: p.bandLabel}
		s.Line = linePath(xs, p.vals, sc)
		s.Band = bandPath(xs, p.min, p.max, sc)
		c.Series = append(c.Series, s)
	}
	return c
}

// addMarker marks a finding from x0 to x1, its label on the first of two
// rows above the plot where it does not run into the previous one.
func (c *chart) addMarker(m marker, x0, x1 float64) {
	m.X, m.W = x0, x1-x0
	if m.W < 2 {
		m.Instant, m.X, m.W = true, x0-1, 2
	}
	rows := []float64{plotTop - 13, plotTop - 3}
	m.LabelY = rows[0]
	for _, y := range rows {
		if !slices.ContainsFunc(c.Markers, func(o marker) bool {
			return o.LabelY == y && m.X < o.X+labelWidth(o.Label)+4 && o.X < m.X+labelWidth(m.Label)+4
		}) {
			m.LabelY = y
			break
		}
	}
	c.Markers = append(c.Markers, m)
}

// labelWidth estimates the width of a marker label at 11px.
func labelWidth(s string) float64 { return 6.5 * float64(len(s)) }

// linePath joins the points that have a value; a missing value breaks the
// line.
func linePath(xs []float64, vals history.Values, sc scale) string {
	var b strings.Builder
	pen := false
	for i, v := range vals {
		if i >= len(xs) || math.IsNaN(v) {
			pen = false
			continue
		}
		if pen {
			b.WriteByte('L')
		} else {
			b.WriteByte('M')
		}
		writeXY(&b, xs[i], sc.y(v))
		pen = true
	}
	return b.String()
}

// bandPath is the area between min and max, one closed shape per stretch
// with values, left out where they are equal throughout (full resolution).
func bandPath(xs []float64, lo, hi history.Values, sc scale) string {
	var b strings.Builder
	i := 0
	for i < len(lo) && i < len(hi) && i < len(xs) {
		if math.IsNaN(lo[i]) || math.IsNaN(hi[i]) {
			i++
			continue
		}
		j, spread := i, false
		for j < len(lo) && j < len(hi) && j < len(xs) && !math.IsNaN(lo[j]) && !math.IsNaN(hi[j]) {
			spread = spread || hi[j] != lo[j]
			j++
		}
		if spread {
			b.WriteByte('M')
			for k := i; k < j; k++ {
				if k > i {
					b.WriteByte('L')
				}
				writeXY(&b, xs[k], sc.y(hi[k]))
			}
			for k := j - 1; k >= i; k-- {
				b.WriteByte('L')
				writeXY(&b, xs[k], sc.y(lo[k]))
			}
			b.WriteByte('Z')
		}
		i = j
	}
	return b.String()
}

func writeXY(b *strings.Builder, x, y float64) {
	b.WriteString(strconv.FormatFloat(math.Round(x*10)/10, 'f', -1, 64))
	b.WriteByte(' ')
	b.WriteString(strconv.FormatFloat(math.Round(y*10)/10, 'f', -1, 64))
}
