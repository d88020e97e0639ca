// Package history keeps the series behind the findings: for every watched
// process and every GPU, what the tool measured at each interval: the
// figures each view declares (model.Shows: open fds, fd and context-switch
// rates, run-queue p99, TCP sockets by state, live GPU bytes with their
// high-water mark, NVML's figures) and each GPU's used memory. It is a
// pipeline sink fed by snapshots; the JSON and HTML reports show what it
// kept.
//
// Memory is bounded whatever the run's length: the most recent points are
// kept at full resolution, older ones merged into coarser points that keep
// each figure's least and greatest value, and the number of points per
// process or GPU is capped (see Config).
package history

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// MemoryUsedBytes is a GPU's used memory, per NVML: the series of a GPU's
// history. A process's series are the views' figures (model.Shows).
const MemoryUsedBytes = "memory_used_bytes"

// Unit returns the unit of a series, and whether it is a rate (a mean over
// each point's span) rather than a gauge (a value at its end).
func Unit(name string) (unit string, rate bool) {
	if name == MemoryUsedBytes {
		return model.UnitBytes, false
	}
	if f, ok := figure(name); ok {
		return f.Unit, f.Kind == model.Rate
	}
	return "", false
}

// figure returns the figure that records series name: the figure of that
// name, or the family it is a member of.
func figure(name string) (model.Figure, bool) {
	for _, f := range model.Figures() {
		if f.Name == name || f.Members != nil && strings.HasPrefix(name, f.Name) {
			return f, true
		}
	}
	return model.Figure{}, false
}

// Config bounds what is kept per process and per GPU.
type Config struct {
	// Recent is how many of the latest intervals are kept as they were
	// measured.
	Recent int
	// Coarse caps the points kept before those. Each holds 2^k intervals
	// merged; when they would exceed Coarse, pairs are merged and k grows.
	Coarse int
}

// DefaultConfig keeps 600 intervals (10 minutes at the default --interval
// of 1 s) at full resolution and at most 1200 coarser points before them:
// at most 1800 points, whatever the run's length. 24 hours at 1 s end as
// 600 points of 1 s and about 670 of 128 s.
func DefaultConfig() Config { return Config{Recent: 600, Coarse: 1200} }

// Recorder is a pipeline sink that records the history of every process and
// GPU in the snapshots it is given.
type Recorder struct {
	cfg     Config
	figures []model.Figure // every view's (model.Figures)
	procs   map[procKey]*procTrack
	gpus    map[string]*gpuTrack // by UUID, or index when NVML gives none
}

// gpuTrack is one GPU's history.
type gpuTrack struct {
	track
	last time.Time // end of the previous point
}

// procKey tells apart two processes that had the same pid in one run.
type procKey struct {
	pid     int
	started int64
}

// procTrack is one process's history and what its next point is measured
// against.
type procTrack struct {
	track
	last   time.Time // end of the previous point
	rated  time.Time // when the counts below were taken
	counts []uint64  // each Rate figure's count at rated, by figures' index
	hists  []model.Histogram
	exited bool            // the exit was recorded: nothing comes after it
	seen   map[string]bool // members of families the process has had
}

// New returns an empty Recorder.
func New(cfg Config) *Recorder {
	return &Recorder{cfg: cfg, figures: model.Figures(), procs: map[procKey]*procTrack{}, gpus: map[string]*gpuTrack{}}
}

// Update records one point per live process and GPU of s: the state at
// s.Time, and rates over the time since the previous point.
func (r *Recorder) Update(s *model.Snapshot) {
	for _, p := range s.Processes {
		k := procKey{p.PID, p.Started.UnixNano()}
		pt := r.procs[k]
		if pt == nil {
			pt = &procTrack{track: newTrack(r.cfg), last: p.Started, rated: p.Started, seen: map[string]bool{},
				counts: make([]uint64, len(r.figures)), hists: make([]model.Histogram, len(r.figures))}
			r.procs[k] = pt
		}
		if pt.exited {
			continue
		}
		pt.observe(s.Time, p, r.figures)
	}
	for _, g := range s.GPUs {
		id := gpuID(g.UUID, g.Index)
		gt := r.gpus[id]
		if gt == nil {
			gt = &gpuTrack{track: newTrack(r.cfg), last: s.Start}
			r.gpus[id] = gt
		}
		x := newPoint(s.Time, s.Time.Sub(gt.last))
		gt.last = s.Time
		x.set(&gt.track, MemoryUsedBytes, acc{min: float64(min(g.MemoryUsedMin, g.MemoryUsed)), max: float64(max(g.MemoryUsedMax, g.MemoryUsed)), last: float64(g.MemoryUsed)})
		gt.add(x)
	}
}

// Close does nothing with final: it repeats the last poll's figures at a
// later time, and a point for it would show a pause as a flat stretch.
func (r *Recorder) Close(*model.Snapshot) error { return nil }

// observe adds the point of p at now, a value of each of figures.
func (pt *procTrack) observe(now time.Time, p *model.Process, figures []model.Figure) {
	first := len(pt.recent)+len(pt.coarse) == 0
	x := newPoint(now, now.Sub(pt.last))
	pt.last = now
	span := now.Sub(pt.rated)
	for i, f := range figures {
		switch {
		case f.Members != nil:
			members := f.Members(p)
			for m, n := range members {
				if n > 0 {
					pt.seen[f.Name+m] = true
				}
			}
			for name := range pt.seen {
				if m, ok := strings.CutPrefix(name, f.Name); ok {
					x.set(&pt.track, name, gauge(float64(members[m])))
				}
			}
		case f.Kind == model.Quantile:
			// The histogram is cumulative: the quantile of this
			// interval's waits comes from what was added since the
			// previous point.
			h := f.Histogram(p)
			if q, ok := h.Sub(pt.hists[i]).Quantile(f.Q); ok {
				x.set(&pt.track, f.Name, gauge(q))
			}
			pt.hists[i] = h
		case f.Kind == model.Rate:
			// The first poll comes right after the process is watched:
			// a rate over those few milliseconds would dwarf the rest.
			// Its events count in the second point's rates, over the
			// time since watching began.
			v, ok := f.Value(p)
			if !ok || first {
				continue
			}
			n := uint64(v.Last)
			x.rate(&pt.track, f.Name, delta(n, pt.counts[i]), span)
			pt.counts[i] = n
		default:
			if v, ok := f.Value(p); ok {
				x.set(&pt.track, f.Name, acc{min: v.Min, max: v.Max, last: v.Last})
			}
		}
	}
	if !first {
		pt.rated = now
	}
	pt.add(x)
	if p.Exited {
		pt.exited = true
	}
}

// gpuID names a GPU across snapshots: its UUID, or its index when NVML
// gives none.
func gpuID(uuid string, index int) string {
	if uuid != "" {
		return uuid
	}
	return "index:" + strconv.Itoa(index)
}

func delta(now, before uint64) uint64 {
	if now < before { // a counter that went back: a reset
		return now
	}
	return now - before
}

// acc is one series within one point: for a gauge the least, the greatest
// and the last value; for a rate the least and greatest rate of its
// intervals, and the events of all of them (total) over their seconds
// (dur).
type acc struct {
	min, max, last, total, dur float64
	set                        bool
}

func gauge(v float64) acc { return acc{min: v, max: v, last: v} }

// merge combines a with b, which comes after it.
func (a acc) merge(b acc) acc {
	switch {
	case !a.set:
		return b
	case !b.set:
		return a
	}
	return acc{min: math.Min(a.min, b.min), max: math.Max(a.max, b.max), last: b.last, total: a.total + b.total, dur: a.dur + b.dur, set: true}
}

// point is one interval, or several merged.
type point struct {
	end  time.Time
	span time.Duration // the time it covers
	n    int           // intervals merged into it
	vals []acc         // by the track's series index
}

// set records v as the value of series name in x.
func (x *point) set(t *track, name string, v acc) {
	i := t.index(name)
	for len(x.vals) <= i {
		x.vals = append(x.vals, acc{})
	}
	v.set = true
	x.vals[i] = v
}

// rate records events over span as series name; an empty span (two
// snapshots at one instant) records nothing.
func (x *point) rate(t *track, name string, events uint64, span time.Duration) {
	if span <= 0 {
		return
	}
	r := float64(events) / span.Seconds()
	x.set(t, name, acc{min: r, max: r, total: float64(events), dur: span.Seconds()})
}

// merge combines x with y, which comes after it.
func (x point) merge(y point) point {
	out := point{end: y.end, span: x.span + y.span, n: x.n + y.n, vals: make([]acc, max(len(x.vals), len(y.vals)))}
	for i := range out.vals {
		var a, b acc
		if i < len(x.vals) {
			a = x.vals[i]
		}
		if i < len(y.vals) {
			b = y.vals[i]
		}
		out.vals[i] = a.merge(b)
	}
	return out
}

// track is the points of one process or GPU: the recent ones as measured,
// the older ones merged.
type track struct {
	cfg    Config
	names  []string       // series, in the order they appeared
	byName map[string]int // index into names and point.vals
	recent []point
	coarse []point
	per    int // intervals per coarse point once full
}

func newTrack(cfg Config) track {
	return track{cfg: cfg, byName: map[string]int{}, per: 1}
}

func (t *track) index(name string) int {
	i, ok := t.byName[name]
	if !ok {
		i = len(t.names)
		t.names = append(t.names, name)
		t.byName[name] = i
	}
	return i
}

// newPoint starts a point of one interval ending at end.
func newPoint(end time.Time, span time.Duration) point {
	return point{end: end, span: span, n: 1}
}

// add appends x; the oldest recent point moves into the coarse ones.
func (t *track) add(x point) {
	t.recent = append(t.recent, x)
	if len(t.recent) <= t.cfg.Recent {
		return
	}
	old := t.recent[0]
	// Reslicing, not copying: append moves the points to a new array
	// when it runs out of room, so the cost per point stays constant.
	t.recent = t.recent[1:]
	if n := len(t.coarse); n > 0 && t.coarse[n-1].n+old.n <= t.per {
		t.coarse[n-1] = t.coarse[n-1].merge(old)
		return
	}
	t.coarse = append(t.coarse, old)
	if len(t.coarse) <= t.cfg.Coarse {
		return
	}
	// Twice as coarse: merge pairs, oldest first.
	t.per *= 2
	merged := t.coarse[:0]
	for i := 0; i < len(t.coarse); i += 2 {
		if i+1 < len(t.coarse) {
			merged = append(merged, t.coarse[i].merge(t.coarse[i+1]))
		} else {
			merged = append(merged, t.coarse[i])
		}
	}
	t.coarse = merged
}
