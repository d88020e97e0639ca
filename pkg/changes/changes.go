// Package changes tells, snapshot after snapshot, which findings changed
// state: became active, changed severity, ended. A summary whose figures
// move every interval is not a change. The daemon's sinks that report
// changes (the findings log, Kubernetes events) share it, so that they
// agree on what a change is.
package changes

import "github.com/open-autoglm/autoglm-ebpf/pkg/model"

// Event is what happened to a finding.
type Event string

const (
	Active  Event = "active"  // it is new and active
	Updated Event = "updated" // its severity changed
	Ended   Event = "ended"   // it is no longer active
)

// Change is one finding's change since the previous snapshot.
type Change struct {
	Event   Event
	Finding *model.Finding
	// Process is the finding's process in the snapshot; nil where the
	// snapshot does not list it.
	Process *model.Process
	// Was is the severity before an update.
	Was string
}

// Tracker remembers the state of each finding it saw. Not safe for
// concurrent use: a sink calls it from the pipeline's goroutine.
type Tracker struct {
	last map[key]state
}

type key struct {
	kind      string
	pid       int
	firstSeen int64
}

type state struct {
	active   bool
	severity string
}

// NewTracker returns a Tracker that has seen nothing.
func NewTracker() *Tracker {
	return &Tracker{last: map[key]state{}}
}

// Next returns the changes of s since the snapshot before, in the order
// of s's findings. The changes point into s.
func (t *Tracker) Next(s *model.Snapshot) []Change {
	procs := make(map[int]*model.Process, len(s.Processes))
	for _, p := range s.Processes {
		procs[p.PID] = p
	}
	var out []Change
	seen := make(map[key]bool, len(s.Findings))
	for i := range s.Findings {
		f := &s.Findings[i]
		if f.CausedBy != nil {
			continue // part of the finding that explains it
		}
		k := key{f.Kind, f.PID, f.FirstSeen.UnixNano()}
		seen[k] = true
		cur := state{f.Active, f.Severity}
		prev, known := t.last[k]
		if known && prev == cur {
			continue
		}
		t.last[k] = cur
		c := Change{Event: Updated, Finding: f, Process: procs[f.PID], Was: prev.severity}
		switch {
		case !known && !f.Active:
			continue // began and ended between two snapshots we never saw: none here
		case !known:
			c.Event, c.Was = Active, ""
		case !f.Active:
			c.Event = Ended
		}
		out = append(out, c)
	}
	// Findings the pipeline forgot (their process exited) are done.
	for k := range t.last {
		if !seen[k] {
			delete(t.last, k)
		}
	}
	return out
}
