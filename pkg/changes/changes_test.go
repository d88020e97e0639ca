package changes

import (
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// A finding's life as the pipeline reports it: the changes are its start,
// each severity change and its end; a summary's figures are not changes,
// nor a finding that is part of another, nor one first seen ended.
func TestTracker(t *testing.T) {
	tr := NewTracker()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	proc := &model.Process{PID: 42, Comm: "serve"}
	f := model.Finding{Kind: model.KindFDLeak, PID: 42, Severity: model.SeverityWarning, FirstSeen: t0, Active: true, Summary: "grew by 10"}
	part := model.Finding{Kind: model.KindFDLeak, PID: 42, Severity: model.SeverityWarning, FirstSeen: t0.Add(time.Second), Active: true,
		CausedBy: &model.FindingRef{Kind: model.KindSocketLeak, PID: 42, FirstSeen: t0}}
	short := model.Finding{Kind: model.KindGPUAllocBurst, PID: 42, Severity: model.SeverityInfo, FirstSeen: t0, Active: false}
	next := func(procs []*model.Process, fs ...model.Finding) string {
		var out string
		for _, c := range tr.Next(&model.Snapshot{Processes: procs, Findings: fs}) {
			if c.Process != proc {
				t.Errorf("%s %s: process %v, want the snapshot's", c.Event, c.Finding.Kind, c.Process)
			}
			out += string(c.Event) + "/" + c.Finding.Severity + "/" + c.Was + " "
		}
		return out
	}
	procs := []*model.Process{proc}
	steps := []struct {
		f    func() []model.Finding
		want string
	}{
		{func() []model.Finding { return nil }, ""},
		{func() []model.Finding { return []model.Finding{f, part, short} }, "active/warning/ "},
		{func() []model.Finding { f.Summary = "grew by 20"; return []model.Finding{f, part, short} }, ""},
		{func() []model.Finding { f.Severity = model.SeverityCritical; return []model.Finding{f} }, "updated/critical/warning "},
		{func() []model.Finding { f.Severity = model.SeverityWarning; return []model.Finding{f} }, "updated/warning/critical "},
		{func() []model.Finding { f.Active = false; return []model.Finding{f} }, "ended/warning/warning "},
		{func() []model.Finding { return []model.Finding{f} }, ""},
	}
	for i, s := range steps {
		if got := next(procs, s.f()...); got != s.want {
			t.Errorf("snapshot %d: changes %q, want %q", i, got, s.want)
		}
	}
	// Forgotten with its process: nothing kept, nothing reported.
	if got := next(nil); got != "" || len(tr.last) != 0 {
		t.Errorf("after the process was forgotten: changes %q, %d findings remembered", got, len(tr.last))
	}
}
