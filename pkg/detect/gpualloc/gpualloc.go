// Package gpualloc judges the GPU allocations of a process, as the CUDA
// hooks report them, and finds three things:
//
//   - a burst: far more device memory allocated in one interval than the
//     process's own baseline, which is what tips a shared GPU into OOM;
//   - a leak: live device memory that keeps growing while allocations older
//     than a request would live pile up at the same stack;
//   - failed allocations, named by their error, API, size and stack.
//
// Healthy programs do much that looks alike at a glance: caching allocators
// grab a large pool once and keep it, training loops allocate and free the
// same amount every step. The detectors ask for the signal that tells those
// apart: a burst must beat the process's own mean and spread, a leak must
// grow steadily and pin old bytes to one stack.
package gpualloc

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/series"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Config holds the detector thresholds. Zero fields take the DefaultConfig value.
type Config struct {
	// Bursts. The baseline is an exponentially weighted mean and variance
	// of the allocation rate, learnt from intervals that were not bursts.
	WarmUp         int     // intervals learnt before the baseline is trusted
	Sigmas         float64 // a burst exceeds the baseline mean by this many standard deviations
	MinRatio       float64 // and is at least this many times the baseline mean
	BurstFloor     uint64  // bytes in one interval below which nothing is a burst
	BurstCeiling   uint64  // bytes in one interval that are a burst even during warm-up
	Alpha          float64 // weight of each new interval in the baseline
	QuietIntervals int     // intervals without a burst before a burst finding ends

	// Leaks.
	LeakWindow time.Duration // trend window of live bytes
	LeakMinAge time.Duration // an allocation counts as piling up only if older than this
	// Consecutive samples the leak condition must hold before a finding is
	// raised: a ring or pool filling early in the window, plus noise, can
	// pass for a leak in the last sample or two before the fill leaves it.
	LeakConfirm int

	// Failures.
	FailureQuiet time.Duration // time without a new failure before a failure finding ends
}

// DefaultConfig returns the thresholds used when none are given.
func DefaultConfig() Config {
	return Config{
		WarmUp:         5,
		Sigmas:         4,
		MinRatio:       2,
		BurstFloor:     256 << 20,
		BurstCeiling:   4 << 30,
		Alpha:          0.1,
		QuietIntervals: 3,
		LeakWindow:     30 * time.Second,
		LeakMinAge:     10 * time.Second,
		LeakConfirm:    3,
		FailureQuiet:   30 * time.Second,
	}
}

// Steadiness thresholds of the leak trend, as in the fd-leak detector: a
// leak adds bytes on most steps, keeps adding them to the end of the window,
// and never takes a large share of its rise in one step. A pool that warms
// up is one big step, or a ramp that stops.
var steadiness = series.Steadiness{MinRisingShare: 0.6, MinRiseOfMean: 0.25, MaxStepShare: 0.5, MinLateShare: 0.25}

const topSitesShown = 3 // sites listed in the evidence

// Detector keeps a short history per process. It is safe for concurrent use.
type Detector struct {
	cfg   Config
	mu    sync.Mutex
	procs map[int]*procState
}

type procState struct {
	// Bursts.
	last         time.Time // previous observation; zero before the first
	bytes, calls uint64    // allocation totals at last
	learnt       int       // intervals in the baseline
	mean, vari   float64   // baseline allocation rate (bytes/s) and its variance
	burst        *model.Finding
	bursts       int // flagged intervals of the open burst finding
	quiet        int // intervals since its last flagged one

	// Leaks.
	series   []sample
	leak     *model.Finding
	leakHeld time.Time // last sample at which the leak condition held
	leakRun  int       // consecutive samples the leak condition held, before a finding

	// Failures.
	counted  *model.CUDAFailure // the last entry of p.CUDA.Failures already counted
	failures map[failKey]*failGroup
}

type sample struct {
	t    time.Time
	live int64
	old  map[int64]int64 // bytes older than LeakMinAge, by stack id (known stacks only)
}

// New returns a detector with cfg, zero fields replaced by defaults.
func New(cfg Config) *Detector {
	def := DefaultConfig()
	orDef := func(v *float64, d float64) {
		if *v <= 0 {
			*v = d
		}
	}
	orDef(&cfg.Sigmas, def.Sigmas)
	orDef(&cfg.MinRatio, def.MinRatio)
	orDef(&cfg.Alpha, def.Alpha)
	if cfg.WarmUp <= 0 {
		cfg.WarmUp = def.WarmUp
	}
	if cfg.BurstFloor == 0 {
		cfg.BurstFloor = def.BurstFloor
	}
	if cfg.BurstCeiling == 0 {
		cfg.BurstCeiling = def.BurstCeiling
	}
	if cfg.QuietIntervals <= 0 {
		cfg.QuietIntervals = def.QuietIntervals
	}
	if cfg.LeakWindow <= 0 {
		cfg.LeakWindow = def.LeakWindow
	}
	if cfg.LeakMinAge <= 0 {
		cfg.LeakMinAge = def.LeakMinAge
	}
	if cfg.LeakConfirm <= 0 {
		cfg.LeakConfirm = def.LeakConfirm
	}
	if cfg.FailureQuiet <= 0 {
		cfg.FailureQuiet = def.FailureQuiet
	}
	return &Detector{cfg: cfg, procs: make(map[int]*procState)}
}

// Observe takes one sample of a process (p.CUDA filled; p.PID, p.Comm set)
// taken at now, and returns the findings about that process that are new,
// still active (updated LastSeen and evidence) or just ended. A finding that
// ends is returned once with Active=false and then no more.
func (d *Detector) Observe(now time.Time, p *model.Process) []model.Finding {
	d.mu.Lock()
	defer d.mu.Unlock()

	st := d.procs[p.PID]
	if st == nil {
		st = &procState{failures: map[failKey]*failGroup{}}
		d.procs[p.PID] = st
	}
	var out []model.Finding
	out = append(out, d.observeBurst(now, p, st)...)
	out = append(out, d.observeLeak(now, p, st)...)
	out = append(out, d.observeFailures(now, p, st)...)
	return out
}

// Forget drops all state of pid (process exited).
func (d *Detector) Forget(pid int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.procs, pid)
}

// ---- bursts ----

func (d *Detector) observeBurst(now time.Time, p *model.Process, st *procState) []model.Finding {
	bytes, calls := deviceAllocBytes(&p.CUDA), sum(p.CUDA.AllocCalls)
	first := st.last.IsZero()
	if !first && !now.After(st.last) {
		// The clock stepped back: no interval to judge; start over from here.
		st.last, st.bytes, st.calls = now, bytes, calls
		return d.burstUpdate(now, p, st, false, burstWindow{})
	}
	if bytes < st.bytes || calls < st.calls {
		// Totals went down: the source restarted its counters.
		st.bytes, st.calls = 0, 0
	}
	w := burstWindow{bytes: bytes - st.bytes, calls: calls - st.calls, since: st.last}
	st.last, st.bytes, st.calls = now, bytes, calls

	var flagged bool
	switch {
	case first:
		// The totals since attach, over an unknown span: only the
		// ceiling can judge them, and they teach the baseline nothing.
		flagged = w.bytes >= d.cfg.BurstCeiling
	default:
		dt := now.Sub(w.since).Seconds()
		rate := float64(w.bytes) / dt
		w.seconds = dt
		w.mean, w.stddev = st.mean*dt, math.Sqrt(st.vari)*dt
		if st.learnt < d.cfg.WarmUp {
			flagged = w.bytes >= d.cfg.BurstCeiling
		} else {
			flagged = w.bytes >= d.cfg.BurstFloor &&
				rate > st.mean+d.cfg.Sigmas*math.Sqrt(st.vari) &&
				rate >= d.cfg.MinRatio*st.mean
		}
		if !flagged {
			st.learn(rate, d.cfg.Alpha)
		}
	}
	return d.burstUpdate(now, p, st, flagged, w)
}

// burstWindow is one interval's allocations and the baseline they were judged by.
type burstWindow struct {
	since        time.Time
	seconds      float64 // 0: the first interval, span unknown
	bytes, calls uint64
	mean, stddev float64 // baseline bytes for an interval this long
}

// learn folds one interval's rate into the baseline. The weight starts at
// 1/n, which makes the warm-up a plain mean and variance instead of one
// dominated by the first interval, and settles at alpha.
func (st *procState) learn(rate, alpha float64) {
	st.learnt++
	a := max(alpha, 1/float64(st.learnt))
	diff := rate - st.mean
	st.mean += a * diff
	st.vari = (1 - a) * (st.vari + a*diff*diff)
}

func (d *Detector) burstUpdate(now time.Time, p *model.Process, st *procState, flagged bool, w burstWindow) []model.Finding {
	switch {
	case flagged && st.burst == nil:
		st.burst = &model.Finding{Kind: model.KindGPUAllocBurst, PID: p.PID, FirstSeen: now, Active: true}
		st.bursts = 0
		fallthrough
	case flagged:
		st.bursts++
		st.quiet = 0
		d.fillBurst(st.burst, st.bursts, p, w)
	case st.burst == nil:
		return nil
	default:
		st.quiet++
		if st.quiet >= d.cfg.QuietIntervals {
			f := *st.burst
			f.Active, f.LastSeen = false, now
			f.Summary = strings.Replace(f.Summary, "GPU allocation burst", "GPU allocation burst ended", 1)
			st.burst = nil
			return []model.Finding{f}
		}
	}
	st.burst.Comm, st.burst.LastSeen = p.Comm, now
	// A copy: findings handed out earlier share the map.
	st.burst.Evidence = maps.Clone(st.burst.Evidence)
	st.burst.Evidence["live_bytes"] = p.CUDA.LiveBytes
	return []model.Finding{*st.burst}
}

// fillBurst sets f's evidence from the flagged interval w.
func (d *Detector) fillBurst(f *model.Finding, bursts int, p *model.Process, w burstWindow) {
	sites := recentSites(p.CUDA.Sites, w.since)
	top := make([]map[string]any, 0, topSitesShown)
	for _, s := range sites[:min(len(sites), topSitesShown)] {
		top = append(top, map[string]any{"stack": slices.Clone(s.stack), "bytes": s.bytes})
	}
	f.Severity = model.SeverityWarning
	f.Stack = nil
	if len(sites) > 0 {
		f.Stack = slices.Clone(sites[0].stack)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "GPU allocation burst: %s in %d calls", human(float64(w.bytes)), w.calls)
	if w.seconds > 0 {
		fmt.Fprintf(&b, " within %.1fs, baseline %s ± %s", w.seconds, human(w.mean), human(w.stddev))
	} else {
		b.WriteString(" right after attach")
	}
	if len(sites) > 0 {
		fmt.Fprintf(&b, "; most at %s", callSite(sites[0].stack))
	}
	f.Summary = b.String()
	f.Evidence = map[string]any{
		"bytes_in_window":       w.bytes,
		"calls_in_window":       w.calls,
		"window_seconds":        series.Round(w.seconds, 2),
		"baseline_bytes_mean":   math.Round(w.mean),
		"baseline_bytes_stddev": math.Round(w.stddev),
		"bursts":                bursts,
		"live_bytes":            p.CUDA.LiveBytes,
		"top_sites":             top,
	}
}

type recentSite struct {
	stack []string
	bytes uint64
}

// recentSites returns the sites of live allocations made after since, most
// bytes first. A site's bytes are split evenly over its allocations: the
// source reports bytes per site, not per allocation. Allocations already
// freed within the interval do not show.
func recentSites(sites []model.CUDASite, since time.Time) []recentSite {
	var out []recentSite
	for _, s := range sites {
		if len(s.Allocs) == 0 {
			continue
		}
		n := 0
		for _, at := range s.Allocs {
			if at.After(since) {
				n++
			}
		}
		if n > 0 {
			out = append(out, recentSite{stack: s.Stack, bytes: share(s.Bytes, n, len(s.Allocs))})
		}
	}
	slices.SortStableFunc(out, func(a, b recentSite) int { return cmp.Compare(b.bytes, a.bytes) })
	return out
}

// share is n/of of bytes, without overflowing the product.
func share(bytes uint64, n, of int) uint64 {
	return uint64(float64(bytes) * float64(n) / float64(of))
}

// ---- leaks ----

// siteView is one known-stack site as of the latest sample.
type siteView struct {
	id       int64
	stack    []string
	bytes    uint64
	allocs   int
	oldBytes int64         // bytes older than LeakMinAge
	oldest   time.Duration // age of its oldest live allocation
	growth   int64         // rise of oldBytes over the window when spread over it, else 0
}

func (d *Detector) observeLeak(now time.Time, p *model.Process, st *procState) []model.Finding {
	sites, old := d.leakSites(now, p.CUDA.Sites)
	st.series = series.Push(st.series, sample{t: now, live: int64(p.CUDA.LiveBytes), old: old}, now, d.cfg.LeakWindow,
		func(s sample) time.Time { return s.t })

	a := d.assess(st.series, sites)
	switch {
	case st.leak == nil:
		if !a.leak() {
			st.leakRun = 0
			return nil
		}
		if st.leakRun++; st.leakRun < d.cfg.LeakConfirm {
			return nil
		}
		st.leakRun = 0
		st.leak = &model.Finding{Kind: model.KindGPUMemoryLeak, PID: p.PID, FirstSeen: now}
		st.leakHeld = now
	case a.leak() || a.held():
		st.leakHeld = now
	case now.Sub(st.leakHeld) >= d.cfg.LeakWindow:
		f := d.fillLeak(*st.leak, now, p, a, false)
		st.leak = nil
		return []model.Finding{f}
	}
	*st.leak = d.fillLeak(*st.leak, now, p, a, true)
	return []model.Finding{*st.leak}
}

// leakSites returns the known-stack sites holding allocations older than
// LeakMinAge, and their old bytes by stack id for the history.
func (d *Detector) leakSites(now time.Time, cudaSites []model.CUDASite) ([]siteView, map[int64]int64) {
	var views []siteView
	old := map[int64]int64{}
	for _, s := range cudaSites {
		if s.StackID < 0 || len(s.Allocs) == 0 {
			continue
		}
		v := siteView{id: s.StackID, stack: s.Stack, bytes: s.Bytes, allocs: len(s.Allocs)}
		n := 0
		for _, at := range s.Allocs {
			age := now.Sub(at)
			if age > d.cfg.LeakMinAge {
				n++
			}
			v.oldest = max(v.oldest, age)
		}
		if n == 0 {
			continue
		}
		v.oldBytes = int64(share(s.Bytes, n, len(s.Allocs)))
		views = append(views, v)
		old[v.id] = v.oldBytes
	}
	return views, old
}

// assessment is what the window says about one process.
type assessment struct {
	covered bool          // the series spans about a full window
	span    time.Duration // time the series covers
	slope   float64       // least-squares growth of live bytes, bytes/s
	steady  bool          // the growth is spread over the window
	sites   []siteView    // sites with old bytes, fastest growing first
	topGrew bool          // sites[0]'s old bytes grew over the window
}

func (d *Detector) assess(smps []sample, sites []siteView) assessment {
	first, last := smps[0], smps[len(smps)-1]
	a := assessment{span: last.t.Sub(first.t), sites: sites}
	ts := make([]time.Time, len(smps))
	live := make([]int64, len(smps))
	for i, smp := range smps {
		ts[i], live[i] = smp.t, smp.live
	}
	if len(smps) >= 2 {
		a.covered = series.Covered(a.span, d.cfg.LeakWindow, len(smps))
		a.slope = series.Slope(ts, live)
		a.steady = series.Steady(live, steadiness)
	}
	// Rank sites by how their old bytes grew, not by their size: a pool
	// that warmed up long ago holds more old bytes than a young leak. A
	// batch allocated together crosses LeakMinAge in one step and does not
	// count as growth.
	vals := make([]int64, len(smps))
	for i := range sites {
		for j, smp := range smps {
			vals[j] = smp.old[sites[i].id]
		}
		sites[i].growth = lateRise(vals)
	}
	slices.SortFunc(sites, func(x, y siteView) int {
		return cmp.Or(cmp.Compare(y.growth, x.growth), cmp.Compare(y.oldBytes, x.oldBytes), cmp.Compare(x.id, y.id))
	})
	a.topGrew = len(sites) > 0 && sites[0].growth > 0
	return a
}

// leak is the condition to raise a finding: live bytes rise steadily over a
// full window and old bytes pile up at one stack.
func (a assessment) leak() bool {
	return a.covered && a.steady && a.slope > 0 && a.topGrew
}

// held is the weaker condition that keeps a raised finding open, so that a
// leak that slows down or turns jumpy is not reported as ended and raised again.
func (a assessment) held() bool {
	return a.slope > 0 && a.topGrew
}

func (d *Detector) fillLeak(f model.Finding, now time.Time, p *model.Process, a assessment, active bool) model.Finding {
	top := make([]map[string]any, 0, topSitesShown)
	for _, s := range a.sites[:min(len(a.sites), topSitesShown)] {
		top = append(top, map[string]any{
			"stack":              slices.Clone(s.stack),
			"bytes":              s.bytes,
			"old_bytes":          s.oldBytes,
			"old_bytes_growth":   s.growth,
			"allocations":        s.allocs,
			"oldest_age_seconds": series.Round(s.oldest.Seconds(), 1),
		})
	}
	f.Comm = p.Comm
	f.LastSeen = now
	f.Active = active
	f.Severity = model.SeverityWarning
	f.Stack = nil
	var oldTop int64
	if len(a.sites) > 0 {
		f.Stack = slices.Clone(a.sites[0].stack)
		oldTop = a.sites[0].oldBytes
	}

	var b strings.Builder
	head := "GPU memory leak"
	if !active {
		head = "GPU memory leak ended"
	}
	fmt.Fprintf(&b, "%s: %s live growing %s/s", head, human(float64(p.CUDA.LiveBytes)), human(a.slope))
	if len(a.sites) > 0 {
		where := fmt.Sprintf("stack #%d", a.sites[0].id) // beyond the symbolized sites
		if len(a.sites[0].stack) > 0 {
			where = callSite(a.sites[0].stack)
		}
		fmt.Fprintf(&b, "; %s older than %s allocated at %s", human(float64(oldTop)), d.cfg.LeakMinAge, where)
	}
	f.Summary = b.String()
	f.Evidence = map[string]any{
		"live_bytes":               p.CUDA.LiveBytes,
		"live_allocations":         p.CUDA.LiveAllocs,
		"growth_bytes_per_second":  math.Round(a.slope),
		"window_seconds":           series.Round(a.span.Seconds(), 1),
		"old_bytes_at_top_site":    oldTop,
		"top_sites":                top,
		"min_age_seconds":          d.cfg.LeakMinAge.Seconds(),
		"alloc_bytes_since_attach": sum(p.CUDA.AllocBytes),
		"free_bytes_since_attach":  sum(p.CUDA.FreeBytes),
	}
	if p.CUDA.HasNVML {
		f.Evidence["nvml_used_bytes"] = p.CUDA.NVMLUsedBytes
		f.Evidence["untracked_bytes"] = p.CUDA.UntrackedBytes
	}
	return f
}

// lateRise is spreadRise for a site's old bytes, but only when the later
// half of the window carries a fair share of the rise: a leak keeps piling up
// old bytes, while buffers that fill a ring or a pool once stop ageing into
// the count once it is full.
func lateRise(vals []int64) int64 {
	rise := series.SpreadRise(vals, steadiness.MaxStepShare)
	if float64(series.LateRise(vals)) < steadiness.MinLateShare*float64(rise) {
		return 0
	}
	return rise
}

// ---- failures ----

// failKey groups failures: one finding per API, error and stack.
type failKey struct {
	api, err string
	code     int // tells errors apart when the source has no name for them
	stack    string
}

type failGroup struct {
	f       model.Finding
	count   int
	first   time.Time // first failure's time
	last    time.Time // last failure's time
	lastNew time.Time // observation that last brought a failure
	size    uint64    // last requested size
	maxSize uint64
}

func (d *Detector) observeFailures(now time.Time, p *model.Process, st *procState) []model.Finding {
	fails := newFailures(p.CUDA.Failures, st.counted)
	if len(fails) > 0 {
		last := fails[len(fails)-1] // a copy: the list is the source's
		st.counted = &last
	}
	for _, fl := range fails {
		at := fl.Time
		if at.IsZero() {
			at = now
		}
		k := failKey{fl.API, fl.Error, fl.Code, strings.Join(fl.Stack, "\n")}
		g := st.failures[k]
		if g == nil {
			g = &failGroup{first: at, f: model.Finding{
				Kind: model.KindGPUAllocFailure, PID: p.PID, FirstSeen: st.uniqueFirstSeen(at),
				Stack: slices.Clone(fl.Stack),
			}}
			st.failures[k] = g
		}
		g.count++
		g.last = at
		g.lastNew = now
		g.size = fl.Size
		g.maxSize = max(g.maxSize, fl.Size)
	}

	var out []model.Finding
	for _, k := range slices.SortedFunc(maps.Keys(st.failures), func(a, b failKey) int {
		return st.failures[a].f.FirstSeen.Compare(st.failures[b].f.FirstSeen)
	}) {
		g := st.failures[k]
		active := now.Sub(g.lastNew) < d.cfg.FailureQuiet
		out = append(out, d.fillFailure(g, k, now, p, active))
		if !active {
			delete(st.failures, k)
		}
	}
	return out
}

// newFailures returns the entries of list after counted. The source keeps
// only its newest failures, so a full list stays the same length as new
// ones push old ones out: the last counted entry, not a count, marks where
// the new ones start.
func newFailures(list []model.CUDAFailure, counted *model.CUDAFailure) []model.CUDAFailure {
	if counted == nil {
		return list
	}
	for i := len(list) - 1; i >= 0; i-- {
		f := list[i]
		if f.Time.Equal(counted.Time) && f.API == counted.API && f.Code == counted.Code && f.Size == counted.Size &&
			slices.Equal(f.Stack, counted.Stack) {
			return list[i+1:]
		}
	}
	// All entries are newer than the last one counted.
	return list
}

// uniqueFirstSeen returns at, moved on by a nanosecond while another open
// failure finding of the process has it: findings are told apart by kind,
// pid and first sighting, and two failures may share a timestamp.
func (st *procState) uniqueFirstSeen(at time.Time) time.Time {
	for {
		taken := false
		for _, g := range st.failures {
			if g.f.FirstSeen.Equal(at) {
				taken = true
				break
			}
		}
		if !taken {
			return at
		}
		at = at.Add(time.Nanosecond)
	}
}

func (d *Detector) fillFailure(g *failGroup, k failKey, now time.Time, p *model.Process, active bool) model.Finding {
	f := g.f
	f.Comm = p.Comm
	f.LastSeen = now
	f.Active = active
	oom := outOfMemory(k.err, k.code)
	f.Severity = model.SeverityWarning
	if oom {
		f.Severity = model.SeverityCritical
	}
	errName := k.err
	if errName == "" {
		errName = fmt.Sprintf("error %d", k.code)
	}
	var b strings.Builder
	head := "GPU allocation failed"
	if !active {
		head = "GPU allocation failures ended"
	}
	fmt.Fprintf(&b, "%s: %s returned %s", head, k.api, errName)
	if oom {
		b.WriteString(" (out of memory)")
	}
	fmt.Fprintf(&b, " for %s", human(float64(g.size)))
	if len(f.Stack) > 0 {
		fmt.Fprintf(&b, " at %s", callSite(f.Stack))
	}
	if g.count > 1 {
		fmt.Fprintf(&b, "; %d times", g.count)
	}
	f.Summary = b.String()
	f.Evidence = map[string]any{
		"api":            k.api,
		"error":          k.err,
		"code":           k.code,
		"size_bytes":     g.size,
		"max_size_bytes": g.maxSize,
		"count":          g.count,
		"first_failure":  g.first,
		"last_failure":   g.last,
		"live_bytes":     p.CUDA.LiveBytes,
	}
	return f
}

// outOfMemory tells out-of-memory failures from the rest: by name where the
// source knows it, else by code, which is 2 for out of memory in both the
// runtime (cudaErrorMemoryAllocation) and the driver (CUDA_ERROR_OUT_OF_MEMORY).
func outOfMemory(name string, code int) bool {
	if name == "" {
		return code == 2
	}
	n := strings.ToLower(name)
	return strings.Contains(n, "memoryallocation") || strings.Contains(n, "out_of_memory") || strings.Contains(n, "outofmemory")
}

// ---- helpers ----

// deviceAllocBytes is the bytes allocated on the device since attach: the
// total over all APIs less pinned host memory, which is not on the GPU (as
// LiveBytes leaves it out). Calls are not split: the source does not count
// host calls apart, and a burst is judged by bytes.
func deviceAllocBytes(cs *model.CUDAStats) uint64 {
	all := sum(cs.AllocBytes)
	return all - min(cs.HostAllocBytes, all)
}

func sum(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

// callSite names the frame a reader wants: the innermost one outside the
// CUDA libraries, i.e. the code that asked for the memory. Whether a stack
// starts inside the library or at its caller depends on where it was taken.
func callSite(stack []string) string {
	for _, f := range stack {
		// "sym+0x1 (libcudart.so.12)", or "libcuda.so.1+0x2" unsymbolized.
		if !strings.Contains(f, "(libcuda") && !strings.HasPrefix(f, "libcuda") {
			return f
		}
	}
	if len(stack) > 0 {
		return stack[0]
	}
	return "an unknown stack"
}

// human renders a byte count with a binary unit, e.g. "1.5 GiB".
func human(b float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for math.Abs(b) >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", b)
	}
	return fmt.Sprintf("%.1f %s", b, units[i])
}
