// Package syncstorm finds GPU sync storms: a process whose host thread
// synchronises with the GPU hundreds of times a second, each wait short,
// while the GPU is under-used. It is the .item() or .cpu() inside a
// training loop: each call drains the device's queue, so the GPU idles
// while the host catches up, and the fix is one line (keep the value on
// the device, read it once a step or once every N steps).
//
// It reads the host's waits on the GPU (model.CUDAWaits: calls, time
// waited and a histogram of each wait, in all and by call site) and NVML's
// SM utilization (model.CUDAStats.GPUUtil), and judges their deltas over a
// sliding window, so that one busy poll is not a storm. Where NVML is
// absent (no GPU driver on the node) the storm is judged from the waits
// alone and the finding says that utilization was not known. Long waits
// are not a storm: a host blocked on a busy GPU is GPU-bound
// (detect/inputbound's verdict), whatever the number of calls.
package syncstorm

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/episode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/series"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/stack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Config holds the thresholds. Zero fields take DefaultConfig's values.
type Config struct {
	Window time.Duration // judged over
	// Rate is the short synchronisations a second, over the window, from
	// which the process storms; a wait is short under ShortWait.
	Rate      float64
	ShortWait time.Duration
	// BusySM is the mean SM utilization from which the GPU is not
	// under-used: the synchronisations then cost little.
	BusySM float64
}

// DefaultConfig returns the thresholds used when none are given.
func DefaultConfig() Config {
	return Config{Window: 10 * time.Second, Rate: 200, ShortWait: time.Millisecond, BusySM: 0.5}
}

// topSites bounds the sites in the evidence.
const topSites = 3

// Detector keeps a window per process. It is safe for concurrent use.
type Detector struct {
	cfg   Config
	procs episode.Procs[procState]
}

type procState struct {
	samples []sample // oldest first, the first at or before the window's start
	// The stack of each site, once seen: the CUDA view symbolizes those
	// of the sites that waited most, so a site's may come and go.
	stacks map[siteID][]model.Frame
	storm  episode.Episode
}

// siteID is a call site of one API, as the kernel counts it.
type siteID struct {
	api   string
	stack int64
}

// sample is one poll of a process's waits.
type sample struct {
	t       time.Time
	calls   uint64
	seconds float64
	hist    model.Histogram
	share   float64 // CUDAWaits.Share: of the interval ending here
	sm      float64
	hasSM   bool
	sites   map[siteID]siteCount
}

type siteCount struct {
	calls   uint64
	seconds float64
}

// window is what the samples say, from the first to the last.
type window struct {
	span                   float64 // seconds
	calls, short           uint64
	seconds                float64
	hostShare              float64
	sm                     *float64 // nil: no NVML sample in the window
	sites                  []siteDelta
	rate, shortRate, share float64
}

type siteDelta struct {
	key     string
	api     string
	stack   []model.Frame
	most    uint64 // the calls of the stack kept
	calls   uint64
	seconds float64
}

// New returns a detector; zero fields of cfg take DefaultConfig's values.
func New(cfg Config) *Detector {
	def := DefaultConfig()
	cfg.Window = cmp.Or(cfg.Window, def.Window)
	cfg.Rate = cmp.Or(cfg.Rate, def.Rate)
	cfg.ShortWait = cmp.Or(cfg.ShortWait, def.ShortWait)
	cfg.BusySM = cmp.Or(cfg.BusySM, def.BusySM)
	return &Detector{cfg: cfg}
}

// Observe takes one poll of a process (p.CUDA filled, NVML's figures
// joined) and returns the gpu_sync_storm finding about it: new, updated,
// or just ended.
func (d *Detector) Observe(now time.Time, p *model.Process) []model.Finding {
	w := &p.CUDA.Waits
	create := func() *procState {
		if w.Calls == 0 {
			return nil // never synchronised: nothing to keep
		}
		return &procState{stacks: map[siteID][]model.Frame{}}
	}
	return d.procs.With(p.PID, create, func(st *procState) []model.Finding { return d.observe(now, p, st) })
}

// Forget drops what is kept of pid.
func (d *Detector) Forget(pid int) { d.procs.Forget(pid) }

func (d *Detector) observe(now time.Time, p *model.Process, st *procState) []model.Finding {
	w := &p.CUDA.Waits
	cur := sample{t: now, calls: w.Calls, seconds: w.Seconds, hist: w.Histogram, share: w.Share, sites: make(map[siteID]siteCount, len(w.Sites))}
	for _, u := range p.CUDA.GPUUtil {
		cur.sm += u.SM
	}
	if n := len(p.CUDA.GPUUtil); n > 0 {
		cur.sm, cur.hasSM = cur.sm/float64(n), true
	}
	for _, s := range w.Sites {
		id := siteID{s.API, s.StackID}
		cur.sites[id] = siteCount{s.Calls, s.Seconds}
		if len(s.Stack) > 0 {
			st.stacks[id] = s.Stack
		}
	}
	maps.DeleteFunc(st.stacks, func(id siteID, _ []model.Frame) bool { _, ok := cur.sites[id]; return !ok })
	if n := len(st.samples); n > 0 {
		last := st.samples[n-1]
		// A clock step or totals that went back (they are monotonic)
		// leave nothing to judge: start again from here.
		if !now.After(last.t) || cur.calls < last.calls {
			st.samples = st.samples[:0]
			st.storm.Interrupt()
		}
	}
	st.samples = append(st.samples, cur)
	for len(st.samples) > 2 && now.Sub(st.samples[1].t) >= d.cfg.Window {
		st.samples = st.samples[1:]
	}
	iv, ok := d.window(st.samples, st.stacks)
	storm := ok && iv.shortRate >= d.cfg.Rate && (iv.sm == nil || *iv.sm < d.cfg.BusySM)
	return st.storm.Observe(now, model.KindGPUSyncStorm, p.PID, episode.Rule{}, episode.Verdict{Raise: storm},
		func(f model.Finding, active bool) model.Finding { return d.fill(f, now, p, iv, active) })
}

// siteKey names a site as a reader would: its API and the line that
// called it.
func siteKey(id siteID, frames []model.Frame) string {
	site := stack.CallSite(frames)
	switch {
	case site != "":
	case id.stack < 0:
		site = "an unknown stack"
	default:
		site = "stack #" + strconv.FormatInt(id.stack, 10)
	}
	return id.api + " at " + site
}

// window sums the samples' deltas; false until they cover most of Window.
func (d *Detector) window(samples []sample, stacks map[siteID][]model.Frame) (window, bool) {
	first, last := samples[0], samples[len(samples)-1]
	var iv window
	iv.span = last.t.Sub(first.t).Seconds()
	if len(samples) < 2 || iv.span < d.cfg.Window.Seconds()*9/10 {
		return iv, false
	}
	iv.calls = last.calls - first.calls
	iv.seconds = max(last.seconds-first.seconds, 0)
	delta := last.hist.Sub(first.hist)
	for i, b := range delta.Bounds {
		if b <= d.cfg.ShortWait.Seconds() && i < len(delta.Counts) {
			iv.short += delta.Counts[i]
		}
	}
	var sm float64
	var smN int
	for i, s := range samples {
		if s.hasSM {
			sm += s.sm
			smN++
		}
		if i > 0 {
			iv.hostShare += s.share * s.t.Sub(samples[i-1].t).Seconds()
		}
	}
	iv.hostShare /= iv.span
	if smN > 0 {
		iv.sm = new(series.Round(sm/float64(smN), 3))
	}
	iv.rate = float64(iv.calls) / iv.span
	iv.shortRate = float64(iv.short) / iv.span
	if iv.calls > 0 {
		iv.share = float64(iv.short) / float64(iv.calls)
	}
	// One line may come under several stacks (callers further out): one
	// entry, with the stack of the one that called most.
	byKey := map[string]int{}
	for id, s := range last.sites {
		was := first.sites[id]
		if s.calls <= was.calls {
			continue
		}
		dc, ds := s.calls-was.calls, max(s.seconds-was.seconds, 0)
		key := siteKey(id, stacks[id])
		i, ok := byKey[key]
		if !ok {
			i = len(iv.sites)
			byKey[key] = i
			iv.sites = append(iv.sites, siteDelta{key: key, api: id.api})
		}
		sd := &iv.sites[i]
		if dc > sd.most {
			sd.stack, sd.most = stacks[id], dc
		}
		sd.calls += dc
		sd.seconds += ds
	}
	slices.SortFunc(iv.sites, func(a, b siteDelta) int { return cmp.Or(cmp.Compare(b.calls, a.calls), cmp.Compare(a.key, b.key)) })
	return iv, true
}

// fill returns f brought up to date from the latest window.
func (d *Detector) fill(f model.Finding, now time.Time, p *model.Process, iv window, active bool) model.Finding {
	f.Comm, f.LastSeen, f.Active = p.Comm, now, active
	f.Severity = model.SeverityWarning
	f.Stack = nil
	ev := model.GPUSyncStormEvidence{
		CallsPerSecond:    series.Round(iv.rate, 1),
		HostWaitShare:     series.Round(iv.hostShare, 3),
		ShortShare:        series.Round(iv.share, 3),
		ShortWaitSeconds:  d.cfg.ShortWait.Seconds(),
		SMUtilizationMean: iv.sm,
		TopSites:          []model.SyncSite{},
		WindowSeconds:     series.Round(iv.span, 1),
	}
	if iv.calls > 0 {
		ev.MeanWaitSeconds = iv.seconds / float64(iv.calls)
	}
	for _, s := range iv.sites[:min(len(iv.sites), topSites)] {
		site := model.SyncSite{API: s.api, CallsPerSecond: series.Round(float64(s.calls)/iv.span, 1),
			CallShare: series.Round(float64(s.calls)/float64(max(iv.calls, 1)), 3), Stack: slices.Clone(s.stack)}
		if iv.seconds > 0 {
			site.WaitShare = series.Round(s.seconds/iv.seconds, 3)
		}
		ev.TopSites = append(ev.TopSites, site)
	}
	f.Evidence = ev

	var b strings.Builder
	head := "GPU sync storm"
	if !active {
		head = "GPU sync storm ended"
	}
	fmt.Fprintf(&b, "%s: %.0f synchronisations/s over the last %s, %.0f %% shorter than %s (mean %s)",
		head, iv.rate, time.Duration(iv.span*float64(time.Second)).Round(time.Second), 100*iv.share, d.cfg.ShortWait,
		time.Duration(ev.MeanWaitSeconds*float64(time.Second)).Round(time.Microsecond))
	if len(iv.sites) > 0 {
		top := iv.sites[0]
		f.Stack = slices.Clone(top.stack)
		fmt.Fprintf(&b, "; %.0f %% of them %s", 100*ev.TopSites[0].CallShare, top.key)
	}
	fmt.Fprintf(&b, "; the host waited on the GPU %.0f %% of the time", 100*iv.hostShare)
	if iv.sm != nil {
		fmt.Fprintf(&b, " while the GPU was busy %.0f %% of it", 100**iv.sm)
	} else {
		b.WriteString("; GPU utilization not known (no NVML): judged from the waits alone")
	}
	b.WriteString(". Each call drains the GPU's queue: read device values once a step, not once a batch element (.item(), .cpu(), printing a tensor)")
	f.Summary = b.String()
	return f
}
