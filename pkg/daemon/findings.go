package daemon

import (
	"encoding/json"
	"io"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/stack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// FindingsLog is a sink that writes one JSON line per finding state change
// (it became active, its severity changed, it ended), for log pipelines
// (Loki, Elasticsearch, ...). A summary whose figures move every interval
// is not a change.
type FindingsLog struct {
	enc  *json.Encoder
	last map[findingKey]findingState
}

type findingKey struct {
	kind      string
	pid       int
	firstSeen int64
}

type findingState struct {
	active   bool
	severity string
}

// findingLine is the JSON shape of one line.
type findingLine struct {
	Time      time.Time      `json:"time"`
	Event     string         `json:"event"` // "active", "updated" or "ended"
	Kind      string         `json:"kind"`
	Severity  string         `json:"severity"`
	PID       int            `json:"pid"`
	Comm      string         `json:"comm"`
	Pod       *model.Pod     `json:"pod,omitempty"`
	Site      string         `json:"site,omitempty"`
	Summary   string         `json:"summary"`
	FirstSeen time.Time      `json:"first_seen"`
	Stack     []model.Frame  `json:"stack,omitempty"`
	Evidence  model.Evidence `json:"evidence,omitempty"`
}

// NewFindingsLog writes to w.
func NewFindingsLog(w io.Writer) *FindingsLog {
	return &FindingsLog{enc: json.NewEncoder(w), last: map[findingKey]findingState{}}
}

// Update writes the changes since the previous snapshot.
func (l *FindingsLog) Update(s *model.Snapshot) {
	procs := make(map[int]*model.Process, len(s.Processes))
	for _, p := range s.Processes {
		procs[p.PID] = p
	}
	seen := make(map[findingKey]bool, len(s.Findings))
	for _, f := range s.Findings {
		if f.CausedBy != nil {
			continue // part of the finding that explains it
		}
		k := findingKey{f.Kind, f.PID, f.FirstSeen.UnixNano()}
		seen[k] = true
		cur := findingState{f.Active, f.Severity}
		prev, known := l.last[k]
		if known && prev == cur {
			continue
		}
		l.last[k] = cur
		event := "updated"
		switch {
		case !known && !f.Active:
			continue // began and ended between two snapshots we never saw: none here
		case !known:
			event = "active"
		case !f.Active:
			event = "ended"
		}
		line := findingLine{Time: s.Time, Event: event, Kind: f.Kind, Severity: f.Severity, PID: f.PID, Comm: f.Comm,
			Summary: f.Summary, FirstSeen: f.FirstSeen, Stack: f.Stack, Evidence: f.Evidence}
		if p := procs[f.PID]; p != nil && p.Pod != (model.Pod{}) {
			pod := p.Pod
			line.Pod = &pod
		}
		if fr, ok := stack.CallFrame(f.Stack); ok {
			line.Site = stack.Function(fr)
		}
		_ = l.enc.Encode(line)
	}
	// Findings the pipeline forgot (their process exited) are done.
	for k := range l.last {
		if !seen[k] {
			delete(l.last, k)
		}
	}
}

// Close writes the final changes.
func (l *FindingsLog) Close(final *model.Snapshot) error {
	if final != nil {
		l.Update(final)
	}
	return nil
}
