package gpualloc

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/episode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/series"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// A leak is judged at several time scales, and the window that must show it
// shrinks as the evidence grows:
//
//   - fast (LeakFastWindow): many allocations from one site, made all
//     through the window and still held, and live bytes rising by
//     about what they hold. Nothing a request or a training step allocates
//     lives that long at a steady rate; a pool or a warm-up that fills for
//     longer than the window is the price (it is reported, and the finding
//     ends once the fill stops).
//   - classic (LeakWindow): live bytes rising steadily while bytes older
//     than LeakMinAge pile up at one stack; for leaks of fewer, larger or
//     irregular allocations.
//   - slow (LeakScales): as fast, over minutes to hours, on the floors of
//     live bytes (a step's least value: a working set coming and going
//     does not raise it).
//
// A site's allocations must fill every quarter of the window and the later
// half about as much as the earlier: a warm-up that stopped, or one batch,
// leaves quarters empty, and a pool filling towards its size allocates less
// and less.
const (
	quarters        = 4
	minQuarterShare = 0.125 // of the site's allocations in the window, in each quarter of it
	minLateHalf     = 0.4   // of them, in its later half
	minSiteShare    = 0.5   // of the rise of live bytes, held by those allocations
	minHeldShare    = 0.5   // of the bytes they hold, in the rise: no frees elsewhere offset them
)

// Steadiness thresholds of the classic trend, as in the fd-leak detector: a
// leak adds bytes on most steps, keeps adding them to the end of the window,
// and never takes a large share of its rise in one step. A pool that warms
// up is one big step, or a ramp that stops.
var steadiness = series.Steadiness{MinRisingShare: 0.6, MinRiseOfMean: 0.25, MaxStepShare: 0.5, MinLateShare: 0.25}

type sample struct {
	t    time.Time
	live int64
	old  map[int64]int64 // bytes older than LeakMinAge, by stack id (known stacks only)
}

// siteView is one known-stack site as of the latest sample.
type siteView struct {
	id       int64
	stack    []model.Frame
	bytes    uint64
	allocs   int
	times    []time.Time   // allocation time of each live allocation (the source's)
	oldBytes int64         // bytes older than LeakMinAge
	oldest   time.Duration // age of its oldest live allocation
	// Classic: the rise of oldBytes over the window when spread over it, else 0.
	growth int64
	// Fast and slow: its live allocations made within the window, the
	// bytes they hold, whether they fill the window (spread) and reach
	// its last quarter (late).
	kept         int
	keptBytes    uint64
	spread, late bool
}

// verdict is what one time scale says about a process.
type verdict struct {
	window  time.Duration // the time scale
	classic bool          // judged on old bytes, not on the allocations made in the window
	covered bool          // the samples span the window
	span    time.Duration // time they cover
	slope   float64       // growth of live bytes, bytes/s
	sites   []siteView    // ranked, the one reported first
	leak    bool          // raise a finding
	held    bool          // keep a raised one open
}

func (d *Detector) observeLeak(now time.Time, p *model.Process, st *procState) []model.Finding {
	views := d.views(now, p.CUDA.Sites)
	// Kept for the classic window, and for the fast one with a sample before it.
	st.series = series.Push(st.series, sample{t: now, live: int64(p.CUDA.LiveBytes), old: oldBytes(views)}, now,
		max(d.cfg.LeakWindow, 2*d.cfg.LeakFastWindow), func(s sample) time.Time { return s.t })
	st.trend.Add(now, float64(p.CUDA.LiveBytes))

	vs := d.verdicts(now, st, views)
	raised, held := episode.Choose(vs, func(v verdict) bool { return v.leak }, func(v verdict) bool { return v.held })
	v := episode.Verdict{Raise: raised >= 0, Hold: held >= 0}
	if held >= 0 {
		// The scale that holds is the one reported, and keeps the
		// finding open for its window.
		st.shown, v.QuietFor = held, vs[held].window
	}
	return st.leak.Observe(now, model.KindGPUMemoryLeak, p.PID, episode.Rule{ConfirmFor: d.cfg.LeakConfirm}, v,
		func(f model.Finding, active bool) model.Finding { return d.fillLeak(f, now, p, vs[st.shown], active) })
}

// verdicts judges the process on the fast window, the classic one, then
// each slow scale.
func (d *Detector) verdicts(now time.Time, st *procState, views []siteView) []verdict {
	vs := make([]verdict, 0, 2+len(d.cfg.LeakScales))

	// Fast, from the last sample at or before the window's start: a fill
	// that stopped a second before the window began must not pass for
	// one that spans it, as one interval of slack (series.Covered) would
	// let it.
	w := d.cfg.LeakFastWindow
	fast := verdict{window: w, sites: keep(views, now.Add(-w), now)}
	if smps := spanning(st.series, now, w); len(smps) >= 2 {
		fast.span = smps[len(smps)-1].t.Sub(smps[0].t)
		fast.covered = fast.span >= w
		fast.slope = slope(smps)
	}
	d.judgeKept(&fast, fast.slope*w.Seconds(), d.cfg.LeakFastAllocs)
	vs = append(vs, fast)

	vs = append(vs, d.classic(views, within(st.series, now, d.cfg.LeakWindow)))

	for i, sc := range d.cfg.LeakScales {
		tr := st.trend.Trend(i)
		// Held at least one step: an allocation of the step being filled
		// may be a request's.
		v := verdict{window: sc.Window(), covered: tr.Covered(), span: tr.Span, slope: tr.Slope,
			sites: keep(views, now.Add(-sc.Window()), now.Add(-sc.Step))}
		d.judgeKept(&v, tr.Rise(), d.cfg.LeakScaleAllocs)
		vs = append(vs, v)
	}
	return vs
}

// within returns the samples of s taken within window before now.
func within(s []sample, now time.Time, window time.Duration) []sample {
	i, _ := slices.BinarySearchFunc(s, now.Add(-window), func(x sample, t time.Time) int { return x.t.Compare(t) })
	return s[i:]
}

// spanning returns the samples of s from the last one taken at or before
// window before now (the first, if none was).
func spanning(s []sample, now time.Time, window time.Duration) []sample {
	i, found := slices.BinarySearchFunc(s, now.Add(-window), func(x sample, t time.Time) int { return x.t.Compare(t) })
	if !found && i > 0 {
		i--
	}
	return s[i:]
}

func slope(smps []sample) float64 {
	ts := make([]time.Time, len(smps))
	live := make([]int64, len(smps))
	for i, s := range smps {
		ts[i], live[i] = s.t, s.live
	}
	return series.Slope(ts, live)
}

// judgeKept decides a fast or slow verdict from the rise of live bytes over
// its window and its top site.
func (d *Detector) judgeKept(v *verdict, rise float64, minAllocs int) {
	if len(v.sites) == 0 {
		return
	}
	top := v.sites[0]
	kept := float64(top.keptBytes)
	v.leak = v.covered && top.spread && top.kept >= minAllocs && rise >= float64(d.cfg.LeakMinRise) &&
		kept >= minSiteShare*rise && rise >= minHeldShare*kept
	v.held = v.covered && v.slope > 0 && top.late
}

// views returns the known-stack sites with live allocations.
func (d *Detector) views(now time.Time, cudaSites []model.CUDASite) []siteView {
	var views []siteView
	for _, s := range cudaSites {
		if s.StackID < 0 || len(s.Allocs) == 0 {
			continue
		}
		v := siteView{id: s.StackID, stack: s.Stack, bytes: s.Bytes, allocs: len(s.Allocs), times: s.Allocs}
		old := 0
		for _, at := range s.Allocs {
			age := now.Sub(at)
			v.oldest = max(v.oldest, age)
			if age > d.cfg.LeakMinAge {
				old++
			}
		}
		v.oldBytes = int64(share(s.Bytes, old, len(s.Allocs)))
		views = append(views, v)
	}
	return views
}

// keep returns views with what each site made within (from, to] and still
// holds; sites whose allocations fill it first, then by the bytes made there.
func keep(views []siteView, from, to time.Time) []siteView {
	out := slices.Clone(views)
	for i := range out {
		v := &out[i]
		var q [quarters]int
		for _, at := range v.times {
			if at.After(from) && !at.After(to) {
				v.kept++
				q[min(quarters-1, int(quarters*at.Sub(from)/to.Sub(from)))]++
			}
		}
		if v.kept == 0 {
			continue
		}
		v.keptBytes = share(v.bytes, v.kept, v.allocs)
		v.spread = float64(q[2]+q[3]) >= minLateHalf*float64(v.kept)
		for _, n := range q {
			v.spread = v.spread && float64(n) >= minQuarterShare*float64(v.kept)
		}
		v.late = q[quarters-1] > 0
	}
	slices.SortFunc(out, func(x, y siteView) int {
		return cmp.Or(cmpBool(y.spread, x.spread), cmp.Compare(y.keptBytes, x.keptBytes), cmp.Compare(y.bytes, x.bytes), cmp.Compare(x.id, y.id))
	})
	return out
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// oldBytes returns the bytes older than LeakMinAge by stack id, for the
// classic history.
func oldBytes(views []siteView) map[int64]int64 {
	old := map[int64]int64{}
	for _, v := range views {
		if v.oldBytes > 0 {
			old[v.id] = v.oldBytes
		}
	}
	return old
}

// classic judges live bytes over LeakWindow and old bytes by site.
func (d *Detector) classic(views []siteView, smps []sample) verdict {
	v := verdict{window: d.cfg.LeakWindow, classic: true}
	for _, s := range views {
		if s.oldBytes > 0 {
			v.sites = append(v.sites, s)
		}
	}
	first, last := smps[0], smps[len(smps)-1]
	v.span = last.t.Sub(first.t)
	live := make([]int64, len(smps))
	for i, smp := range smps {
		live[i] = smp.live
	}
	steady := false
	if len(smps) >= 2 {
		v.covered = series.Covered(v.span, d.cfg.LeakWindow, len(smps))
		v.slope = slope(smps)
		steady = series.Steady(live, steadiness)
	}
	// Rank sites by how their old bytes grew, not by their size: a pool
	// that warmed up long ago holds more old bytes than a young leak. A
	// batch allocated together crosses LeakMinAge in one step and does not
	// count as growth.
	vals := make([]int64, len(smps))
	for i := range v.sites {
		for j, smp := range smps {
			vals[j] = smp.old[v.sites[i].id]
		}
		v.sites[i].growth = lateRise(vals)
	}
	slices.SortFunc(v.sites, func(x, y siteView) int {
		return cmp.Or(cmp.Compare(y.growth, x.growth), cmp.Compare(y.oldBytes, x.oldBytes), cmp.Compare(x.id, y.id))
	})
	topGrew := len(v.sites) > 0 && v.sites[0].growth > 0
	// Raised: live bytes rise steadily over a full window and old bytes
	// pile up at one stack. Held, the weaker condition that keeps a raised
	// finding open, so that a leak that slows down or turns jumpy is not
	// reported as ended and raised again.
	v.leak = v.covered && steady && v.slope > 0 && topGrew
	v.held = v.slope > 0 && topGrew
	return v
}

// lateRise is SpreadRise for a site's old bytes, but only when the later
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

func (d *Detector) fillLeak(f model.Finding, now time.Time, p *model.Process, v verdict, active bool) model.Finding {
	f.Comm = p.Comm
	f.LastSeen = now
	f.Active = active
	f.Stack = nil
	top := make([]model.GPULeakSite, 0, topSitesShown)
	for _, s := range v.sites[:min(len(v.sites), topSitesShown)] {
		site := model.GPULeakSite{
			Stack:            slices.Clone(s.stack),
			Bytes:            s.bytes,
			Allocations:      s.allocs,
			OldBytes:         s.oldBytes,
			OldestAgeSeconds: series.Round(s.oldest.Seconds(), 1),
		}
		if v.classic {
			site.OldBytesGrowth = new(s.growth)
		} else {
			site.KeptAllocations, site.KeptBytes = new(s.kept), new(s.keptBytes)
		}
		top = append(top, site)
	}
	var where string
	if len(v.sites) > 0 {
		f.Stack = slices.Clone(v.sites[0].stack)
		where = fmt.Sprintf("stack #%d", v.sites[0].id) // beyond the symbolized sites
		if len(v.sites[0].stack) > 0 {
			where = callSite(v.sites[0].stack)
		}
	}
	ex := d.exhaustion(p, v.slope)
	f.Severity = model.SeverityWarning
	if ex.known && ex.seconds <= d.cfg.ExhaustWithin.Seconds() {
		f.Severity = model.SeverityCritical
	}

	var b strings.Builder
	head := "GPU memory leak"
	if !active {
		head = "GPU memory leak ended"
	}
	live := human(float64(p.CUDA.LiveBytes))
	if v.classic {
		fmt.Fprintf(&b, "%s: %s live growing %s/s", head, live, human(v.slope))
		if len(v.sites) > 0 {
			fmt.Fprintf(&b, "; %s older than %s allocated at %s", human(float64(v.sites[0].oldBytes)), d.cfg.LeakMinAge, where)
		}
	} else {
		fmt.Fprintf(&b, "%s: %s live growing %s over %s", head, live, growthRate(v.slope), series.RoughSeconds(v.window.Seconds()))
		if len(v.sites) > 0 {
			top := v.sites[0]
			fmt.Fprintf(&b, "; %d allocations (%s) made at %s in that time still held", top.kept, human(float64(top.keptBytes)), where)
		}
	}
	if ex.known {
		fmt.Fprintf(&b, "; %s in ~%s at this rate", ex.what, series.RoughSeconds(ex.seconds))
	}
	f.Summary = b.String()

	ev := model.GPUMemoryLeakEvidence{
		LiveBytes:             p.CUDA.LiveBytes,
		LiveAllocations:       p.CUDA.LiveAllocs,
		GrowthBytesPerSecond:  math.Round(v.slope),
		WindowSeconds:         series.Round(v.span.Seconds(), 1),
		TimeScaleSeconds:      v.window.Seconds(),
		TopSites:              top,
		AllocBytesSinceAttach: sum(p.CUDA.AllocBytes),
		FreeBytesSinceAttach:  sum(p.CUDA.FreeBytes),
	}
	ex.evidence(&ev)
	if v.classic {
		var oldTop int64
		if len(v.sites) > 0 {
			oldTop = v.sites[0].oldBytes
		}
		ev.OldBytesAtTopSite = &oldTop
		ev.MinAgeSeconds = new(d.cfg.LeakMinAge.Seconds())
	}
	if p.CUDA.HasNVML {
		ev.NVMLUsedBytes = new(p.CUDA.NVMLUsedBytes)
		ev.UntrackedBytes = new(p.CUDA.UntrackedBytes)
	}
	f.Evidence = ev
	return f
}

// growthRate renders a growth in bytes/s in the unit of time that reads
// best (a finding that ended may report a fall).
func growthRate(perSecond float64) string {
	switch a := math.Abs(perSecond); {
	case a >= 1<<20:
		return human(perSecond) + "/s"
	case a*60 >= 1<<20:
		return human(perSecond*60) + "/min"
	default:
		return human(perSecond*3600) + "/h"
	}
}
