// Package fdexhaust reports processes that have run out of file descriptors:
// an fd-creating call (open, socket, accept, pipe, dup, ...) failed with
// EMFILE (the process's soft RLIMIT_NOFILE is reached) or ENFILE (the
// system-wide file table is full), or the process holds so many fds that the
// next one will fail.
//
// Unlike a leak, this needs no trend: the process is already failing, so the
// finding is critical from the first poll that sees it. It names what the
// operator needs to act: the limit, how often calls fail, where the failing
// calls come from, and which call sites hold the fds.
package fdexhaust

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/episode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/series"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/stack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Config holds the detector's knobs. Zero fields take the DefaultConfig value.
type Config struct {
	// Margin: a process with at least Limit-Margin open fds is at its
	// limit even if no call has failed yet. A couple of fds of slack cover
	// the fds a call needs at once (pipe, socketpair) and the one or two
	// a runtime may hold back.
	Margin int
	// RateWindow is the span over which failures per second are measured.
	RateWindow time.Duration
	// Quiet ends a finding: no failure and below the limit for this long.
	Quiet time.Duration
}

// DefaultConfig returns the knobs used when none are given.
func DefaultConfig() Config {
	return Config{Margin: 2, RateWindow: 5 * time.Second, Quiet: 10 * time.Second}
}

const topSitesShown = 3

// Detector keeps a few seconds of failure counts per process. It is safe
// for concurrent use.
type Detector struct {
	cfg   Config
	procs episode.Procs[procState]
}

type procState struct {
	series    []sample // failure totals within RateWindow, oldest first
	exhausted episode.Episode
}

type sample struct {
	t      time.Time
	failed uint64 // EMFILE + ENFILE since attach
}

// New returns a detector with cfg, zero fields replaced by defaults.
func New(cfg Config) *Detector {
	def := DefaultConfig()
	if cfg.Margin <= 0 {
		cfg.Margin = def.Margin
	}
	if cfg.RateWindow <= 0 {
		cfg.RateWindow = def.RateWindow
	}
	if cfg.Quiet <= 0 {
		cfg.Quiet = def.Quiet
	}
	return &Detector{cfg: cfg}
}

// Observe takes one sample of a process (p.FD filled; p.Started is when
// watching began, from which the failures are counted) taken at now. It
// returns the process's finding while it is active and once more, with
// Active=false, when it ends.
func (d *Detector) Observe(now time.Time, p *model.Process) []model.Finding {
	return d.procs.With(p.PID, func() *procState {
		st := &procState{}
		// The counters start at zero when watching begins: that is the
		// first point of the rate.
		if !p.Started.IsZero() && p.Started.Before(now) {
			st.series = []sample{{t: p.Started}}
		}
		return st
	}, func(st *procState) []model.Finding {
		failed := p.FD.Failed["EMFILE"] + p.FD.Failed["ENFILE"]
		var prev uint64
		if n := len(st.series); n > 0 {
			prev = st.series[n-1].failed
		}
		st.series = series.Push(st.series, sample{t: now, failed: failed}, now, d.cfg.RateWindow,
			func(s sample) time.Time { return s.t })
		// Already failing: critical from the first poll that sees it, no
		// trend needed.
		exhausted := failed > prev || d.atLimit(p.FD.Open, p.FD.Limit)
		return st.exhausted.Observe(now, model.KindFDExhausted, p.PID, episode.Rule{QuietFor: d.cfg.Quiet},
			episode.Verdict{Raise: exhausted}, func(f model.Finding, active bool) model.Finding {
				return d.fill(f, now, p, st, active)
			})
	})
}

// Forget drops all state of pid (process exited).
func (d *Detector) Forget(pid int) { d.procs.Forget(pid) }

// atLimit reports whether open fds leave no room under limit (0: unknown).
func (d *Detector) atLimit(open int, limit uint64) bool {
	return limit > 0 && open >= int(limit)-d.cfg.Margin
}

// rate is failures per second over the samples kept.
func (st *procState) rate() float64 {
	first, last := st.series[0], st.series[len(st.series)-1]
	span := last.t.Sub(first.t).Seconds()
	if span <= 0 {
		return 0
	}
	return float64(last.failed-first.failed) / span
}

func (d *Detector) fill(f model.Finding, now time.Time, p *model.Process, st *procState, active bool) model.Finding {
	rate := st.rate()
	errno := "EMFILE"
	if p.FD.Failed["ENFILE"] > p.FD.Failed["EMFILE"] {
		errno = "ENFILE"
	}
	top := make([]model.FDHoldingSite, 0, topSitesShown)
	attributed := 0
	for _, s := range p.FD.Sites {
		attributed += len(s.Opened)
	}
	for _, s := range p.FD.Sites[:min(len(p.FD.Sites), topSitesShown)] {
		var oldest time.Duration
		for _, at := range s.Opened {
			oldest = max(oldest, now.Sub(at))
		}
		top = append(top, model.FDHoldingSite{Stack: slices.Clone(s.Stack), FDs: len(s.Opened), OldestAgeSeconds: series.Round(oldest.Seconds(), 1)})
	}
	var failing *model.FailingCall // nil until a call failed
	f.Stack = nil
	if lf := p.FD.LastFailure; lf != nil {
		f.Stack = slices.Clone(lf.Stack)
		failing = &model.FailingCall{
			Stack:      slices.Clone(lf.Stack),
			Kind:       lf.Kind,
			SecondsAgo: series.Round(max(0, now.Sub(lf.Time).Seconds()), 1),
		}
	} else if len(p.FD.Sites) > 0 {
		// No call failed since attach (the process was at its limit
		// before): the site holding the most fds is the lead.
		f.Stack = slices.Clone(p.FD.Sites[0].Stack)
	}
	f.Comm = p.Comm
	f.LastSeen = now
	f.Active = active
	f.Severity = model.SeverityCritical
	f.Summary = d.summary(p, active, errno, rate)
	f.Evidence = model.FDExhaustedEvidence{
		OpenFDs:           p.FD.Open,
		Limit:             p.FD.Limit,
		AtLimit:           d.atLimit(p.FD.Open, p.FD.Limit),
		AtLimitAtAttach:   d.atLimit(p.FD.OpenAtAttach, p.FD.Limit),
		FailuresTotal:     maps.Clone(p.FD.Failed),
		FailuresPerSecond: series.Round(rate, 2),
		Errno:             errno,
		FailingCall:       failing,
		TopSites:          top,
		UnattributedFDs:   max(0, p.FD.Open-attributed),
	}
	return f
}

func (d *Detector) summary(p *model.Process, active bool, errno string, rate float64) string {
	var b strings.Builder
	b.WriteString("fd exhausted")
	if !active {
		b.WriteString(" (over)")
	}
	b.WriteString(": ")
	failed := p.FD.Failed["EMFILE"] + p.FD.Failed["ENFILE"]
	switch {
	case failed == 0:
		b.WriteString("no fd-creating call failed yet")
	case errno == "ENFILE":
		fmt.Fprintf(&b, "fd creation fails with ENFILE (the system-wide file table, fs.file-max, is full) %.1f/s", rate)
	default:
		fmt.Fprintf(&b, "fd creation fails with EMFILE %.1f/s", rate)
	}
	if lf := p.FD.LastFailure; lf != nil && len(lf.Stack) > 0 {
		fmt.Fprintf(&b, " at %s (%s)", stack.CallSite(lf.Stack), lf.Kind)
	}
	fmt.Fprintf(&b, "; %d open fds, soft limit %d", p.FD.Open, p.FD.Limit)
	if d.atLimit(p.FD.OpenAtAttach, p.FD.Limit) {
		b.WriteString(", at the limit since before attach")
	}
	if len(p.FD.Sites) > 0 {
		s := p.FD.Sites[0]
		where := fmt.Sprintf("stack #%d", s.StackID)
		if len(s.Stack) > 0 {
			where = stack.CallSite(s.Stack)
		}
		fmt.Fprintf(&b, "; most held by %s (%d)", where, len(s.Opened))
	}
	return b.String()
}
