// Package history keeps the series behind the findings: for every watched
// process and every GPU, what the tool measured at each interval (open fds,
// fd and context-switch rates, run-queue p99, TCP sockets by state, live GPU
// bytes with their high-water mark, NVML's figures). It is a pipeline sink
// fed by snapshots; the JSON and HTML reports show what it kept.
//
// Memory is bounded whatever the run's length: the most recent points are
// kept at full resolution, older ones merged into coarser points that keep
// each figure's least and greatest value, and the number of points per
// process or GPU is capped (see Config).
package history

import (
	"math"
	"strconv"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Series names, as they appear in History.Series.
const (
	OpenFDs             = "open_fds"                        // gauge, fds
	FDsOpened           = "fds_opened_per_second"           // rate, fds/s, all kinds together
	FDsClosed           = "fds_closed_per_second"           // rate, fds/s
	VoluntarySwitches   = "voluntary_switches_per_second"   // rate, switches/s
	InvoluntarySwitches = "involuntary_switches_per_second" // rate, switches/s
	RunqueueP99         = "runqueue_p99_seconds"            // gauge: the p99 of the waits within each interval
	GPULiveBytes        = "gpu_live_bytes"                  // gauge: live device bytes; max is the kernel's high-water mark
	NVMLUsedBytes       = "nvml_used_bytes"                 // gauge: NVML's figure for the process, every --gpu-interval
	MemoryUsedBytes     = "memory_used_bytes"               // gauge: a GPU's used memory, per NVML
	// Gauges: how busy the process kept its GPUs over the interval (the
	// mean over the devices it used), per NVML.
	GPUSMUtil  = "gpu_sm_utilization_ratio"
	GPUMemUtil = "gpu_memory_controller_utilization_ratio"
	// TCPPrefix + a state as the kernel names it (TCP_CLOSE_WAIT is
	// "tcp_CLOSE_WAIT"): sockets the process holds in that state.
	TCPPrefix = "tcp_"
)

// Units of the series.
const (
	UnitFDs      = "fds"
	UnitFDRate   = "fds/s"
	UnitSwitches = "switches/s"
	UnitSeconds  = "seconds"
	UnitBytes    = "bytes"
	UnitSockets  = "sockets"
	UnitRatio    = "ratio" // 0..1
)

// Unit returns the unit of a series, and whether it is a rate (a mean over
// each point's span) rather than a gauge (a value at its end).
func Unit(name string) (unit string, rate bool) {
	switch name {
	case OpenFDs:
		return UnitFDs, false
	case FDsOpened, FDsClosed:
		return UnitFDRate, true
	case VoluntarySwitches, InvoluntarySwitches:
		return UnitSwitches, true
	case RunqueueP99:
		return UnitSeconds, false
	case GPULiveBytes, NVMLUsedBytes, MemoryUsedBytes:
		return UnitBytes, false
	case GPUSMUtil, GPUMemUtil:
		return UnitRatio, false
	}
	return UnitSockets, false // TCPPrefix + state
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
	cfg   Config
	procs map[procKey]*procTrack
	gpus  map[string]*gpuTrack // by UUID, or index when NVML gives none
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
	last           time.Time // end of the previous point
	rated          time.Time // when the counts below were taken
	opened, closed uint64    // fds, all kinds, at rated
	vol, invol     uint64
	runq           model.Histogram
	exited         bool            // the exit was recorded: nothing comes after it
	tcp            map[string]bool // TCP states the process has had a socket in
}

// New returns an empty Recorder.
func New(cfg Config) *Recorder {
	return &Recorder{cfg: cfg, procs: map[procKey]*procTrack{}, gpus: map[string]*gpuTrack{}}
}

// Update records one point per live process and GPU of s: the state at
// s.Time, and rates over the time since the previous point.
func (r *Recorder) Update(s *model.Snapshot) {
	for _, p := range s.Processes {
		k := procKey{p.PID, p.Started.UnixNano()}
		pt := r.procs[k]
		if pt == nil {
			pt = &procTrack{track: newTrack(r.cfg), last: p.Started, rated: p.Started, tcp: map[string]bool{}}
			r.procs[k] = pt
		}
		if pt.exited {
			continue
		}
		pt.observe(s.Time, p)
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

// observe adds the point of p at now.
func (pt *procTrack) observe(now time.Time, p *model.Process) {
	first := len(pt.recent)+len(pt.coarse) == 0
	x := newPoint(now, now.Sub(pt.last))
	pt.last = now
	x.set(&pt.track, OpenFDs, gauge(float64(p.FD.Open)))

	// The first poll comes right after the process is watched: a rate
	// over those few milliseconds would dwarf the rest. Its events count in
	// the second point's rates, over the time since watching began.
	if !first {
		span := now.Sub(pt.rated)
		opened, closed := sum(p.FD.Opened), sum(p.FD.Closed)
		x.rate(&pt.track, FDsOpened, delta(opened, pt.opened), span)
		x.rate(&pt.track, FDsClosed, delta(closed, pt.closed), span)
		x.rate(&pt.track, VoluntarySwitches, delta(p.Sched.Voluntary, pt.vol), span)
		x.rate(&pt.track, InvoluntarySwitches, delta(p.Sched.Involuntary, pt.invol), span)
		pt.rated, pt.opened, pt.closed = now, opened, closed
		pt.vol, pt.invol = p.Sched.Voluntary, p.Sched.Involuntary
	}

	// The histogram is cumulative: the p99 of this interval's waits comes
	// from what was added since the previous point.
	if q, ok := p.Sched.RunqLatency.Sub(pt.runq).Quantile(0.99); ok {
		x.set(&pt.track, RunqueueP99, gauge(q))
	}
	pt.runq = p.Sched.RunqLatency

	// A state seen once stays a series: 0 when no socket is in it.
	for st, n := range p.Sock.TCPByState {
		if n > 0 {
			pt.tcp[st] = true
		}
	}
	for st := range pt.tcp {
		x.set(&pt.track, TCPPrefix+st, gauge(float64(p.Sock.TCPByState[st])))
	}

	c := &p.CUDA
	if c.Active() {
		// The kernel's mark is at least the live bytes at this poll; the
		// least is known at polls only.
		live := float64(c.LiveBytes)
		x.set(&pt.track, GPULiveBytes, acc{min: live, max: float64(max(c.LivePeakBytes, c.LiveBytes)), last: live})
	}
	if c.HasNVML {
		used := c.NVMLUsedBytes
		x.set(&pt.track, NVMLUsedBytes, acc{min: float64(min(c.NVMLMinBytes, used)), max: float64(max(c.NVMLMaxBytes, used)), last: float64(used)})
	}
	if n := len(c.GPUUtil); n > 0 {
		var sm, mem float64
		for _, u := range c.GPUUtil {
			sm += u.SM
			mem += u.Memory
		}
		x.set(&pt.track, GPUSMUtil, gauge(sm/float64(n)))
		x.set(&pt.track, GPUMemUtil, gauge(mem/float64(n)))
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

func sum(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
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
