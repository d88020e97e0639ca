// Package ctxstorm finds context-switch storms: a process whose threads
// switch on and off the CPU far more often than that process normally does,
// and often enough in absolute terms to cost real CPU time.
//
// It reads only what the scheduler source reports (monotonic voluntary and
// involuntary switch totals, per-thread totals, run-queue latency histogram)
// and judges the switch rate of each interval against the process's own
// baseline: an exponentially weighted mean and variance of its rate, learned
// only from intervals that were not over the threshold, so that a storm does
// not teach the baseline that storms are normal. A storm must also exceed an
// absolute floor (a steady few thousand switches a second is ordinary for a
// server) and last several intervals (one busy interval is a burst). A rate
// at or above an absolute ceiling is a storm whatever the baseline, so that a
// process that storms from the moment it is attached is found too.
package ctxstorm

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/episode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/series"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Config holds the detector thresholds. Zero fields take the DefaultConfig value.
type Config struct {
	Floor    float64 // switches/s a storm must reach, whatever the baseline
	Ceiling  float64 // switches/s that is a storm whatever the baseline, even during warm-up
	K        float64 // standard deviations above the baseline mean
	MinRatio float64 // and at least this many times the baseline mean
	Sustain  int     // consecutive intervals over the threshold that raise a finding
	WarmUp   int     // intervals learned before the baseline judges
	Alpha    float64 // weight of a new interval in the baseline once warmed up
	Quiet    int     // consecutive intervals under the threshold that end a finding
}

// DefaultConfig returns the thresholds used when none are given.
func DefaultConfig() Config {
	return Config{Floor: 5000, Ceiling: 50000, K: 4, MinRatio: 2, Sustain: 3, WarmUp: 10, Alpha: 0.1, Quiet: 3}
}

const (
	topThreads     = 5 // threads listed in the evidence
	runqQuantile   = 0.99
	voluntaryShare = 0.5 // voluntary_ratio at or above which the voluntary hint applies

	hintVoluntary   = "mostly voluntary: lock contention or I/O churn (threads blocking and waking)"
	hintInvoluntary = "mostly involuntary: CPU oversubscription (more runnable threads than CPUs)"
)

// Detector keeps a baseline per process. It is safe for concurrent use.
type Detector struct {
	cfg   Config
	procs episode.Procs[procState]
}

type procState struct {
	window []point // the last Sustain+1 samples, oldest first
	n      int     // intervals learned into the baseline
	mean   float64 // baseline rate, switches/s
	vari   float64 // its variance
	storm  episode.Episode
}

type point struct {
	t          time.Time
	vol, invol uint64
	threads    map[int]uint64 // switches since attach, by tid
	runq       model.Histogram
}

// interval is what one step between samples says.
type interval struct {
	dt         float64 // seconds
	rate       float64 // switches/s
	vol, invol float64 // switches/s of each kind
	threshold  float64
	over       bool
}

// New returns a detector with cfg, zero fields replaced by defaults.
func New(cfg Config) *Detector {
	def := DefaultConfig()
	for _, f := range []struct{ v, d *float64 }{
		{&cfg.Floor, &def.Floor}, {&cfg.Ceiling, &def.Ceiling}, {&cfg.K, &def.K}, {&cfg.MinRatio, &def.MinRatio}, {&cfg.Alpha, &def.Alpha},
	} {
		if *f.v <= 0 {
			*f.v = *f.d
		}
	}
	for _, f := range []struct{ v, d *int }{{&cfg.Sustain, &def.Sustain}, {&cfg.WarmUp, &def.WarmUp}, {&cfg.Quiet, &def.Quiet}} {
		if *f.v <= 0 {
			*f.v = *f.d
		}
	}
	cfg.Ceiling = max(cfg.Ceiling, cfg.Floor)
	cfg.Alpha = min(cfg.Alpha, 1)
	return &Detector{cfg: cfg}
}

// Observe takes one sample of a process (p.Sched filled; p.PID, p.Comm set)
// taken at now, and returns the findings about it that are new or still
// active (updated LastSeen and evidence). A finding that ends is returned
// once with Active=false and then no more.
func (d *Detector) Observe(now time.Time, p *model.Process) []model.Finding {
	return d.procs.With(p.PID, func() *procState { return &procState{} }, func(st *procState) []model.Finding {
		return d.observe(now, p, st)
	})
}

func (d *Detector) observe(now time.Time, p *model.Process, st *procState) []model.Finding {
	cur := point{t: now, vol: p.Sched.Voluntary, invol: p.Sched.Involuntary, runq: p.Sched.RunqLatency,
		threads: make(map[int]uint64, len(p.Sched.Threads))}
	for _, th := range p.Sched.Threads {
		cur.threads[th.TID] = th.Voluntary + th.Involuntary
	}
	if len(st.window) == 0 {
		st.window = append(st.window, cur)
		return nil
	}
	last := st.window[len(st.window)-1]
	// A clock step or totals that went down (they are monotonic) leave no
	// rate to judge: start the series again from here.
	if !now.After(last.t) || cur.vol < last.vol || cur.invol < last.invol {
		st.window = append(st.window[:0], cur)
		st.storm.Interrupt()
		return nil
	}
	// An interval that ends with no live thread is the process's exit (a
	// live process that switched has a thread that did): its rate counts
	// the time the process was gone, and no thread is left to name. An
	// open storm keeps the figures of its last whole interval; the pipeline
	// ends it with the process.
	if len(p.Sched.Threads) == 0 && len(last.threads) > 0 && st.storm.Open() {
		return nil
	}
	st.window = append(st.window, cur)
	if len(st.window) > d.cfg.Sustain+1 {
		st.window = slices.Delete(st.window, 0, len(st.window)-d.cfg.Sustain-1)
	}

	iv := interval{dt: now.Sub(last.t).Seconds()}
	iv.vol = float64(cur.vol-last.vol) / iv.dt
	iv.invol = float64(cur.invol-last.invol) / iv.dt
	iv.rate = iv.vol + iv.invol
	iv.threshold = d.threshold(st)
	iv.over = iv.rate >= iv.threshold
	// Only calm intervals outside a storm teach the baseline: a storm
	// must not teach it that storms are normal.
	if !iv.over && !st.storm.Open() {
		d.learn(st, iv.rate)
	}
	rule := episode.Rule{ConfirmPolls: d.cfg.Sustain, QuietPolls: d.cfg.Quiet}
	return st.storm.Observe(now, model.KindCtxSwitchStorm, p.PID, rule, episode.Verdict{Raise: iv.over},
		func(f model.Finding, active bool) model.Finding { return d.fill(f, now, p, st, iv, active) })
}

// Forget drops all state of pid (process exited).
func (d *Detector) Forget(pid int) { d.procs.Forget(pid) }

// threshold is the rate at or above which an interval counts as a storm:
// the ceiling until the baseline is warm, then well above the baseline and
// the floor, but never above the ceiling.
func (d *Detector) threshold(st *procState) float64 {
	if st.n < d.cfg.WarmUp {
		return d.cfg.Ceiling
	}
	t := max(d.cfg.Floor, st.mean+d.cfg.K*math.Sqrt(st.vari), d.cfg.MinRatio*st.mean)
	return min(t, d.cfg.Ceiling)
}

// learn adds a rate to the baseline: a plain mean and variance over the
// warm-up, so that the first intervals do not weigh more than the others,
// then exponentially weighted, so that the baseline follows slow changes.
func (d *Detector) learn(st *procState, x float64) {
	st.n++
	delta := x - st.mean
	if st.n <= d.cfg.WarmUp {
		st.mean += delta / float64(st.n)
		st.vari += (delta*(x-st.mean) - st.vari) / float64(st.n)
		return
	}
	inc := d.cfg.Alpha * delta
	st.mean += inc
	st.vari = (1 - d.cfg.Alpha) * (st.vari + delta*inc)
}

// threadRate is one thread's switch rate over the last interval.
type threadRate struct {
	tid  int
	name string
	rate float64
}

// fill returns f updated from the latest interval.
func (d *Detector) fill(f model.Finding, now time.Time, p *model.Process, st *procState, iv interval, active bool) model.Finding {
	cur, last := st.window[len(st.window)-1], st.window[len(st.window)-2]
	var top []threadRate
	for _, th := range p.Sched.Threads {
		n, prev := cur.threads[th.TID], last.threads[th.TID]
		if prev > n { // a reused tid: all of it is new
			prev = 0
		}
		if n > prev {
			top = append(top, threadRate{th.TID, th.Name, float64(n-prev) / iv.dt})
		}
	}
	slices.SortFunc(top, func(a, b threadRate) int { return cmp.Or(cmp.Compare(b.rate, a.rate), cmp.Compare(a.tid, b.tid)) })
	topEv := make([]model.ThreadRate, 0, topThreads)
	for _, t := range top[:min(len(top), topThreads)] {
		topEv = append(topEv, model.ThreadRate{TID: t.tid, Name: t.name, Rate: series.Round(t.rate, 1)})
	}

	volRatio := 0.0
	if iv.rate > 0 {
		volRatio = iv.vol / iv.rate
	}
	hint := hintInvoluntary
	if volRatio >= voluntaryShare {
		hint = hintVoluntary
	}
	var p99 *float64 // nil when nothing waited in the window
	if q, ok := cur.runq.Sub(st.window[0].runq).Quantile(runqQuantile); ok {
		p99 = &q
	}
	var baseline *float64 // nil until an interval has been learned
	if st.n > 0 {
		baseline = new(series.Round(st.mean, 1))
	}

	f.Comm = p.Comm
	f.LastSeen = now
	f.Active = active
	f.Severity = model.SeverityWarning
	if iv.rate >= d.cfg.Ceiling {
		f.Severity = model.SeverityCritical
	}
	f.Stack = nil
	head := "context-switch storm"
	if !active {
		head = "context-switch storm ended"
	}
	base := "no baseline yet"
	if st.n > 0 {
		base = "baseline " + rough(st.mean) + "/s"
	}
	f.Summary = fmt.Sprintf("%s: %s switches/s (%.0f%% voluntary) over %d threads on %d CPUs, %s; %s",
		head, rough(iv.rate), 100*volRatio, len(p.Sched.Threads), p.Sched.AllowedCPUs, base, hint)
	f.Evidence = model.CtxSwitchStormEvidence{
		RatePerSecond:         series.Round(iv.rate, 1),
		VoluntaryPerSecond:    series.Round(iv.vol, 1),
		InvoluntaryPerSecond:  series.Round(iv.invol, 1),
		VoluntaryRatio:        series.Round(volRatio, 3),
		ThresholdPerSecond:    series.Round(iv.threshold, 1),
		BaselineMean:          baseline,
		TopThreads:            topEv,
		Threads:               len(p.Sched.Threads),
		AllowedCPUs:           p.Sched.AllowedCPUs,
		RunqueueP99Seconds:    p99,
		RunqueueWindowSeconds: series.Round(cur.t.Sub(st.window[0].t).Seconds(), 1),
		Hint:                  hint,
	}
	return f
}

// rough renders a rate with a k or M suffix, e.g. "312k".
func rough(x float64) string {
	switch {
	case x >= 1e6:
		return fmt.Sprintf("%.1fM", x/1e6)
	case x >= 1e4:
		return fmt.Sprintf("%.0fk", x/1e3)
	case x >= 1e3:
		return fmt.Sprintf("%.1fk", x/1e3)
	default:
		return fmt.Sprintf("%.0f", x)
	}
}
