// Package sockleak finds processes that leak TCP sockets: the peer hangs up,
// the socket moves to CLOSE_WAIT, and the process never closes it, so it
// keeps the fd and the kernel keeps the connection until the process exits.
//
// It reads only the socket view of a process (p.Sock: TCP sockets by state and
// the CLOSE_WAIT sockets with the time each entered that state) and judges it
// on a short window of samples. CLOSE_WAIT itself is normal: a healthy server
// sees the peer's FIN and closes within milliseconds. A leak shows as
// CLOSE_WAIT sockets that are old (held past MinAge), that stay, and whose
// number keeps growing across the window in many steps. A fixed set of old
// CLOSE_WAIT sockets, or one batch of them, is not reported: it does not
// grow. Nor is a server that closes them after some seconds, once it has been
// seen closing: until then (sockets held longer than Window, from its start)
// it looks like a leak, and the finding ends when the count falls.
package sockleak

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
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// Config holds the detector thresholds. Zero fields take the DefaultConfig value.
type Config struct {
	Window        time.Duration // growth window
	MinAge        time.Duration // a CLOSE_WAIT socket counts as leaked once it is older than this
	MinCloseWait  int           // leaked CLOSE_WAIT sockets needed to report
	ExhaustWithin time.Duration // time to reach the fd limit below which severity is critical
}

// DefaultConfig returns the thresholds used when none are given.
func DefaultConfig() Config {
	return Config{Window: 10 * time.Second, MinAge: 5 * time.Second, MinCloseWait: 5, ExhaustWithin: 10 * time.Minute}
}

// Shape of growth. A leak adds old CLOSE_WAIT sockets in many steps, still
// adds them late in the window, and hardly ever gives one back: a leaked
// socket, once old, stays. A batch of sockets that crosses MinAge together is
// one step carrying most of the rise; a server that holds CLOSE_WAIT sockets a
// few seconds before closing them has as many drops as rises.
const (
	maxStepShare  = 0.5  // largest allowed rising step as a share of the rise
	maxDropShare  = 0.1  // largest allowed sum of falling steps as a share of the rise
	minLateShare  = 0.25 // share of the rise the later half of the window must carry
	minRetained   = 0.9  // share of the window's first old sockets still in CLOSE_WAIT at its end
	topPairsShown = 5
)

// Detector keeps a short history per process. It is safe for concurrent use.
type Detector struct {
	cfg   Config
	procs episode.Procs[procState]
}

type procState struct {
	series []sample // samples within the last Window, oldest first
	leak   episode.Episode
	peak   int // most CLOSE_WAIT sockets seen while open
}

type sample struct {
	t      time.Time
	total  int           // sockets in CLOSE_WAIT
	old    int           // of which older than MinAge
	oldest time.Duration // age of the oldest
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
	if cfg.MinCloseWait <= 0 {
		cfg.MinCloseWait = def.MinCloseWait
	}
	if cfg.ExhaustWithin <= 0 {
		cfg.ExhaustWithin = def.ExhaustWithin
	}
	return &Detector{cfg: cfg}
}

// Observe takes one sample of a process (p.Sock filled; p.PID, p.Comm set,
// p.FD used for severity when the fd concern filled it) taken at now. It
// returns the process's finding while it is active, and once more with
// Active=false when it ends.
func (d *Detector) Observe(now time.Time, p *model.Process) []model.Finding {
	return d.procs.With(p.PID, func() *procState { return &procState{} }, func(st *procState) []model.Finding {
		smp := sample{t: now, total: len(p.Sock.CloseWait)}
		for _, c := range p.Sock.CloseWait {
			age := now.Sub(c.Since)
			if age > d.cfg.MinAge {
				smp.old++
			}
			smp.oldest = max(smp.oldest, age)
		}
		st.series = series.Push(st.series, smp, now, d.cfg.Window, func(s sample) time.Time { return s.t })

		a := d.assess(st.series, p.Sock.CloseWait)
		open := st.leak.Open()
		if !open {
			st.peak = 0
		}
		// Ended as soon as the count falls from its peak (Rule{}: no
		// quiet spell): sockets kept but no longer added keep it open.
		v := episode.Verdict{Raise: !open && a.leak(d.cfg), Hold: open && !a.ended(st.peak)}
		st.peak = max(st.peak, smp.total)
		return st.leak.Observe(now, model.KindSocketLeak, p.PID, episode.Rule{}, v, func(f model.Finding, active bool) model.Finding {
			return d.fill(f, now, p, a, active)
		})
	})
}

// Forget drops all state of pid (process exited).
func (d *Detector) Forget(pid int) { d.procs.Forget(pid) }

// assessment is what the window says about one process.
type assessment struct {
	covered  bool          // the series spans about a full Window
	span     time.Duration // time the series covers
	first    sample
	last     sample
	slope    float64 // least-squares growth of the CLOSE_WAIT count, sockets/s
	grows    bool    // old CLOSE_WAIT sockets rose in many steps, late ones included
	retained int     // sockets old at the window's start still in CLOSE_WAIT
}

func (d *Detector) assess(smps []sample, closeWait []model.SockConn) assessment {
	first, last := smps[0], smps[len(smps)-1]
	a := assessment{span: last.t.Sub(first.t), first: first, last: last}
	// Sockets old at the window's start are those that entered CLOSE_WAIT
	// MinAge before it; those still listed now were never closed.
	cutoff := first.t.Add(-d.cfg.MinAge)
	for _, c := range closeWait {
		if c.Since.Before(cutoff) {
			a.retained++
		}
	}
	if n := len(smps); n >= 2 {
		a.covered = series.Covered(a.span, d.cfg.Window, n)
		ts := make([]time.Time, n)
		total, old := make([]int, n), make([]int, n)
		for i, s := range smps {
			ts[i], total[i], old[i] = s.t, s.total, s.old
		}
		a.slope = series.Slope(ts, total)
		a.grows = grows(old)
	}
	return a
}

// leak is the condition to raise a finding: old CLOSE_WAIT sockets enough
// and growing, the count up over the window, some socket held across the
// whole window, and the old ones kept. The last two rule out servers that
// close CLOSE_WAIT sockets after a while, whose counts drift up and down:
// arrivals can hide closings in the count, not in the sockets kept.
func (a assessment) leak(cfg Config) bool {
	return a.covered && a.grows && a.last.old >= cfg.MinCloseWait && a.last.total > a.first.total &&
		a.last.oldest >= cfg.Window && float64(a.retained) >= minRetained*float64(a.first.old)
}

// ended: the count stopped growing over a full window and fell below its peak,
// so the process is closing them. Sockets kept but no longer added keep the
// finding open: they are still leaked.
func (a assessment) ended(peak int) bool {
	return a.covered && a.last.total <= a.first.total && a.last.total < peak
}

// fill returns f updated from the latest sample.
func (d *Detector) fill(f model.Finding, now time.Time, p *model.Process, a assessment, active bool) model.Finding {
	oldest := a.last.oldest
	var tte *float64 // seconds until the fd limit at this rate; nil when not approached
	tteSec := math.Inf(1)
	if p.FD.Limit > 0 && a.slope > 0 {
		tteSec = max(0, float64(p.FD.Limit)-float64(max(p.FD.Open, a.last.total))) / a.slope
		tte = new(series.Round(tteSec, 1))
	}
	pairs := topPairs(p.Sock.CloseWait)
	top := make([]model.SocketPair, 0, len(pairs))
	for _, pr := range pairs {
		top = append(top, model.SocketPair{Local: pr.local, Remote: pr.remote, Count: pr.count})
	}

	frames, opened := openingStack(p.Sock.CloseWait)
	f.Stack = frames
	f.Comm = p.Comm
	f.LastSeen = now
	f.Active = active
	f.Severity = model.SeverityWarning
	if tteSec < d.cfg.ExhaustWithin.Seconds() {
		f.Severity = model.SeverityCritical
	}
	head := "socket leak"
	if !active {
		head = "socket leak ended"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d TCP sockets in CLOSE_WAIT (peer closed, never closed here), growing %.1f/s, oldest %.0fs",
		head, a.last.total, a.slope, oldest.Seconds())
	if len(pairs) > 0 {
		fmt.Fprintf(&b, "; most %s <- %s (%d)", pairs[0].local, pairs[0].remote, pairs[0].count)
	}
	if len(frames) > 0 {
		fmt.Fprintf(&b, "; %d opened at %s", opened, stack.CallSite(frames))
	}
	if tte != nil {
		fmt.Fprintf(&b, "; fd limit %d reached in ~%.0fs", p.FD.Limit, tteSec)
	}
	f.Summary = b.String()
	f.Evidence = model.SocketLeakEvidence{
		TCPByState:             maps.Clone(p.Sock.TCPByState),
		CloseWait:              a.last.total,
		CloseWaitOlderThanMin:  a.last.old,
		MinAgeSeconds:          d.cfg.MinAge.Seconds(),
		GrowthPerSecond:        series.Round(a.slope, 2),
		OldestCloseWaitSeconds: series.Round(oldest.Seconds(), 1),
		WindowSeconds:          series.Round(a.span.Seconds(), 1),
		FDLimit:                p.FD.Limit,
		TimeToFDLimitSeconds:   tte,
		TopPairs:               top,
		OpeningStackSockets:    opened,
	}
	return f
}

// openingStack returns the stack that opened the most CLOSE_WAIT sockets
// (as the fd table knows it) and how many it opened; nil when none is known.
func openingStack(conns []model.SockConn) ([]model.Frame, int) {
	counts := map[string]int{}
	stacks := map[string][]model.Frame{}
	best := ""
	for _, c := range conns {
		if len(c.Stack) == 0 {
			continue
		}
		k := stack.Key(c.Stack)
		counts[k]++
		stacks[k] = c.Stack
		if counts[k] > counts[best] || (counts[k] == counts[best] && k < best) {
			best = k
		}
	}
	return stacks[best], counts[best]
}

// pair is a local/remote address pair with its ephemeral port masked.
type pair struct {
	local, remote string
	count         int
}

// topPairs groups CLOSE_WAIT sockets by address pair (PortMask), most first.
func topPairs(conns []model.SockConn) []pair {
	addrs := make([]string, 0, 2*len(conns))
	for _, c := range conns {
		addrs = append(addrs, c.Local, c.Remote)
	}
	mask := procinfo.PortMask(addrs)
	byPair := map[[2]string]int{}
	for _, c := range conns {
		byPair[[2]string{mask(c.Local), mask(c.Remote)}]++
	}
	out := make([]pair, 0, len(byPair))
	for k, n := range byPair {
		out = append(out, pair{k[0], k[1], n})
	}
	slices.SortFunc(out, func(x, y pair) int {
		return cmp.Or(cmp.Compare(y.count, x.count), cmp.Compare(x.local, y.local), cmp.Compare(x.remote, y.remote))
	})
	return out[:min(len(out), topPairsShown)]
}

// grows reports whether vals rose from first to last in steps none of which
// carries more than maxStepShare of the rise, fell by no more than
// maxDropShare of it in all, and rose in the later half too.
func grows(vals []int) bool {
	rise := vals[len(vals)-1] - vals[0]
	if rise <= 0 {
		return false
	}
	drops := 0
	for i := 1; i < len(vals); i++ {
		step := vals[i] - vals[i-1]
		if float64(step) > maxStepShare*float64(rise) {
			return false
		}
		drops += max(0, -step)
	}
	if float64(drops) > maxDropShare*float64(rise) {
		return false
	}
	return float64(series.LateRise(vals)) >= minLateShare*float64(rise)
}
