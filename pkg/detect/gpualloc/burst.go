package gpualloc

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/series"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// maxBurstGroups bounds the call sites whose bursts a process remembers;
// beyond it those that ended longest ago are forgotten first.
const maxBurstGroups = 16

// recurFactor: a recurring burst's finding ends once this many periods
// passed without a burst.
const recurFactor = 2

// occurrence is one burst: a run of flagged intervals in a row.
type occurrence struct {
	group *burstGroup
	start uint64 // live bytes before it
	peak  uint64 // the most live bytes during it
}

// burstGroup is the finding of one call site's bursts.
type burstGroup struct {
	key        string // the call site; "" while no burst of it was caught live
	f          model.Finding
	active     bool
	superseded bool   // a markedly larger burst of the site opened a new finding
	opened     uint64 // the burst that opened the finding

	count       int       // occurrences
	first, last time.Time // when the first and the latest began
	flagged     time.Time // the latest flagged interval
	quiet       int       // intervals since it

	size, largest         uint64 // the latest occurrence's burst, and the largest
	peakLive, largestPeak uint64 // live bytes at their peaks
	base                  uint64 // live bytes before the latest occurrence
	near                  string // what a peak came close to (Detector.nearFull); "" for nothing
	w                     burstWindow
	sites                 []recentSite // caught live in the latest flagged interval that had any
}

// burstWindow is one flagged interval and the baseline it was judged by.
type burstWindow struct {
	seconds      float64 // 0: the first interval, span unknown
	bytes, calls uint64  // allocated within it
	mean, stddev float64 // baseline rise
}

func (d *Detector) observeBursts(now time.Time, p *model.Process, st *procState, iv interval, ok bool) []model.Finding {
	var out []model.Finding
	var flagged *burstGroup
	if ok {
		var superseded *burstGroup
		flagged, superseded = d.judgeBurst(now, p, st, iv)
		if superseded != nil {
			out = append(out, d.fillBurst(superseded, now, p))
		}
	} else {
		st.run = nil
	}
	for _, g := range st.bursts {
		if g == flagged {
			g.quiet = 0
		} else {
			g.quiet++
			if g.active && d.burstEnded(now, g) {
				g.active = false
				out = append(out, d.fillBurst(g, now, p))
			}
		}
		if g.active {
			out = append(out, d.fillBurst(g, now, p))
		}
	}
	st.bursts = slices.DeleteFunc(st.bursts, func(g *burstGroup) bool {
		return !g.active && (g.superseded || now.Sub(g.flagged) > d.cfg.RecurWithin)
	})
	if n := len(st.bursts) - maxBurstGroups; n > 0 {
		ended := slices.DeleteFunc(slices.Clone(st.bursts), func(g *burstGroup) bool { return g.active })
		slices.SortFunc(ended, func(a, b *burstGroup) int { return a.flagged.Compare(b.flagged) })
		drop := ended[:min(n, len(ended))]
		st.bursts = slices.DeleteFunc(st.bursts, func(g *burstGroup) bool { return slices.Contains(drop, g) })
	}
	return out
}

// judgeBurst judges the interval and, when it is a burst, files it under
// its site's group, which it returns. A group that a markedly larger burst
// of its site superseded is returned too, ended, to be reported once.
func (d *Detector) judgeBurst(now time.Time, p *model.Process, st *procState, iv interval) (flagged, superseded *burstGroup) {
	rise := iv.rise()
	w := burstWindow{seconds: iv.seconds, bytes: iv.bytes, calls: iv.calls, mean: st.mean, stddev: math.Sqrt(st.vari)}
	var burst bool
	if iv.seconds == 0 || st.learnt < d.cfg.WarmUp {
		// The first interval's span is unknown and warm-up has no
		// baseline yet: only the ceiling can judge them.
		burst = rise >= d.cfg.BurstCeiling
	} else {
		burst = rise >= d.cfg.BurstFloor &&
			float64(rise) > w.mean+d.cfg.Sigmas*w.stddev &&
			float64(rise) >= d.cfg.MinRatio*w.mean
	}
	if !burst {
		if iv.seconds > 0 {
			st.learn(float64(rise), d.cfg.Alpha)
		}
		st.run = nil
		return nil, nil
	}

	sites := recentSites(p.CUDA.Sites, iv.since)
	key := ""
	if len(sites) > 0 {
		key = sites[0].key
	}
	// Memory taken over more than one interval is one burst, unless
	// another site took over.
	near := d.nearFull(p.PID, iv.peak)
	if r := st.run; r != nil && (key == "" || r.group.key == "" || key == r.group.key) {
		r.peak = max(r.peak, iv.peak)
		r.group.record(now, key, r.peak-min(r.peak, r.start), r.peak, sites, w, near)
		return r.group, nil
	}
	g := st.burstGroup(key)
	if g != nil && float64(rise) >= d.cfg.RegrowRatio*float64(g.opened) {
		// Markedly larger than what its finding reported: a new finding.
		g.superseded = true
		if g.active {
			g.active = false
			superseded = g
		}
		g = nil
	}
	if g == nil {
		g = &burstGroup{f: model.Finding{Kind: model.KindGPUAllocBurst, PID: p.PID, FirstSeen: now}, opened: rise, first: now}
		st.bursts = append(st.bursts, g)
	}
	g.active = true
	g.count++
	g.last = now
	g.base = iv.start
	g.record(now, key, rise, iv.peak, sites, w, near)
	st.run = &occurrence{group: g, start: iv.start, peak: iv.peak}
	return g, superseded
}

// burstGroup returns the group a burst caught at site key belongs to: the
// site's, else one whose site was never caught; for a burst whose site was
// not caught, the one that burst last.
func (st *procState) burstGroup(key string) *burstGroup {
	var same, unknown, latest *burstGroup
	for _, g := range st.bursts {
		if g.superseded {
			continue
		}
		if key != "" && g.key == key {
			same = g
		}
		if g.key == "" && (unknown == nil || g.flagged.After(unknown.flagged)) {
			unknown = g
		}
		if latest == nil || g.flagged.After(latest.flagged) {
			latest = g
		}
	}
	if key == "" {
		return latest
	}
	return cmp.Or(same, unknown)
}

// record notes a flagged interval of the group's latest occurrence, whose
// burst is now size with live bytes at peak, which came near what near
// says. A group that came near once stays so.
func (g *burstGroup) record(now time.Time, key string, size, peak uint64, sites []recentSite, w burstWindow, near string) {
	if near != "" {
		g.near = near
	}
	if g.key == "" {
		g.key = key
	}
	g.flagged = now
	g.size, g.peakLive = size, peak
	g.largest, g.largestPeak = max(g.largest, size), max(g.largestPeak, peak)
	g.w = w
	if len(sites) > 0 {
		g.sites = sites
	}
}

// burstEnded reports whether an open group has been quiet long enough: a
// burst seen once, QuietIntervals intervals; a recurring one, also
// recurFactor periods.
func (d *Detector) burstEnded(now time.Time, g *burstGroup) bool {
	if g.quiet < d.cfg.QuietIntervals {
		return false
	}
	if p, ok := g.period(); ok {
		return now.Sub(g.flagged) >= time.Duration(recurFactor*float64(p))
	}
	return true
}

// period is the mean time between the starts of the group's bursts.
func (g *burstGroup) period() (time.Duration, bool) {
	if g.count < 2 {
		return 0, false
	}
	return g.last.Sub(g.first) / time.Duration(g.count-1), true
}

// learn folds one interval's rise into the baseline. The weight starts at
// 1/n, which makes the warm-up a plain mean and variance instead of one
// dominated by the first interval, and settles at alpha.
func (st *procState) learn(rise, alpha float64) {
	st.learnt++
	a := max(alpha, 1/float64(st.learnt))
	diff := rise - st.mean
	st.mean += a * diff
	st.vari = (1 - a) * (st.vari + a*diff*diff)
}

// fillBurst returns the group's finding as of now.
func (d *Detector) fillBurst(g *burstGroup, now time.Time, p *model.Process) model.Finding {
	f := g.f
	f.Comm, f.LastSeen, f.Active = p.Comm, now, g.active
	startup := d.startupStep(g, p)
	switch {
	case g.near != "":
		f.Severity = model.SeverityCritical
	case startup:
		f.Severity = model.SeverityInfo
	default:
		f.Severity = model.SeverityWarning
	}
	f.Stack = nil
	if len(g.sites) > 0 {
		f.Stack = slices.Clone(g.sites[0].stack)
	}
	top := make([]model.BurstSite, 0, topSitesShown)
	for _, s := range g.sites[:min(len(g.sites), topSitesShown)] {
		top = append(top, model.BurstSite{Stack: slices.Clone(s.stack), Bytes: s.bytes, Share: g.share(s)})
	}

	var b strings.Builder
	head := "GPU allocation burst"
	if !g.active {
		head = "GPU allocation burst ended"
	}
	fmt.Fprintf(&b, "%s: %s taken and held at once (live peak %s)", head, human(float64(g.size)), human(float64(g.peakLive)))
	if g.w.seconds > 0 {
		fmt.Fprintf(&b, ", baseline %s ± %s", human(g.w.mean), human(g.w.stddev))
	} else {
		b.WriteString(" right after attach")
	}
	if len(g.sites) > 0 {
		fmt.Fprintf(&b, "; most at %s", g.key)
		if g.w.bytes > 0 {
			fmt.Fprintf(&b, ": %.0f %% of the %s allocated then", 100*g.share(g.sites[0]), human(float64(g.w.bytes)))
		}
	}
	var nearFull *string // what the peak came close to; nil for nothing
	if g.near != "" {
		nearFull = new(g.near)
	}
	var period *float64 // seconds between bursts; nil until one recurs
	if pd, ok := g.period(); ok {
		period = new(series.Round(pd.Seconds(), 1))
		fmt.Fprintf(&b, "; %d times, every ~%s, largest %s", g.count, series.RoughSeconds(pd.Seconds()), human(float64(g.largest)))
	}
	switch {
	case g.near != "":
		fmt.Fprintf(&b, "; live peak %s", g.near)
	case startup:
		b.WriteString("; still held: a start-up step (weights loaded, allocator warm-up, cache reserved)")
	}
	f.Summary = b.String()
	f.Evidence = model.GPUAllocBurstEvidence{
		BurstBytes:           g.size,
		PeakLiveBytes:        g.peakLive,
		LargestBurstBytes:    g.largest,
		LargestPeakLiveBytes: g.largestPeak,
		Occurrences:          g.count,
		PeriodSeconds:        period,
		BytesInWindow:        g.w.bytes,
		CallsInWindow:        g.w.calls,
		WindowSeconds:        series.Round(g.w.seconds, 2),
		BaselineBytesMean:    math.Round(g.w.mean),
		BaselineBytesStddev:  math.Round(g.w.stddev),
		LiveBytes:            p.CUDA.LiveBytes,
		TopSites:             top,
		StartupStep:          startup,
		NearFull:             nearFull,
	}
	return f
}

// startupStep tells whether g is a start-up step: one occurrence, begun
// within StartupWindow of watching p, and still held (heldShare of it live
// above what was live before).
func (d *Detector) startupStep(g *burstGroup, p *model.Process) bool {
	if g.count != 1 || p.Started.IsZero() || g.first.Sub(p.Started) > d.cfg.StartupWindow {
		return false
	}
	return float64(p.CUDA.LiveBytes) >= float64(g.base)+heldShare*float64(g.size)
}

// heldShare is how much of a burst must stay live for it to count as held.
const heldShare = 0.9

// share is the part of the bytes allocated in the group's latest flagged
// interval that site s allocated, 0 to 1.
func (g *burstGroup) share(s recentSite) float64 {
	if g.w.bytes == 0 {
		return 0
	}
	return series.Round(min(float64(s.bytes)/float64(g.w.bytes), 1), 3)
}

type recentSite struct {
	key    string // its call site (callSite), or its stack id when not symbolized
	stack  []model.Frame
	bytes  uint64
	allocs int // its allocations made in the interval
}

// recentSites returns the known-stack call sites that allocated after
// since, most bytes first, each with one of its stacks: from the kernel's
// per-site counters (what each site allocated since the previous poll,
// freed again or not) where the source has them, else from the live
// allocations made after since, a site's bytes split evenly over its
// allocations.
func recentSites(sites []model.CUDASite, since time.Time) []recentSite {
	var out []recentSite
	for _, s := range sites {
		if s.StackID < 0 {
			continue
		}
		bytes, n := s.RecentBytes, int(s.RecentCalls)
		if n == 0 && s.AllocCalls == 0 && len(s.Allocs) > 0 {
			for _, at := range s.Allocs {
				if at.After(since) {
					n++
				}
			}
			bytes = share(s.Bytes, n, len(s.Allocs))
		}
		if n == 0 {
			continue
		}
		key := fmt.Sprintf("stack #%d", s.StackID)
		if len(s.Stack) > 0 {
			key = callSite(s.Stack)
		}
		// One call site may come under several stacks (another caller
		// further out, a stack first finished in user space): one entry.
		if i := slices.IndexFunc(out, func(r recentSite) bool { return r.key == key }); i >= 0 {
			out[i].bytes += bytes
			out[i].allocs += n
			continue
		}
		out = append(out, recentSite{key: key, stack: s.Stack, bytes: bytes, allocs: n})
	}
	slices.SortStableFunc(out, func(a, b recentSite) int { return cmp.Compare(b.bytes, a.bytes) })
	return out
}

// share is n/of of bytes, without overflowing the product.
func share(bytes uint64, n, of int) uint64 {
	return uint64(float64(bytes) * float64(n) / float64(of))
}
