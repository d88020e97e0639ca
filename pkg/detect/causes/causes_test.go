package causes

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

var (
	acceptStack = testutil.Frames("accept_conn+0x12 (sockwork)", "main+0x40 (sockwork)")
	openStack   = testutil.Frames("leak_tick+0x1a (fdwork)", "main+0x40 (fdwork)")
)

// server is a process whose site holds fds 10..10+n-1, of which the first
// cw are sockets in CLOSE_WAIT.
func server(stack []model.Frame, n, cw int) *model.Process {
	p := &model.Process{PID: 7, Comm: "sockwork"}
	site := model.FDSite{StackID: 1, Stack: stack}
	for i := range n {
		site.FDs = append(site.FDs, int32(10+i))
		site.Opened = append(site.Opened, t0)
		if i < cw {
			p.Sock.CloseWait = append(p.Sock.CloseWait, model.SockConn{FD: 10 + i, State: "CLOSE_WAIT", Stack: stack})
		}
	}
	p.FD.Sites = []model.FDSite{site}
	p.FD.Open = n + 3
	return p
}

func fdLeak(stack []model.Frame, first time.Time) model.Finding {
	return model.Finding{Kind: model.KindFDLeak, PID: 7, Severity: model.SeverityCritical, FirstSeen: first, Active: true, Stack: stack,
		Summary:  "fd leak: 103 open fds growing 10.0/s",
		Evidence: model.FDLeakEvidence{OpenFDs: 103, GrowthPerSecond: 10.0, Limit: 1024, TimeToExhaustionSeconds: new(92.1)}}
}

func sockLeak(first time.Time) model.Finding {
	return model.Finding{Kind: model.KindSocketLeak, PID: 7, Severity: model.SeverityWarning, FirstSeen: first, Active: true, Stack: acceptStack,
		Summary: "socket leak: 100 TCP sockets in CLOSE_WAIT", Evidence: model.SocketLeakEvidence{CloseWait: 100}}
}

// fdGrowth is the fd growth in a socket leak's evidence.
func fdGrowth(f model.Finding) *model.FDGrowth {
	ev, _ := f.Evidence.(model.SocketLeakEvidence)
	return ev.FDGrowth
}

// pipeline records findings the way pkg/pipeline does: by kind, pid and
// first sighting.
type pipeline struct {
	l        *Linker
	recorded []model.Finding
}

func (p *pipeline) poll(now time.Time, proc *model.Process, fresh ...model.Finding) []model.Finding {
	out := p.l.Link(now, []*model.Process{proc}, fresh, p.recorded)
	for _, f := range out {
		if g := find(p.recorded, f.Kind, f.PID, f.FirstSeen); g != nil {
			*g = f
		} else {
			p.recorded = append(p.recorded, f)
		}
	}
	return out
}

// The CLOSE_WAIT server: the fd leak comes first and waits; once the
// socket leak is raised there is one finding standing on its own, the
// socket leak, with the fd growth as evidence, and the fd leak points at it.
func TestCloseWaitLeakIsOneFinding(t *testing.T) {
	p := &pipeline{l: New(DefaultGrace)}
	proc := server(acceptStack, 100, 98)
	fdAt, sockAt := t0.Add(8*time.Second), t0.Add(15*time.Second)
	for now := fdAt; now.Before(sockAt); now = now.Add(time.Second) {
		if out := p.poll(now, proc, fdLeak(acceptStack, fdAt)); len(out) != 0 {
			t.Fatalf("at %s the fd leak was recorded before its cause: %v", now.Sub(t0), out)
		}
	}
	for now := sockAt; now.Before(sockAt.Add(3 * time.Second)); now = now.Add(time.Second) {
		p.poll(now, proc, fdLeak(acceptStack, fdAt), sockLeak(sockAt))
	}
	var standing []model.Finding
	for _, f := range p.recorded {
		if f.CausedBy == nil {
			standing = append(standing, f)
		}
	}
	if len(standing) != 1 || standing[0].Kind != model.KindSocketLeak {
		t.Fatalf("findings on their own: %+v", standing)
	}
	s := standing[0]
	fl := find(p.recorded, model.KindFDLeak, 7, fdAt)
	if fl == nil || *fl.CausedBy != s.Ref() || !strings.Contains(fl.Summary, "CLOSE_WAIT sockets of the socket_leak") {
		t.Fatalf("fd leak %+v, want it caused by %+v", fl, s.Ref())
	}
	if len(s.Related) != 1 || s.Related[0] != fl.Ref() {
		t.Errorf("socket leak related %v", s.Related)
	}
	if g := fdGrowth(s); g == nil || g.GrowthPerSecond != 10.0 || g.OpenFDs != 103 || g.Limit != 1024 || g.TimeToExhaustionSeconds == nil || *g.TimeToExhaustionSeconds != 92.1 || !g.FDLeakFirstSeen.Equal(fdAt) {
		t.Errorf("fd growth evidence %+v", g)
	}
	if ev := s.Evidence.(model.SocketLeakEvidence); ev.CloseWait != 100 {
		t.Errorf("socket leak evidence %+v, want its own kept", ev)
	}
	// The fd leak was critical (limit near): so is the one finding.
	if s.Severity != model.SeverityCritical || !strings.Contains(s.Summary, "103 open and growing 10.0/s") {
		t.Errorf("socket leak severity %q summary %q", s.Severity, s.Summary)
	}

	// The fd leak ends first: the link and the evidence stay.
	ended := fdLeak(acceptStack, fdAt)
	ended.Active = false
	now := sockAt.Add(3 * time.Second)
	p.poll(now, proc, ended, sockLeak(sockAt))
	p.poll(now.Add(time.Second), proc, sockLeak(sockAt))
	s = *find(p.recorded, model.KindSocketLeak, 7, sockAt)
	if fl := find(p.recorded, model.KindFDLeak, 7, fdAt); fl.Active || fl.CausedBy == nil {
		t.Errorf("ended fd leak %+v", fl)
	}
	if len(s.Related) != 1 || fdGrowth(s) == nil {
		t.Errorf("socket leak lost its link: %+v", s)
	}
}

// A plain file leak is an fd leak, recorded at once, caused by nothing.
func TestFileLeakStandsAlone(t *testing.T) {
	p := &pipeline{l: New(DefaultGrace)}
	proc := server(openStack, 100, 0)
	// A few CLOSE_WAIT sockets elsewhere in the process change nothing.
	proc.Sock.CloseWait = []model.SockConn{{FD: 500, State: "CLOSE_WAIT"}}
	out := p.poll(t0, proc, fdLeak(openStack, t0), sockLeak(t0))
	if len(out) != 2 || out[0].Kind != model.KindFDLeak || out[0].CausedBy != nil || out[0].Summary != fdLeak(openStack, t0).Summary {
		t.Fatalf("%+v", out)
	}
	if out[1].Related != nil || fdGrowth(out[1]) != nil {
		t.Errorf("socket leak linked to a file leak: %+v", out[1])
	}
}

// Without a socket leak within the grace period, an fd leak of CLOSE_WAIT
// sockets is reported as a plain fd leak.
func TestGraceExpires(t *testing.T) {
	p := &pipeline{l: New(DefaultGrace)}
	proc := server(acceptStack, 100, 100)
	for s := 0; s <= 25; s++ {
		now := t0.Add(time.Duration(s) * time.Second)
		out := p.poll(now, proc, fdLeak(acceptStack, t0))
		if got, want := len(out) == 1, s >= 20; got != want {
			t.Fatalf("at %ds: %v", s, out)
		}
		if len(out) == 1 && out[0].CausedBy != nil {
			t.Fatalf("at %ds: caused by %v", s, out[0].CausedBy)
		}
	}
}

// fd exhaustion is reported at once and names the leak that leads to it.
func TestExhaustionRelated(t *testing.T) {
	p := &pipeline{l: New(DefaultGrace)}
	proc := server(openStack, 100, 0)
	ex := model.Finding{Kind: model.KindFDExhausted, PID: 7, FirstSeen: t0, Active: true}
	out := p.poll(t0, proc, fdLeak(openStack, t0.Add(-time.Minute)), ex)
	if len(out) != 2 || len(out[1].Related) != 1 || out[1].Related[0].Kind != model.KindFDLeak {
		t.Fatalf("%+v", out)
	}
}

// The JSON report writes findings as they are: the link shows both ways.
func TestJSON(t *testing.T) {
	p := &pipeline{l: New(DefaultGrace)}
	out := p.poll(t0, server(acceptStack, 10, 10), fdLeak(acceptStack, t0), sockLeak(t0))
	b, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	ref := `{"kind":"socket_leak","pid":7,"first_seen":"2025-03-01T12:00:00Z"}`
	if !strings.Contains(string(b), `"caused_by":`+ref) || !strings.Contains(string(b), `"related":[{"kind":"fd_leak","pid":7,`) {
		t.Errorf("%s", b)
	}
	if strings.Count(string(b), "caused_by") != 1 {
		t.Errorf("caused_by on more than the fd leak: %s", b)
	}
}

// A GPU leak and the bursts of the same call site name each other; a burst
// from another site stays unrelated.
func TestGPULeakAndBurstOfOneSite(t *testing.T) {
	site := testutil.Frames("cudaMalloc+0x10 (libcudart.so.12)", "cache_activations+0x2a (trainer)", "main+0x40 (trainer)")
	other := testutil.Frames("cudaMalloc+0x10 (libcudart.so.12)", "warmup+0x11 (trainer)")
	leak := model.Finding{Kind: model.KindGPUMemoryLeak, PID: 7, FirstSeen: t0, Active: true, Stack: site, Summary: "GPU memory leak"}
	burst := model.Finding{Kind: model.KindGPUAllocBurst, PID: 7, FirstSeen: t0.Add(time.Second), Active: true, Stack: site, Summary: "GPU allocation burst"}
	elsewhere := model.Finding{Kind: model.KindGPUAllocBurst, PID: 7, FirstSeen: t0.Add(2 * time.Second), Active: true, Stack: other, Summary: "GPU allocation burst"}
	got := New(DefaultGrace).Link(t0.Add(3*time.Second), nil, []model.Finding{leak, burst, elsewhere}, nil)
	if len(got) != 3 {
		t.Fatalf("%d findings, want 3", len(got))
	}
	if len(got[0].Related) != 1 || got[0].Related[0] != burst.Ref() || !strings.Contains(got[0].Summary, "also bursts") {
		t.Errorf("leak: related %v, summary %q", got[0].Related, got[0].Summary)
	}
	if len(got[1].Related) != 1 || got[1].Related[0] != leak.Ref() || !strings.Contains(got[1].Summary, "also leaks") {
		t.Errorf("burst: related %v, summary %q", got[1].Related, got[1].Summary)
	}
	if len(got[2].Related) != 0 {
		t.Errorf("burst of another site related to %v", got[2].Related)
	}
}
