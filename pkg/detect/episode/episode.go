// Package episode is the life of a finding, shared by the detectors: a
// condition raises it (at once, or once it has held for some polls or some
// time), another keeps it open, and it ends after a quiet spell without
// that, reported once more as ended. Procs keeps each process's state of a
// detector behind one lock, with one Forget.
//
// A detector judges; an Episode decides what that means for the finding.
// The judging (windows, baselines, scales) stays in each detector.
package episode

import (
	"sync"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Rule says when a finding opens and when it ends.
type Rule struct {
	// The raise condition must hold at ConfirmPolls observations in a row,
	// or for ConfirmFor since the first of them, before the finding
	// opens. Zero: at the first.
	ConfirmPolls int
	ConfirmFor   time.Duration
	// An open finding ends after QuietPolls observations in a row without
	// its hold condition, or QuietFor since it last held (Verdict.QuietFor
	// may set that per hold). Both zero: at the first observation without.
	QuietPolls int
	QuietFor   time.Duration
}

// Verdict is what one observation says of the condition.
type Verdict struct {
	Raise bool // open a finding (once confirmed); implies Hold
	Hold  bool // keep an open finding open
	// QuietFor, when set, replaces the rule's QuietFor from this hold on:
	// a multi-scale detector keeps a finding open as long as the scale
	// that held it.
	QuietFor time.Duration
}

// Episode is one finding of one process through its life. The zero value
// is closed.
type Episode struct {
	f        *model.Finding // the open finding; nil when closed
	run      int            // raises in a row, while closed
	runFrom  time.Time      // the first of them
	heldAt   time.Time      // last hold, while open
	quietFor time.Duration  // what that hold set
	quiet    int            // observations without a hold since
}

// Open reports whether a finding is open.
func (e *Episode) Open() bool { return e.f != nil }

// Interrupt forgets the raises in a row before the finding opens: the
// detector's samples broke (a clock step, a counter that went back).
func (e *Episode) Interrupt() { e.run, e.runFrom = 0, time.Time{} }

// Fill returns f brought up to date from the detector's latest
// observation; active is false for the last report of an ended finding.
// f carries what the previous fill gave it.
type Fill func(f model.Finding, active bool) model.Finding

// Observe advances e by one observation at now and returns what to
// report: nothing while closed, the open finding (Active, filled by fill)
// while open, and once more when it ends, inactive. A finding opens as
// {Kind: kind, PID: pid, FirstSeen: now}; fill sets the rest, LastSeen
// and Active included.
func (e *Episode) Observe(now time.Time, kind string, pid int, r Rule, v Verdict, fill Fill) []model.Finding {
	hold := v.Hold || v.Raise
	if e.f == nil {
		if !v.Raise {
			e.Interrupt()
			return nil
		}
		if e.run == 0 {
			e.runFrom = now
		}
		e.run++
		if e.run < r.ConfirmPolls || now.Sub(e.runFrom) < r.ConfirmFor {
			return nil
		}
		e.Interrupt()
		e.f = &model.Finding{Kind: kind, PID: pid, FirstSeen: now}
	}
	switch {
	case hold:
		e.heldAt, e.quiet = now, 0
		e.quietFor = r.QuietFor
		if v.QuietFor > 0 {
			e.quietFor = v.QuietFor
		}
	default:
		e.quiet++
		if e.quiet >= r.QuietPolls && now.Sub(e.heldAt) >= e.quietFor {
			f := fill(*e.f, false)
			e.f = nil
			return []model.Finding{f}
		}
	}
	*e.f = fill(*e.f, true)
	return []model.Finding{*e.f}
}

// Choose is the multi-scale detectors' choice among their scales'
// verdicts, fastest first: the first scale that raises, else the first
// that holds (-1: none). A leak outranks what merely holds: the scale
// that raised is the one that holds and is reported.
func Choose[V any](vs []V, raises, holds func(V) bool) (raised, held int) {
	raised, held = -1, -1
	for i, v := range vs {
		if raises(v) && raised < 0 {
			raised = i
		}
		if (raises(v) || holds(v)) && held < 0 {
			held = i
		}
	}
	if raised >= 0 {
		held = raised
	}
	return raised, held
}

// Procs is a detector's state of each process, by pid. It is safe for
// concurrent use: Observe and Forget may come from different goroutines,
// and the calls for all processes are serialized. The zero value is
// empty and ready.
type Procs[S any] struct {
	mu sync.Mutex
	m  map[int]*S
}

// With runs fn on pid's state under the lock; a process without state
// gets what create returns, and fn is not called when that is nil (a
// process the detector has nothing to keep of yet).
func (ps *Procs[S]) With(pid int, create func() *S, fn func(st *S) []model.Finding) []model.Finding {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	st := ps.m[pid]
	if st == nil {
		if st = create(); st == nil {
			return nil
		}
		if ps.m == nil {
			ps.m = map[int]*S{}
		}
		ps.m[pid] = st
	}
	return fn(st)
}

// Forget drops pid's state (the process exited, or the detector has
// nothing more to keep of it).
func (ps *Procs[S]) Forget(pid int) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	delete(ps.m, pid)
}

// Len is how many processes have state.
func (ps *Procs[S]) Len() int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return len(ps.m)
}
