// Package fdleak finds processes whose open file descriptors keep growing
// because some code path opens fds and never closes them.
//
// It reads only what the fd source reports (live fd count, RLIMIT_NOFILE and
// live fds grouped by opening stack) and judges each process on a short window
// of samples. A leak must show on two signals at once: the fd count rises
// steadily, and one opening stack keeps piling up fds held longer than a
// request or a pool would hold them. Either alone is common in healthy
// programs: pools warm up, bursts come and go, start-up opens a lot at once.
// Close to the fd limit the bar is lower: any steady growth that piles up at
// some site (or that no known stack can account for) is flagged, however slow,
// because the process is about to fail with EMFILE.
//
// Leaks too slow for that window (an fd every few seconds, minutes or hours)
// are judged on longer time scales (series.Multi: per step, the floor of the
// count of fds held longer than MinAge, in bounded memory). There the two
// signals are the floor rising over the scale's window with few falls, and
// one site
// holding fds opened all through that window and never closed: a pool that
// filled and stopped, or start-up opening, has opened nothing held since.
package fdleak

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/episode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/series"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/stack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Config holds the detector thresholds. Zero fields take the DefaultConfig value.
// Window minus MinAge should span several sampling intervals: steadiness is
// judged on the steps between samples, two steps cannot tell a ramp from a
// jump, and a site's old count only starts rising MinAge into a leak.
type Config struct {
	Window        time.Duration // trend window
	MinAge        time.Duration // an fd counts as "unclosed" at a site only if older than this
	MinSlope      float64       // fds/s of sustained growth needed
	MinSiteFDs    int           // old unclosed fds at one site needed
	ExhaustWithin time.Duration // time-to-exhaustion below which severity is critical
	LimitRatio    float64       // live/limit at or above which we flag while growing
	// Scales are the longer time scales slow leaks are judged on, finest
	// first. A leak of r fds/s shows on a scale whose Step is at least
	// about 1/r and whose window holds at least MinRise of its fds.
	Scales []series.Scale
	// MinRise is the least growth, in fds over a scale's window, reported
	// as a slow leak.
	MinRise int
}

// DefaultConfig returns the thresholds used when none are given.
func DefaultConfig() Config {
	return Config{
		Window:        8 * time.Second,
		MinAge:        3 * time.Second,
		MinSlope:      0.5,
		MinSiteFDs:    10,
		ExhaustWithin: 10 * time.Minute,
		LimitRatio:    0.8,
		// 1 fd every 5 s shows within 100 s; 1 a minute within 15 min;
		// 1 every 10 min within 2 h; 1 every 30 min within 12 h.
		Scales: []series.Scale{
			{Step: 5 * time.Second, Points: 20},
			{Step: 30 * time.Second, Points: 30},
			{Step: 5 * time.Minute, Points: 24},
			{Step: 30 * time.Minute, Points: 24},
		},
		MinRise: 8,
	}
}

// Slow-scale thresholds. The floor must rise with few falls (connections
// that live for seconds or minutes move it a little either way); the
// leaking site must account for a good part of it, with fds opened in every
// quarter of the window and nearly as many in its later half as in its
// earlier one: one batch, or growth that stopped early in the window, leaves
// quarters empty, and a pool filling towards its size (growth decaying with
// a time constant up to about the window) opens fewer and fewer.
const (
	maxDropShare     = 0.5   // of the floor's rise, lost in falls between steps
	minSiteShare     = 0.5   // of the floor's rise, held by the site
	minQuarterShare  = 0.125 // of the site's fds, in each quarter of the window
	minLateHalf      = 0.4   // of the site's fds, in the later half of the window
	quartersInWindow = 4
)

// Steadiness thresholds. A leak adds fds on most steps, keeps adding them to
// the end of the window, and never gives back or takes a large share of its
// rise in one step. A burst is one big step, a trimmed pool gives back a big
// step, and a start-up ramp stops rising.
var steadiness = series.Steadiness{MinRisingShare: 0.6, MinRiseOfMean: 0.25, MaxStepShare: 0.5, MinLateShare: 0.25}

const topSitesShown = 3 // sites listed in the evidence

// Detector keeps a short history per process. It is safe for concurrent use.
type Detector struct {
	cfg   Config
	procs episode.Procs[procState]
}

type procState struct {
	series []sample      // samples within the last Window, oldest first
	trend  *series.Multi // the held count (heldFDs) at the slow scales
	since  time.Time     // first sample
	leak   episode.Episode
	shown  int // the verdict (index) the finding reports
}

type sample struct {
	t    time.Time
	open int
	old  map[int64]int // fds older than MinAge, by stack id (known stacks only)
}

// siteView is one known-stack site as of the latest sample.
type siteView struct {
	id     int64
	stack  []model.Frame
	old    int           // fds older than MinAge
	oldest time.Duration // age of its oldest live fd
	growth int           // rise of old over the window when spread over it, else 0; slow scales: fds opened in the window and still open
	spread bool          // slow scales: those fds were opened all through the window, not decaying
	late   bool          // slow scales: some of them in the last quarter
}

// New returns a detector with cfg, zero fields replaced by defaults.
func New(cfg Config) *Detector {
	def := DefaultConfig()
	if cfg.Window <= 0 {
		cfg.Window = def.Window
	}
	if cfg.MinAge <= 0 {
		cfg.MinAge = def.MinAge
	}
	if cfg.MinSlope <= 0 {
		cfg.MinSlope = def.MinSlope
	}
	if cfg.MinSiteFDs <= 0 {
		cfg.MinSiteFDs = def.MinSiteFDs
	}
	if cfg.ExhaustWithin <= 0 {
		cfg.ExhaustWithin = def.ExhaustWithin
	}
	if cfg.LimitRatio <= 0 {
		cfg.LimitRatio = def.LimitRatio
	}
	if cfg.Scales == nil {
		cfg.Scales = def.Scales
	}
	if cfg.MinRise <= 0 {
		cfg.MinRise = def.MinRise
	}
	return &Detector{cfg: cfg}
}

// Observe takes one sample of a process (p.FD filled; p.PID, p.Comm set) taken
// at now, and returns the findings about that process that are new or changed
// state, or still active (updated LastSeen and evidence). A finding that ends
// is returned once with Active=false and then no more.
func (d *Detector) Observe(now time.Time, p *model.Process) []model.Finding {
	return d.procs.With(p.PID, func() *procState {
		return &procState{trend: series.NewMulti(d.cfg.Scales...), since: now}
	}, func(st *procState) []model.Finding {
		sites, old := d.sites(now, p.FD.Sites)
		st.series = series.Push(st.series, sample{t: now, open: p.FD.Open, old: old}, now, d.cfg.Window,
			func(s sample) time.Time { return s.t })
		// Until MinAge has passed, fds open since the first sample are not
		// yet held however long they stay: the count would jump by all of
		// them then.
		if now.Sub(st.since) > d.cfg.MinAge {
			st.trend.Add(now, float64(heldFDs(p, old)))
		}

		vs := d.verdicts(now, p, st, sites)
		raised, held := episode.Choose(vs, func(v verdict) bool { return v.leak }, func(v verdict) bool { return v.held })
		v := episode.Verdict{Raise: raised >= 0, Hold: held >= 0}
		if held >= 0 {
			// The scale that holds is the one reported, and keeps the
			// finding open for its hold.
			st.shown, v.QuietFor = held, vs[held].hold
		}
		return st.leak.Observe(now, model.KindFDLeak, p.PID, episode.Rule{}, v,
			func(f model.Finding, active bool) model.Finding {
				return d.fill(f, now, p, vs[st.shown].assessment, active)
			})
	})
}

// verdict is what one time scale says about a process.
type verdict struct {
	assessment
	leak bool          // raise a finding
	held bool          // keep a raised one open
	hold time.Duration // how long a finding stays open once nothing holds
}

// verdicts judges the process on the short window, then on each slow scale.
func (d *Detector) verdicts(now time.Time, p *model.Process, st *procState, sites []siteView) []verdict {
	a := d.assess(p, st.series, sites)
	vs := make([]verdict, 0, 1+len(d.cfg.Scales))
	vs = append(vs, verdict{assessment: a, leak: a.leak(d.cfg), held: a.held(), hold: d.cfg.Window})
	for i, sc := range d.cfg.Scales {
		tr := st.trend.Trend(i)
		a := d.assessSlow(now, p, tr)
		top := siteView{}
		if len(a.sites) > 0 {
			top = a.sites[0]
		}
		vs = append(vs, verdict{
			assessment: a,
			leak: a.covered && tr.Rise() >= float64(d.cfg.MinRise) && tr.Drops <= maxDropShare*tr.Rise() &&
				top.spread && top.growth >= d.cfg.MinRise && float64(top.growth) >= minSiteShare*tr.Rise(),
			held: a.covered && tr.Slope > 0 && top.late,
			hold: sc.Window(),
		})
	}
	return vs
}

// assessSlow is what one slow scale's trend says, with the sites ranked by
// the fds they opened within the window and still hold.
func (d *Detector) assessSlow(now time.Time, p *model.Process, tr series.Trend) assessment {
	a := assessment{covered: tr.Covered(), span: tr.Span, slope: tr.Slope, scale: tr.Scale.Window()}
	if !a.covered {
		return a // judges nothing yet: spare the walk over every fd
	}
	// Held at least one step: an fd opened in the step being filled may
	// be a request's.
	from, to := now.Add(-tr.Scale.Window()), now.Add(-tr.Scale.Step)
	for _, s := range p.FD.Sites {
		if s.StackID < 0 {
			continue
		}
		v := siteView{id: s.StackID, stack: s.Stack}
		var quarters [quartersInWindow]int
		for _, at := range s.Opened {
			age := now.Sub(at)
			if age > d.cfg.MinAge {
				v.old++
			}
			v.oldest = max(v.oldest, age)
			if at.Before(from) || at.After(to) {
				continue
			}
			v.growth++
			quarters[min(quartersInWindow-1, int(quartersInWindow*at.Sub(from)/to.Sub(from)))]++
		}
		if v.growth == 0 {
			continue
		}
		v.spread = float64(quarters[2]+quarters[3]) >= minLateHalf*float64(v.growth)
		for _, n := range quarters {
			v.spread = v.spread && float64(n) >= minQuarterShare*float64(v.growth)
		}
		v.late = quarters[quartersInWindow-1] > 0
		a.sites = append(a.sites, v)
	}
	slices.SortFunc(a.sites, func(x, y siteView) int {
		return cmp.Or(cmp.Compare(y.growth, x.growth), cmp.Compare(y.old, x.old), cmp.Compare(x.id, y.id))
	})
	a.topGrew = len(a.sites) > 0
	a.attributed = slices.ContainsFunc(p.FD.Sites, func(s model.FDSite) bool { return s.StackID >= 0 && len(s.Opened) > 0 })
	a.nearLimit = p.FD.Limit > 0 && float64(p.FD.Open)/float64(p.FD.Limit) >= d.cfg.LimitRatio
	return a
}

// Forget drops all state of pid (process exited).
func (d *Detector) Forget(pid int) { d.procs.Forget(pid) }

// sites returns the known-stack sites holding fds older than MinAge and their
// old counts by stack id for the history.
func (d *Detector) sites(now time.Time, fdSites []model.FDSite) ([]siteView, map[int64]int) {
	byID := make(map[int64]*siteView)
	for _, s := range fdSites {
		if s.StackID < 0 {
			continue
		}
		v := byID[s.StackID]
		if v == nil {
			v = &siteView{id: s.StackID, stack: s.Stack}
			byID[s.StackID] = v
		}
		for _, at := range s.Opened {
			age := now.Sub(at)
			if age > d.cfg.MinAge {
				v.old++
			}
			v.oldest = max(v.oldest, age)
		}
	}
	views := make([]siteView, 0, len(byID))
	old := make(map[int64]int, len(byID))
	for id, v := range byID {
		if v.old > 0 {
			views = append(views, *v)
			old[id] = v.old
		}
	}
	return views, old
}

// heldFDs counts the fds of p held longer than MinAge, the slow scales'
// signal: fds of requests and other short work come and go by the hundred
// and would drown a slow leak in noise. fds of unknown site (mostly those
// open before attach) count as held.
func heldFDs(p *model.Process, old map[int64]int) int {
	n := p.FD.Open
	for _, s := range p.FD.Sites {
		if s.StackID >= 0 {
			n -= len(s.Opened)
		}
	}
	for _, o := range old {
		n += o
	}
	return n
}

// assessment is what the window says about one process.
type assessment struct {
	scale      time.Duration // the slow scale's window; 0 for the short Window
	covered    bool          // the series spans about a full Window
	span       time.Duration // time the series covers
	slope      float64       // least-squares growth of the open count, fds/s
	steady     bool          // the growth is spread over the window
	sites      []siteView    // known-stack sites with old fds, fastest growing first
	topGrew    bool          // sites[0]'s old count grew over the window
	nearLimit  bool          // open/limit at or above LimitRatio
	attributed bool          // some live fds have a known opening stack
}

func (d *Detector) assess(p *model.Process, smps []sample, sites []siteView) assessment {
	first, last := smps[0], smps[len(smps)-1]
	a := assessment{span: last.t.Sub(first.t), sites: sites}
	ts := make([]time.Time, len(smps))
	open := make([]int, len(smps))
	for i, smp := range smps {
		ts[i], open[i] = smp.t, smp.open
	}
	if len(smps) >= 2 {
		a.covered = series.Covered(a.span, d.cfg.Window, len(smps))
		a.slope = series.Slope(ts, open)
		a.steady = series.Steady(open, steadiness)
	}
	// Rank sites by how their old count grew, not by its size: a big pool that
	// warmed up long ago holds more old fds than a young leak. Growth in one
	// step is not counted, because that is a batch of fds opened together
	// (a pool warming up, a burst) crossing MinAge at once.
	vals := make([]int, len(smps))
	for i := range sites {
		for j, smp := range smps {
			vals[j] = smp.old[sites[i].id]
		}
		sites[i].growth = series.SpreadRise(vals, steadiness.MaxStepShare)
	}
	slices.SortFunc(sites, func(x, y siteView) int {
		return cmp.Or(cmp.Compare(y.growth, x.growth), cmp.Compare(y.old, x.old), cmp.Compare(x.id, y.id))
	})
	a.topGrew = len(sites) > 0 && sites[0].growth > 0
	a.attributed = slices.ContainsFunc(p.FD.Sites, func(s model.FDSite) bool { return s.StackID >= 0 && len(s.Opened) > 0 })
	a.nearLimit = p.FD.Limit > 0 && float64(p.FD.Open)/float64(p.FD.Limit) >= d.cfg.LimitRatio
	return a
}

// leak is the condition to raise a finding. Near the limit any steady growth
// will do, as long as fds pile up at some site or no stacks are known to
// tell; elsewhere the growth must be fast enough and pinned to one site.
// Steadiness alone does not rule out noise: a flat fd count with churn on top
// of it shows a few steady-looking windows an hour, and only a site's old
// count tells those from accumulation.
func (a assessment) leak(cfg Config) bool {
	if !a.covered || !a.steady || a.slope <= 0 {
		return false
	}
	if a.nearLimit {
		return a.topGrew || !a.attributed
	}
	return a.slope >= cfg.MinSlope && a.topGrew && a.sites[0].old >= cfg.MinSiteFDs
}

// held is the weaker condition that keeps a raised finding open, so that a
// leak that slows down or turns jumpy is not reported as ended and raised again.
func (a assessment) held() bool {
	return a.slope > 0 && (a.topGrew || a.nearLimit && a.steady && !a.attributed)
}

// fill returns f updated from the latest sample.
func (d *Detector) fill(f model.Finding, now time.Time, p *model.Process, a assessment, active bool) model.Finding {
	var tte *float64 // seconds until the limit is reached; nil when it is not approached
	tteSec := math.Inf(1)
	if p.FD.Limit > 0 && a.slope > 0 {
		tteSec = max(0, float64(p.FD.Limit)-float64(p.FD.Open)) / a.slope
		tte = new(series.Round(tteSec, 1))
	}

	top := make([]model.FDLeakSite, 0, topSitesShown)
	for _, s := range a.sites[:min(len(a.sites), topSitesShown)] {
		top = append(top, model.FDLeakSite{
			Stack:             slices.Clone(s.stack),
			UnclosedFDs:       s.old,
			UnclosedFDsGrowth: s.growth,
			OldestAgeSeconds:  series.Round(s.oldest.Seconds(), 1),
		})
	}

	f.Comm = p.Comm
	f.LastSeen = now
	f.Active = active
	f.Severity = model.SeverityWarning
	if a.nearLimit || tteSec < d.cfg.ExhaustWithin.Seconds() {
		f.Severity = model.SeverityCritical
	}
	f.Stack = nil
	if len(a.sites) > 0 {
		f.Stack = slices.Clone(a.sites[0].stack)
	}
	f.Summary = d.summary(p, a, active, tte != nil, tteSec)
	f.Evidence = model.FDLeakEvidence{
		OpenFDs:                 p.FD.Open,
		GrowthPerSecond:         series.Round(a.slope, 4),
		WindowSeconds:           series.Round(a.span.Seconds(), 1),
		TimeScaleSeconds:        d.scaleOf(a).Seconds(),
		Limit:                   p.FD.Limit,
		TimeToExhaustionSeconds: tte,
		TopSites:                top,
		OpenedByKind:            maps.Clone(p.FD.Opened),
		ClosedByKind:            maps.Clone(p.FD.Closed),
	}
	return f
}

func (d *Detector) summary(p *model.Process, a assessment, active, hasTTE bool, tteSec float64) string {
	var b strings.Builder
	head := "fd leak"
	if !active {
		head = "fd leak ended"
	}
	if a.scale == 0 {
		fmt.Fprintf(&b, "%s: %d open fds growing %.1f/s", head, p.FD.Open, a.slope)
	} else {
		fmt.Fprintf(&b, "%s: %d open fds growing %s over %s", head, p.FD.Open, roughRate(a.slope), scaleName(a.scale))
	}
	if len(a.sites) > 0 {
		top := a.sites[0]
		frame := fmt.Sprintf("stack #%d", top.id)
		if len(top.stack) > 0 {
			frame = stack.CallSite(top.stack)
		}
		if a.scale == 0 {
			fmt.Fprintf(&b, "; %d unclosed fds older than %s opened at %s", top.old, d.cfg.MinAge, frame)
		} else {
			fmt.Fprintf(&b, "; %d fds opened at %s in that time still open", top.growth, frame)
		}
	}
	if a.nearLimit || hasTTE {
		fmt.Fprintf(&b, "; limit %d", p.FD.Limit)
		if a.nearLimit {
			fmt.Fprintf(&b, " (%.0f%% used)", 100*float64(p.FD.Open)/float64(p.FD.Limit))
		}
		if hasTTE {
			fmt.Fprintf(&b, " reached in ~%s", series.RoughSeconds(tteSec))
		}
	}
	return b.String()
}

// scaleOf is the time scale a judged: its slow scale's window, else Window.
func (d *Detector) scaleOf(a assessment) time.Duration {
	if a.scale == 0 {
		return d.cfg.Window
	}
	return a.scale
}

// scaleName renders a scale's window in its largest whole unit: 100s, 15m, 2h.
func scaleName(w time.Duration) string {
	switch {
	case w%time.Hour == 0:
		return fmt.Sprintf("%dh", w/time.Hour)
	case w%time.Minute == 0:
		return fmt.Sprintf("%dm", w/time.Minute)
	default:
		return fmt.Sprintf("%.0fs", w.Seconds())
	}
}

// roughRate renders a growth in fds/s in the unit that reads best.
func roughRate(perSecond float64) string {
	switch {
	case perSecond >= 0.1:
		return fmt.Sprintf("%.1f/s", perSecond)
	case perSecond*60 >= 1:
		return fmt.Sprintf("%.1f/min", perSecond*60)
	default:
		return fmt.Sprintf("%.1f/h", perSecond*3600)
	}
}
