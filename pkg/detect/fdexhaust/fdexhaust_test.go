package fdexhaust

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

var (
	holdStack = testutil.Frames("hold_open+0x12 (fdwork)", "main+0x40 (fdwork)")
	tryStack  = testutil.Frames("try_open+0x12 (fdwork)", "main+0x58 (fdwork)")
)

// proc is a process watched since t0 with open fds of limit, 1000 of them
// held at hold_open, and failed failures so far, the last from try_open.
func proc(open int, limit uint64, emfile, enfile uint64, lastFail time.Time) *model.Process {
	opened := make([]time.Time, min(open, 1000))
	for i := range opened {
		opened[i] = t0.Add(-time.Hour)
	}
	p := &model.Process{PID: 42, Comm: "fdwork", Started: t0, FD: model.FDStats{
		Open: open, Limit: limit,
		Sites:  []model.FDSite{{StackID: 1, Stack: holdStack, Opened: opened}},
		Failed: map[string]uint64{"EMFILE": emfile, "ENFILE": enfile},
	}}
	if emfile+enfile > 0 {
		p.FD.LastFailure = &model.FDFailure{Time: lastFail, Kind: "file", StackID: 2, Stack: tryStack}
	}
	return p
}

// A process that starts failing is reported at the first poll that sees a
// failure, critical, with the limit, the failure rate, the failing call
// site and the site holding the fds.
func TestFailuresFlaggedAtOnce(t *testing.T) {
	d := New(Config{})
	var fails uint64
	for sec := 1; sec <= 8; sec++ {
		now := t0.Add(time.Duration(sec) * time.Second)
		open := min(1024, 1000+sec*10)
		if sec >= 4 {
			fails += 20 // at the limit since 3 s: 20 failed opens a second
		}
		fs := d.Observe(now, proc(open, 1024, fails, 0, now.Add(-10*time.Millisecond)))
		if sec < 3 {
			if len(fs) != 0 {
				t.Fatalf("at %ds, %d fds of 1024: %v", sec, open, fs)
			}
			continue
		}
		if len(fs) != 1 {
			t.Fatalf("at %ds: %d findings", sec, len(fs))
		}
		f := fs[0]
		// At 3 s the process is within Margin of its limit: that alone
		// is exhaustion, before any call failed.
		if f.Kind != model.KindFDExhausted || f.Severity != model.SeverityCritical || !f.Active || !f.FirstSeen.Equal(t0.Add(3*time.Second)) {
			t.Fatalf("at %ds: %+v", sec, f)
		}
		if sec < 8 {
			continue
		}
		ev := f.Evidence.(model.FDExhaustedEvidence)
		if got := ev.FailuresPerSecond; math.Abs(got-20) > 1 {
			t.Errorf("failures/s %v, want 20", got)
		}
		if ev.Errno != "EMFILE" || ev.Limit != 1024 || ev.OpenFDs != 1024 || !ev.AtLimit || ev.AtLimitAtAttach {
			t.Errorf("evidence %+v", ev)
		}
		if call := ev.FailingCall; call == nil || call.Kind != "file" || call.Stack[0] != tryStack[0] {
			t.Errorf("failing call %+v", call)
		}
		if top := ev.TopSites; len(top) != 1 || top[0].FDs != 1000 || ev.UnattributedFDs != 24 {
			t.Errorf("top sites %+v, unattributed %v", top, ev.UnattributedFDs)
		}
		if f.Stack[0] != tryStack[0] {
			t.Errorf("stack %q, want the failing call's", f.Stack)
		}
		want := "fd exhausted: fd creation fails with EMFILE 20.0/s at try_open+0x12 (fdwork) (file); 1024 open fds, soft limit 1024; most held by hold_open+0x12 (fdwork) (1000)"
		if f.Summary != want {
			t.Errorf("summary\n %q\nwant\n %q", f.Summary, want)
		}
	}
}

// Failures are counted from attach: those in the first poll are a finding
// at that poll, with a rate over the time since attach.
func TestFailingBeforeAttach(t *testing.T) {
	d := New(Config{})
	now := t0.Add(time.Second)
	p := proc(1024, 1024, 20, 0, now)
	p.FD.OpenAtAttach = 1024
	fs := d.Observe(now, p)
	if len(fs) != 1 || fs[0].Kind != model.KindFDExhausted || !fs[0].Evidence.(model.FDExhaustedEvidence).AtLimitAtAttach {
		t.Fatalf("first poll: %v", fs)
	}
	if got := fs[0].Evidence.(model.FDExhaustedEvidence).FailuresPerSecond; got != 20.0 {
		t.Errorf("failures/s %v, want 20", got)
	}
	if !strings.Contains(fs[0].Summary, "at the limit since before attach") {
		t.Errorf("summary %q", fs[0].Summary)
	}
}

// At its limit when first seen, with no call failing since (it is not
// trying): still exhausted, led by the site holding the fds.
func TestAtLimitWithoutFailures(t *testing.T) {
	d := New(Config{})
	p := proc(1023, 1024, 0, 0, time.Time{})
	p.FD.OpenAtAttach = 1023
	fs := d.Observe(t0.Add(time.Second), p)
	if len(fs) != 1 || fs[0].Severity != model.SeverityCritical || fs[0].Evidence.(model.FDExhaustedEvidence).FailingCall != nil {
		t.Fatalf("%v", fs)
	}
	if fs[0].Stack[0] != holdStack[0] {
		t.Errorf("stack %q, want the site holding the fds", fs[0].Stack)
	}
	want := "fd exhausted: no fd-creating call failed yet; 1023 open fds, soft limit 1024, at the limit since before attach; most held by hold_open+0x12 (fdwork) (1000)"
	if fs[0].Summary != want {
		t.Errorf("summary\n %q\nwant\n %q", fs[0].Summary, want)
	}
}

// Near the limit but not at it, and nothing failing: quiet.
func TestNearLimitQuiet(t *testing.T) {
	d := New(Config{})
	for sec := 1; sec <= 60; sec++ {
		if fs := d.Observe(t0.Add(time.Duration(sec)*time.Second), proc(1021, 1024, 0, 0, time.Time{})); len(fs) != 0 {
			t.Fatalf("at %ds: %v", sec, fs)
		}
	}
}

// The system's file table full: named as ENFILE.
func TestENFILE(t *testing.T) {
	d := New(Config{})
	now := t0.Add(2 * time.Second)
	fs := d.Observe(now, proc(100, 1024, 0, 10, now))
	if len(fs) != 1 || fs[0].Evidence.(model.FDExhaustedEvidence).Errno != "ENFILE" || !strings.Contains(fs[0].Summary, "ENFILE (the system-wide file table, fs.file-max, is full) 5.0/s") {
		t.Fatalf("%v", fs)
	}
}

// Once calls stop failing and the fds fall below the limit, the finding
// ends after Quiet, reported once; Forget drops the history.
func TestEndsAndForget(t *testing.T) {
	d := New(Config{})
	var reps []model.Finding
	for sec := 1; sec <= 30; sec++ {
		now := t0.Add(time.Duration(sec) * time.Second)
		open, fails := 1024, uint64(20*min(sec, 5))
		if sec > 5 {
			open = 500
		}
		reps = append(reps, d.Observe(now, proc(open, 1024, fails, 0, t0.Add(5*time.Second)))...)
	}
	last := reps[len(reps)-1]
	if last.Active || !last.LastSeen.Equal(t0.Add(15*time.Second)) || !strings.HasPrefix(last.Summary, "fd exhausted (over)") {
		t.Fatalf("last report %+v, want ended at 15 s", last)
	}
	if len(reps) != 15 {
		t.Errorf("%d reports, want one a second from 1 s to 15 s", len(reps))
	}
	d.Forget(42)
	now := t0.Add(31 * time.Second)
	if fs := d.Observe(now, proc(1024, 1024, 100, 0, now)); len(fs) != 1 || !fs[0].FirstSeen.Equal(now) {
		t.Errorf("after Forget: %v", fs)
	}
}
