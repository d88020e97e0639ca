package daemon

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

func TestCompileGlob(t *testing.T) {
	for _, tc := range []struct {
		glob string
		path string
		want bool
	}{
		{"*kubepods*", "/kubepods.slice/kubepods-besteffort.slice/x.scope", true},
		{"*kubepods*", "/system.slice/sshd.service", false},
		{"/kubepods/*/pod1234*", "/kubepods/besteffort/pod1234-ab/" + strings.Repeat("a", 64), true},
		{"/kubepods/burstable/*", "/kubepods/besteffort/pod1/c", false},
		{"/a?c", "/abc", true},
		{"/a?c", "/abbc", false},
		{"/[ab]x", "/bx", true},
		{"/[!ab]x", "/bx", false},
		{"/a.b", "/aXb", false}, // regexp metacharacters are literal
	} {
		re, err := CompileGlob(tc.glob)
		if err != nil {
			t.Fatalf("%q: %v", tc.glob, err)
		}
		if got := re.MatchString(tc.path); got != tc.want {
			t.Errorf("glob %q on %q = %v, want %v", tc.glob, tc.path, got, tc.want)
		}
	}
	for _, bad := range []string{"a[b", "a]b", "[]", "[!]"} {
		if _, err := CompileGlob(bad); err == nil {
			t.Errorf("CompileGlob(%q): no error", bad)
		}
	}
}

// One line when a finding becomes active, one when its severity changes,
// one when it ends; figures that move in the summary are not changes.
func TestFindingsLog(t *testing.T) {
	var buf bytes.Buffer
	l := NewFindingsLog(&buf)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	proc := &model.Process{PID: 42, Comm: "serve", Pod: model.Pod{UID: "u", ContainerID: "c", Namespace: "ml", Name: "p-0", Container: "w"}}
	f := model.Finding{Kind: model.KindFDLeak, PID: 42, Comm: "serve", Severity: model.SeverityWarning, FirstSeen: t0, Active: true,
		Summary: "open fds grew by 10", Stack: testutil.Frames("__open64+0x51 (libc.so.6)", "cache_tokenizer+0x1a (serve)")}
	snap := func(sec int, fs ...model.Finding) *model.Snapshot {
		return &model.Snapshot{Time: t0.Add(time.Duration(sec) * time.Second), Processes: []*model.Process{proc}, Findings: fs}
	}
	l.Update(snap(0))
	l.Update(snap(1, f))
	f.Summary = "open fds grew by 20"
	l.Update(snap(2, f))
	f.Severity = model.SeverityCritical
	l.Update(snap(3, f))
	f.Active = false
	l.Update(snap(4, f))
	l.Update(snap(5)) // forgotten with its process
	if err := l.Close(snap(6)); err != nil {
		t.Fatal(err)
	}

	var events []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var got findingLine
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if got.Site != "cache_tokenizer" || got.Pod == nil || got.Pod.Name != "p-0" || got.PID != 42 {
			t.Errorf("line %s: site, pod or pid wrong", line)
		}
		events = append(events, string(got.Event)+"/"+got.Severity)
	}
	if want := "active/warning updated/critical ended/critical"; strings.Join(events, " ") != want {
		t.Errorf("events %v, want %s", events, want)
	}
}

func TestHealth(t *testing.T) {
	var h Health
	if _, ok := h.Since(); ok {
		t.Fatal("healthy before the first tick")
	}
	h.Update(nil)
	if ago, ok := h.Since(); !ok || ago > time.Minute {
		t.Fatalf("Since = %v, %v after a tick", ago, ok)
	}
}

// /readyz waits for a poll, then for the views it requires.
func TestHealthReady(t *testing.T) {
	h := Health{Require: []string{"fd", "cuda"}}
	if err := h.Ready(); err == nil {
		t.Fatal("ready before the first poll")
	}
	const e2big = "loading cuda BPF programs: map live_allocs: map create: argument list too long"
	views := map[string]model.ViewState{"fd": {}, "sched": {}, "sock": {}, "cuda": {Down: e2big}, "python": {},
		"nvml": {Down: "NVML unavailable: the NVIDIA kernel driver is not loaded; GPU metrics off"}}
	h.Update(&model.Snapshot{Views: views})
	err := h.Ready()
	if err == nil || err.Error() != "required views down: cuda: "+e2big {
		t.Errorf("cuda down, fd and cuda required: %v", err)
	}
	h.Require = []string{"fd"}
	if err := h.Ready(); err != nil {
		t.Errorf("fd up, only fd required: %v", err)
	}

	// Absent where not expected: no fault, but a required view that is
	// absent fails readiness, saying so apart from the views down.
	views["cuda"] = model.ViewState{Down: e2big, Absent: model.AbsentNoGPU}
	views["nvml"] = model.ViewState{Down: "NVML unavailable: libnvidia-ml.so.1 not found", Absent: model.AbsentNoGPU}
	views["sock"] = model.ViewState{Down: "loading sock BPF programs: refused"}
	h.Update(&model.Snapshot{Views: views})
	if err := h.Ready(); err != nil {
		t.Errorf("views absent, only fd required: %v", err)
	}
	h.Require = []string{"fd", "sock", "cuda"}
	want := "required views down: sock: loading sock BPF programs: refused; " +
		"required views absent, not expected on this node (leave them out of --require-views on such nodes): " +
		"cuda: no NVIDIA GPU on this node (" + e2big + ")"
	if err := h.Ready(); err == nil || err.Error() != want {
		t.Errorf("sock down and cuda absent, both required:\n got %v\nwant %s", err, want)
	}
	if got, err := ParseViews(" fd, sock,,"); err != nil || !slices.Equal(got, []string{"fd", "sock"}) {
		t.Errorf("ParseViews = %v, %v", got, err)
	}
	if _, err := ParseViews("fd,gpu"); err == nil || !strings.Contains(err.Error(), `"gpu"`) {
		t.Errorf("an unknown view: %v", err)
	}
}
