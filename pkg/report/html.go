package report

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/atomicfile"
	"github.com/open-autoglm/autoglm-ebpf/pkg/history"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// The page is one file with everything inline (CSS, SVG, a small script, the
// report itself as JSON): it opens offline, from a mail attachment or a CI
// artifact, in any browser. html/template escapes what the traced process
// controls (comm, stacks, summaries).
//
//go:embed report.html.tmpl
var pageSource string

var pageTemplate = template.Must(template.New("report").Parse(pageSource))

// ChartDeviceMemory is the chart of a GPU's memory; a process's charts
// are its views' (model.Shows), their ids the DOM's data-chart.
const ChartDeviceMemory = "gpu_device_memory"

// charts are every view's charts of a process, in page order.
var charts = func() []model.Chart {
	var out []model.Chart
	for _, s := range model.Shows {
		out = append(out, s.Charts...)
	}
	slices.SortStableFunc(out, func(a, b model.Chart) int { return a.Rank - b.Rank })
	return out
}()

// chartOf is the chart on which a finding of each kind is marked.
var chartOf = func() map[string]string {
	out := map[string]string{}
	for _, c := range charts {
		for _, k := range c.Marks {
			out[k] = c.ID
		}
	}
	return out
}()

// Colours of the series, readable on white and told apart by most colour
// vision deficiencies when paired as used here.
const (
	blue   = "#2563eb"
	orange = "#ea580c"
	green  = "#16a34a"
	purple = "#9333ea"
	teal   = "#0d9488"
	red    = "#dc2626"
	grey   = "#64748b"
	pink   = "#db2777"
	brown  = "#a16207"
)

// colors are those of model.Colors' names.
var colors = map[string]string{"blue": blue, "orange": orange, "green": green, "purple": purple, "teal": teal, "red": red, "grey": grey, "pink": pink, "brown": brown}

// WriteHTMLFile renders r into path, replaced atomically.
func WriteHTMLFile(path string, r *Report) error {
	var buf bytes.Buffer
	if err := WriteHTML(&buf, r); err != nil {
		return err
	}
	return atomicfile.Write(path, buf.Bytes())
}

// WriteHTML renders r as a self-contained HTML page. The page is built from
// r as its JSON file holds it, so that a report rendered at the end of a
// run and one rendered later from its file are the same page.
func WriteHTML(w io.Writer, r *Report) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	var saved Report
	if err := json.Unmarshal(data, &saved); err != nil {
		return err
	}
	return pageTemplate.Execute(w, buildPage(&saved, data))
}

// Read loads a JSON report written by autoglm-ebpf.
func Read(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r, err := Decode(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// Decode reads a JSON report written by autoglm-ebpf from data.
func Decode(data []byte) (*Report, error) {
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("not a valid JSON report: %w", err)
	}
	// Every report has a start and a processes list, even an empty one.
	if r.Start.IsZero() || r.Processes == nil {
		return nil, errors.New("not an autoglm-ebpf report (no start or processes)")
	}
	if r.SchemaVersion > SchemaVersion {
		return nil, fmt.Errorf("report format %d is newer than this autoglm-ebpf reads (%d)", r.SchemaVersion, SchemaVersion)
	}
	for _, p := range r.Processes {
		if err := checkHistory(p.History); err != nil {
			return nil, fmt.Errorf("history of process %d: %w", p.PID, err)
		}
	}
	for _, g := range r.GPUs {
		if err := checkHistory(g.History); err != nil {
			return nil, fmt.Errorf("history of GPU %d: %w", g.Index, err)
		}
	}
	return &r, nil
}

// checkHistory refuses a history whose columns do not hold one value per
// point, as every history written does: the charts, here and in the page's
// script, read them by point.
func checkHistory(h *history.History) error {
	if h == nil {
		return nil
	}
	n := len(h.Time)
	if len(h.Span) != n {
		return fmt.Errorf("%d spans for %d points", len(h.Span), n)
	}
	for _, name := range slices.Sorted(maps.Keys(h.Series)) {
		s := h.Series[name]
		if s == nil {
			continue
		}
		// Last or Mean, whichever the series has; Min and Max always.
		for _, c := range []struct {
			name     string
			vals     history.Values
			optional bool
		}{{"min", s.Min, false}, {"max", s.Max, false}, {"last", s.Last, true}, {"mean", s.Mean, true}} {
			if len(c.vals) != n && !(c.optional && len(c.vals) == 0) {
				return fmt.Errorf("series %s: %d %s values for %d points", name, len(c.vals), c.name, n)
			}
		}
	}
	return nil
}

// page is what the template shows.
type page struct {
	Title     string
	Version   string
	Start     string
	End       string
	Duration  string
	Targets   string
	Lost      []kv
	Findings  []findingView
	GPUs      []chart
	Processes []procView
	NoHistory bool // a report from before history was recorded
	Data      json.RawMessage
}

type kv struct{ Key, Value string }

type findingView struct {
	N        int
	Anchor   string
	Kind     string
	Severity string
	PID      int
	Comm     string
	Active   bool
	First    string // clock time
	Last     string
	Span     string // "+12s → +25s"
	Summary  string
	Stack    []string
	Evidence []evRow
	first    time.Time
	last     time.Time
}

type procView struct {
	PID      int
	Comm     string
	Anchor   string
	Exited   bool
	Facts    []kv
	Charts   []chart
	Flames   []flame
	Findings []findingView
	Waits    *evTable // host waits on the GPU by call site; nil without any
}

func buildPage(r *Report, data []byte) *page {
	loc := r.Start.Location()
	clock := func(t time.Time) string { return t.In(loc).Format("15:04:05") }
	ax := axis{start: r.Start, end: r.End}
	pg := &page{
		Title:    "autoglm-ebpf report",
		Version:  r.Version,
		Start:    r.Start.In(loc).Format("2006-01-02 15:04:05 -07:00"),
		End:      r.End.In(loc).Format("2006-01-02 15:04:05 -07:00"),
		Duration: elapsed(r.End.Sub(r.Start)),
		Data:     data,
	}
	var targets []string
	for _, t := range r.Targets {
		targets = append(targets, strconv.Itoa(t))
	}
	pg.Targets = strings.Join(targets, ", ")
	for _, k := range slices.Sorted(maps.Keys(r.LostEvents)) {
		if n := r.LostEvents[k]; n > 0 {
			pg.Lost = append(pg.Lost, kv{k, strconv.FormatUint(n, 10)})
		}
	}
	for i, f := range r.Findings {
		fv := findingView{
			N: i + 1, Anchor: fmt.Sprintf("finding-%d", i+1), Kind: f.Kind, Severity: f.Severity, PID: f.PID, Comm: f.Comm,
			Active: f.Active, First: clock(f.FirstSeen), Last: clock(f.LastSeen), Summary: f.Summary, Stack: frameTexts(f.Stack),
			Span:  "+" + elapsed(f.FirstSeen.Sub(r.Start)) + " → +" + elapsed(f.LastSeen.Sub(r.Start)),
			first: f.FirstSeen, last: f.LastSeen,
		}
		fv.Evidence = evidenceRows(f.Evidence, clock)
		pg.Findings = append(pg.Findings, fv)
	}
	for gi, g := range r.GPUs {
		if g.History == nil {
			continue
		}
		h := g.History
		s := h.Series[history.MemoryUsedBytes]
		if s == nil {
			continue
		}
		var refs []ref
		if g.MemoryTotalBytes > 0 {
			refs = append(refs, ref{float64(g.MemoryTotalBytes), "total " + bytesText(g.MemoryTotalBytes)})
		}
		title := fmt.Sprintf("GPU %s %s: device memory used", model.DeviceLabel(g.Index, g.MIGDevice), g.Name)
		c := newChart(ChartDeviceMemory, 0, title, model.UnitBytes, "no samples", ax, h.Time,
			[]plot{{name: history.MemoryUsedBytes, label: "used (NVML)", color: teal, vals: s.Last, min: s.Min, max: s.Max, bandLabel: "least–most of the samples"}},
			refs)
		c.Source = fmt.Sprintf("g%d", gi)
		pg.GPUs = append(pg.GPUs, c)
	}
	for i, p := range r.Processes {
		pv := procView{PID: p.PID, Comm: p.Comm, Exited: p.Exited, Anchor: fmt.Sprintf("process-%d-%d", i, p.PID)}
		pv.Facts = facts(&p)
		pv.Findings = findingsOf(pg.Findings, r.Processes, i)
		if p.History == nil {
			pg.NoHistory = true
		}
		pv.Charts = processCharts(&p, ax, pv.Findings)
		var own []model.Finding
		for _, f := range pv.Findings {
			own = append(own, r.Findings[f.N-1])
		}
		pv.Flames = processFlames(&p, own, clock)
		pv.Waits = waitTable(p.Sites)
		for j := range pv.Charts {
			pv.Charts[j].Source = fmt.Sprintf("p%d", i)
		}
		pg.Processes = append(pg.Processes, pv)
	}
	return pg
}

// findingsOf returns the findings about the i-th process: its pid, first
// seen after it was watched and before a later process with the same pid.
func findingsOf(all []findingView, procs []Process, i int) []findingView {
	p := procs[i]
	var out []findingView
	for _, f := range all {
		if f.PID != p.PID || f.first.Before(p.Started) {
			continue
		}
		later := slices.ContainsFunc(procs[i+1:], func(q Process) bool {
			return q.PID == p.PID && !f.first.Before(q.Started)
		})
		if !later {
			out = append(out, f)
		}
	}
	return out
}

func facts(p *Process) []kv {
	out := []kv{
		{"open fds", fmt.Sprintf("%d of %d", p.OpenFDs, p.FDLimit)},
		{"fds opened / closed", fmt.Sprintf("%d / %d", total(p.FDsOpened), total(p.FDsClosed))},
		{"context switches", fmt.Sprintf("%d voluntary, %d involuntary", p.ContextSwitches.Voluntary, p.ContextSwitches.Involuntary)},
	}
	if p.RunqueueP99Seconds != nil {
		out = append(out, kv{"run-queue p99", secondsText(*p.RunqueueP99Seconds)})
	}
	if c := p.CUDA; c != nil {
		out = append(out, kv{"GPU memory live", bytesText(c.LiveBytes)})
		if c.NVMLUsedBytes != nil {
			out = append(out, kv{"GPU memory per NVML", bytesText(*c.NVMLUsedBytes)})
		}
		if c.Failures > 0 {
			out = append(out, kv{"failed GPU allocations", strconv.Itoa(c.Failures)})
		}
	}
	if n := p.NCCL; n != nil {
		for _, c := range n.Comms {
			var calls uint64
			for _, v := range c.Calls {
				calls += v
			}
			what := fmt.Sprintf("rank %d of %d, %d collectives", c.Rank, c.NRanks, calls)
			if c.LastTime != nil {
				what += fmt.Sprintf(", last %s at %s", c.LastOp, c.LastTime.Format("15:04:05.000"))
			}
			if c.Destroyed {
				what += " (destroyed)"
			}
			id := c.ID
			if id == "" {
				id = "(set up before tracking)"
			}
			out = append(out, kv{"NCCL communicator " + id, what})
		}
	}
	if p.Exited {
		out = append(out, kv{"state", "exited"})
	}
	return out
}

func total(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

// processCharts draws the charts of p, with its findings marked on the
// chart of their kind.
func processCharts(p *Process, ax axis, findings []findingView) []chart {
	h := p.History
	if h == nil {
		h = &history.History{}
	}
	get := func(l model.Line) []plot {
		s := h.Series[l.Series]
		if s == nil {
			return nil
		}
		vals := s.Last
		if _, rate := history.Unit(l.Series); rate {
			vals = s.Mean
		}
		return []plot{{name: l.Series, label: l.Label, color: colors[l.Color], bandLabel: l.Band, vals: vals, min: s.Min, max: s.Max}}
	}
	none := "no data"
	if p.History == nil {
		none = "no history in this report"
	}
	var out []chart
	for _, c := range charts {
		var plots []plot
		for _, l := range c.Lines {
			plots = append(plots, get(l)...)
		}
		if c.Optional && len(plots) == 0 {
			continue
		}
		var refs []ref
		if c.FDLimit && p.FDLimit > 0 {
			refs = append(refs, ref{float64(p.FDLimit), fmt.Sprintf("fd limit %d", p.FDLimit)})
		}
		empty := none
		if c.Empty != "" {
			empty = c.Empty
		}
		out = append(out, newChart(c.ID, p.PID, c.Title, c.Unit, empty, ax, h.Time, plots, refs))
	}
	for i := range out {
		c := &out[i]
		for _, f := range findings {
			if chartOf[f.Kind] != c.ID {
				continue
			}
			c.addMarker(marker{Kind: f.Kind, Severity: f.Severity, Label: fmt.Sprintf("#%d %s", f.N, f.Kind), Href: "#" + f.Anchor,
				Title: fmt.Sprintf("#%d %s (%s) %s: %s", f.N, f.Kind, f.Severity, f.Span, f.Summary)}, ax.x(f.first), ax.x(f.last))
		}
	}
	return out
}

// readStack reads a stack as read from JSON into frames, as a finding's
// stack is read (frames written as strings, before schema 3, included);
// false when v is not one.
func readStack(v any) ([]model.Frame, bool) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	var frames []model.Frame
	if json.Unmarshal(data, &frames) != nil || frames == nil {
		return nil, false
	}
	return frames, true
}

// frameTexts writes each frame as a stack on the page shows it.
func frameTexts(frames []model.Frame) []string {
	out := make([]string, len(frames))
	for i, f := range frames {
		out[i] = f.String()
	}
	return out
}

// bytesText writes a byte count with a binary unit, e.g. "1.5 GiB".
func bytesText(b uint64) string {
	v, u := float64(b), "B"
	for _, next := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if v < 1024 {
			break
		}
		v, u = v/1024, next
	}
	if u == "B" {
		return fmt.Sprintf("%d B", b)
	}
	return fmt.Sprintf("%.1f %s", v, u)
}

func secondsText(s float64) string {
	switch {
	case s >= 1:
		return fmt.Sprintf("%.2f s", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.2f ms", s*1e3)
	}
	return fmt.Sprintf("%.1f µs", s*1e6)
}

// waitStackMax bounds the frames shown under a wait site: more than a
// finding's, so that the Python line under the native frames of ctypes or
// PyTorch shows.
const waitStackMax = 12

// waitRows bounds the wait sites in the table: the most waited.
const waitRows = 20

// waitTable lays out the host's waits on the GPU by call site, most waited
// first, each with its stack under it (Python lines included where read).
func waitTable(s *Sites) *evTable {
	if s == nil || len(s.Wait) == 0 {
		return nil
	}
	t := &evTable{Head: []string{"API", "calls", "total", "longest", "p50", "p99"}}
	q := func(v *float64) string {
		if v == nil {
			return "–"
		}
		return "≤ " + durationText(*v)
	}
	for _, w := range s.Wait[:min(len(s.Wait), waitRows)] {
		lines := frameTexts(w.Stack)
		if len(lines) > waitStackMax {
			lines = append(lines[:waitStackMax], fmt.Sprintf("… %d more frames", len(lines)-waitStackMax))
		}
		t.Rows = append(t.Rows, evEntry{
			Cells: []string{w.API, strconv.FormatUint(w.Calls, 10), durationText(w.Seconds), durationText(w.MaxSeconds), q(w.P50Seconds), q(w.P99Seconds)},
			Lines: lines,
		})
	}
	return t
}
