// Package tui shows snapshots on a terminal: a block redrawn in place on a
// TTY, or a log of changes otherwise (a pipe, a CI log), and a summary at
// the end either way.
package tui

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

const (
	logFrames     = 3 // stack frames under a finding as it appears
	summaryFrames = 5 // stack frames under a finding in the summary
	// Heartbeat is how long the log stays silent before it says it is
	// still watching: a busy process whose figures do not change (say, a
	// loop that allocates and frees) would otherwise look like a hang.
	Heartbeat = 10 * time.Second
)

// View is a sink that writes to a terminal or a log.
type View struct {
	w    *errWriter
	live bool

	last  *model.Snapshot
	procs map[int]model.Process // every process seen, last state, for the summary
	prev  map[int]sample        // each process at the previous snapshot, for the growth rate
	shown map[int]string        // not live: what the last line printed for each pid said
	told  map[findingID]bool    // findings already printed
	drawn int                   // live: lines of the block on screen
	said  sample                // not live: when the log last printed, and the events seen by then
}

type sample struct {
	open   int
	at     time.Time
	counts []uint64 // the views' columns' counts (columns)
	events uint64   // not live: every process's Events, summed
}

// columns are the views' columns of the live table, after the fd view's.
var columns = func() []model.Column {
	var out []model.Column
	for _, s := range model.Shows {
		out = append(out, s.Columns...)
	}
	return out
}()

// findingID identifies one finding across snapshots, as detectors do.
type findingID struct {
	kind      string
	pid       int
	firstSeen int64 // UnixNano: time.Time is not a reliable map key
}

// New returns a View writing to w; live means w is a terminal that the view
// may redraw.
func New(w io.Writer, live bool) *View {
	return &View{
		w:     &errWriter{w: w},
		live:  live,
		procs: map[int]model.Process{},
		prev:  map[int]sample{},
		shown: map[int]string{},
		told:  map[findingID]bool{},
	}
}

// Update shows s: new findings once each, then either the redrawn block or
// a line for each process that changed.
func (v *View) Update(s *model.Snapshot) {
	s = ownFindings(s)
	v.record(s)
	v.clear()
	for _, f := range s.Findings {
		id := findingID{f.Kind, f.PID, f.FirstSeen.UnixNano()}
		if !v.told[id] {
			v.told[id] = true
			writeFinding(v.w, f, logFrames)
		}
	}
	counts := findingsByPID(s.Findings)
	if v.live {
		v.draw(s, counts)
	} else {
		v.log(s, counts)
	}
	prev := make(map[int]sample, len(s.Processes))
	for _, p := range s.Processes {
		if !p.Exited {
			counts := make([]uint64, len(columns))
			for i, c := range columns {
				counts[i] = c.Count(p)
			}
			prev[p.PID] = sample{open: p.FD.Open, at: s.Time, counts: counts}
		}
	}
	v.prev = prev
}

// Close takes final, if any, as the last state, replaces the live block
// with the summary, and returns the first error writing to the terminal.
func (v *View) Close(final *model.Snapshot) error {
	if final != nil {
		v.record(ownFindings(final))
	}
	v.clear()
	v.summary()
	return v.w.err
}

func (v *View) record(s *model.Snapshot) {
	v.last = s
	for _, p := range s.Processes {
		v.procs[p.PID] = *p // a copy: the summary comes long after this snapshot
	}
}

// clear erases the block drawn last, so that the next output replaces it.
func (v *View) clear() {
	if v.drawn > 0 {
		// Up to the block's first line, then erase to the end of the screen.
		fmt.Fprintf(v.w, "\x1b[%dA\x1b[J", v.drawn)
		v.drawn = 0
	}
}

func (v *View) draw(s *model.Snapshot, counts map[int]int) {
	var b bytes.Buffer
	active := 0
	for _, f := range s.Findings {
		if f.Active {
			active++
		}
	}
	fmt.Fprintf(&b, "autoglm-ebpf  %s  elapsed %s  findings %d active / %d", s.Time.Format(time.TimeOnly),
		s.Time.Sub(s.Start).Round(time.Second), active, len(s.Findings))
	if lost := lostEvents(s.Lost); lost != "" {
		fmt.Fprintf(&b, "  lost %s", lost)
	}
	b.WriteString("\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "PID\tCOMM\tOPEN-FDS\tRATE\t")
	for _, c := range columns {
		fmt.Fprint(tw, c.Head+"\t")
	}
	fmt.Fprintln(tw, "FINDINGS")
	for _, p := range byPID(s.Processes) {
		rate := v.rate(p, s.Time)
		if p.Exited {
			rate = "exited"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t", p.PID, p.Comm, p.FD.Open, rate)
		for i := range columns {
			fmt.Fprint(tw, v.columnRate(p, i, s.Time)+"\t")
		}
		fmt.Fprintf(tw, "%d\n", counts[p.PID])
	}
	tw.Flush()
	for _, p := range byPID(s.Processes) {
		writeLines(&b, p)
	}
	v.drawn = bytes.Count(b.Bytes(), []byte("\n"))
	v.w.Write(b.Bytes())
}

// log prints a line for each process whose state changed since its last
// line, or a heartbeat when it has said nothing for Heartbeat.
func (v *View) log(s *model.Snapshot, counts map[int]int) {
	printed := false
	for _, p := range byPID(s.Processes) {
		state := fmt.Sprintf("pid=%d (%s) open=%d findings=%d", p.PID, p.Comm, p.FD.Open, counts[p.PID])
		for _, sh := range model.Shows {
			if sh.State != nil {
				state += sh.State(p)
			}
		}
		if p.Exited {
			state += " exited"
		}
		if v.shown[p.PID] != state {
			printed = true
			fmt.Fprintf(v.w, "%s %s rate=%s\n", s.Time.Format(time.TimeOnly), state, v.rate(p, s.Time))
		}
		if p.Exited {
			delete(v.shown, p.PID) // a reused pid is a new process
		} else {
			v.shown[p.PID] = state
		}
	}
	var events uint64
	watched := 0
	for _, p := range s.Processes {
		events += p.Events()
		if !p.Exited {
			watched++
		}
	}
	if dt := s.Time.Sub(v.said.at); !printed && !v.said.at.IsZero() && dt >= Heartbeat {
		printed = true
		fmt.Fprintf(v.w, "%s watching %d processes, %.0f events/s, %d findings\n", s.Time.Format(time.TimeOnly),
			watched, float64(events-v.said.events)/dt.Seconds(), len(s.Findings))
	}
	if printed || v.said.at.IsZero() {
		v.said = sample{at: s.Time, events: events}
	}
}

// rate is the growth of p's open fds per second since the previous snapshot.
func (v *View) rate(p *model.Process, now time.Time) string {
	prev, ok := v.prev[p.PID]
	dt := now.Sub(prev.at).Seconds()
	if !ok || dt <= 0 {
		return "-"
	}
	return fmt.Sprintf("%+.1f/s", float64(p.FD.Open-prev.open)/dt)
}

// columnRate is the per-second rate of p's count in columns[i] since the
// previous snapshot: "-" when unknown (no previous, p exited, or a count
// that went back).
func (v *View) columnRate(p *model.Process, i int, now time.Time) string {
	prev, ok := v.prev[p.PID]
	dt := now.Sub(prev.at).Seconds()
	n := columns[i].Count(p)
	if !ok || dt <= 0 || p.Exited || n < prev.counts[i] {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(n-prev.counts[i])/dt)
}

// writeLines writes the views' lines about p (a GPU's memory) to w.
func writeLines(w io.Writer, p *model.Process) {
	for _, sh := range model.Shows {
		if sh.Line == nil {
			continue
		}
		if line := sh.Line(p); line != "" {
			fmt.Fprintln(w, line)
		}
	}
}

func (v *View) summary() {
	var findings []model.Finding
	var lost map[string]uint64
	if v.last != nil {
		findings, lost = v.last.Findings, v.last.Lost
	}
	counts := findingsByPID(findings)

	tw := tabwriter.NewWriter(v.w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PID\tCOMM\tOPEN-FDS\tLIMIT\tOPENED\tCLOSED\tFINDINGS")
	for _, pid := range slices.Sorted(maps.Keys(v.procs)) {
		p := v.procs[pid]
		comm := p.Comm
		if p.Exited {
			comm += " (exited)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d\t%d\t%d\n",
			p.PID, comm, p.FD.Open, p.FD.Limit, sum(p.FD.Opened), sum(p.FD.Closed), counts[p.PID])
	}
	tw.Flush()
	for _, pid := range slices.Sorted(maps.Keys(v.procs)) {
		p := v.procs[pid]
		writeLines(v.w, &p)
	}

	if len(findings) == 0 {
		fmt.Fprintln(v.w, "\nno findings")
	} else {
		fmt.Fprintf(v.w, "\nfindings (%d):\n", len(findings))
		for _, f := range findings {
			writeFinding(v.w, f, summaryFrames)
		}
	}

	if l := lostEvents(lost); l != "" {
		fmt.Fprintf(v.w, "\nlost events: %s\n", l)
	} else {
		fmt.Fprintln(v.w, "\nno events lost")
	}
}

// writeFinding prints f and up to frames frames of its stack.
func writeFinding(w io.Writer, f model.Finding, frames int) {
	state := ""
	if !f.Active {
		state = " (no longer active)"
	}
	fmt.Fprintf(w, "FINDING %s pid=%d (%s) %s: %s%s\n", f.Kind, f.PID, f.Comm, f.Severity, f.Summary, state)
	for _, frame := range f.Stack[:min(frames, len(f.Stack))] {
		fmt.Fprintf(w, "    %s\n", frame)
	}
	if more := len(f.Stack) - frames; more > 0 {
		fmt.Fprintf(w, "    ... %d more frames\n", more)
	}
}

// lostEvents lists the non-zero counts by source, or "" if none.
func lostEvents(lost map[string]uint64) string {
	var parts []string
	for _, src := range slices.Sorted(maps.Keys(lost)) {
		if n := lost[src]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", src, n))
		}
	}
	return strings.Join(parts, " ")
}

// ownFindings returns s without the findings another one explains (an fd
// leak that is a socket leak's sockets): one cause is shown once, by the
// finding that carries the other as evidence.
func ownFindings(s *model.Snapshot) *model.Snapshot {
	c := *s
	c.Findings = slices.DeleteFunc(slices.Clone(s.Findings), func(f model.Finding) bool { return f.CausedBy != nil })
	return &c
}

func findingsByPID(findings []model.Finding) map[int]int {
	counts := map[int]int{}
	for _, f := range findings {
		counts[f.PID]++
	}
	return counts
}

func byPID(procs []*model.Process) []*model.Process {
	return slices.SortedFunc(slices.Values(procs), func(a, b *model.Process) int { return cmp.Compare(a.PID, b.PID) })
}

func sum(counts map[string]uint64) uint64 {
	var n uint64
	for _, c := range counts {
		n += c
	}
	return n
}

// errWriter keeps the first write error: Update cannot return one, so Close
// reports it.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(p)
	e.err = err
	return n, err
}
