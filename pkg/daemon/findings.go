package daemon

import (
	"encoding/json"
	"io"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/changes"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/stack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// FindingsLog is a sink that writes one JSON line per finding state change
// (it became active, its severity changed, it ended), for log pipelines
// (Loki, Elasticsearch, ...). A summary whose figures move every interval
// is not a change.
type FindingsLog struct {
	enc     *json.Encoder
	changes *changes.Tracker
}

// findingLine is the JSON shape of one line.
type findingLine struct {
	Time      time.Time      `json:"time"`
	Event     changes.Event  `json:"event"` // "active", "updated" or "ended"
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
	return &FindingsLog{enc: json.NewEncoder(w), changes: changes.NewTracker()}
}

// Update writes the changes since the previous snapshot.
func (l *FindingsLog) Update(s *model.Snapshot) {
	for _, c := range l.changes.Next(s) {
		f := c.Finding
		line := findingLine{Time: s.Time, Event: c.Event, Kind: f.Kind, Severity: f.Severity, PID: f.PID, Comm: f.Comm,
			Summary: f.Summary, FirstSeen: f.FirstSeen, Stack: f.Stack, Evidence: f.Evidence}
		if p := c.Process; p != nil && p.Pod != (model.Pod{}) {
			pod := p.Pod
			line.Pod = &pod
		}
		if fr, ok := stack.CallFrame(f.Stack); ok {
			line.Site = stack.Function(fr)
		}
		_ = l.enc.Encode(line)
	}
}

// Close writes the final changes.
func (l *FindingsLog) Close(final *model.Snapshot) error {
	if final != nil {
		l.Update(final)
	}
	return nil
}
