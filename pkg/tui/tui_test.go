package tui

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func proc(pid int, comm string, open int, exited bool) *model.Process {
	return &model.Process{
		PID: pid, Comm: comm, Started: t0, Exited: exited,
		FD: model.FDStats{
			Open: open, Limit: 1024,
			Opened: map[string]uint64{"file": uint64(open) + 20, "socket": 3},
			Closed: map[string]uint64{"file": 20},
		},
	}
}

func snap(sec int, procs []*model.Process, findings []model.Finding, lost map[string]uint64) *model.Snapshot {
	return &model.Snapshot{Time: t0.Add(time.Duration(sec) * time.Second), Start: t0, Targets: []int{100}, Processes: procs, Findings: findings, Lost: lost}
}

var leak = model.Finding{
	Kind: model.KindFDLeak, PID: 100, Comm: "fdwork", Severity: model.SeverityWarning,
	FirstSeen: t0.Add(2 * time.Second), LastSeen: t0.Add(2 * time.Second), Active: true,
	Summary: "open fds grew by 20 in 2s",
	Stack: []model.Frame{
		{Kind: model.FrameNative, Function: "__open64", Module: "libc.so.6", Offset: 0x51},
		{Kind: model.FramePython, Function: "cache_tokenizer", File: "/srv/app/leak.py", Line: 16},
		{Kind: model.FrameNative, Function: "main", Module: "fdwork"},
		{Kind: model.FrameNative, Module: "libfoo.so", Offset: 0x1234},
		{Kind: model.FrameNative, Address: 0x7ffd0000},
		{Kind: model.FrameNative, Function: "f6", Module: "fdwork", Offset: 1},
		{Kind: model.FrameNative, Function: "f7", Module: "fdwork", Offset: 2},
	},
}

func TestLog(t *testing.T) {
	var buf bytes.Buffer
	v := New(&buf, false)

	v.Update(snap(1, []*model.Process{proc(100, "fdwork", 10, false), proc(200, "quiet", 4, false)}, nil, nil))
	v.Update(snap(3, []*model.Process{proc(100, "fdwork", 30, false), proc(200, "quiet", 4, false)}, []model.Finding{leak}, nil))
	v.Update(snap(4, []*model.Process{proc(100, "fdwork", 30, false), proc(200, "quiet", 4, true)}, []model.Finding{leak}, nil))

	want := `03:04:06 pid=100 (fdwork) open=10 findings=0 rate=-
03:04:06 pid=200 (quiet) open=4 findings=0 rate=-
FINDING fd_leak pid=100 (fdwork) warning: open fds grew by 20 in 2s
    __open64+0x51 (libc.so.6)
    cache_tokenizer (/srv/app/leak.py:16)
    main (fdwork)
    ... 4 more frames
03:04:08 pid=100 (fdwork) open=30 findings=1 rate=+10.0/s
03:04:09 pid=200 (quiet) open=4 findings=0 exited rate=+0.0/s
`
	if got := buf.String(); got != want {
		t.Errorf("log:\n%s\nwant:\n%s", got, want)
	}
	if strings.Contains(buf.String(), "\x1b[") {
		t.Error("escape sequences in a log that is not a terminal")
	}
}

// A log whose lines would not change says every Heartbeat that it is still
// watching, with the events seen since it last spoke.
func TestLogHeartbeat(t *testing.T) {
	var buf bytes.Buffer
	v := New(&buf, false)
	busy := func(sec int) *model.Snapshot {
		p := proc(100, "churn", 10, false)
		p.CUDA.Calls = map[string]uint64{"cudaMalloc": uint64(sec) * 1000, "cudaFree": uint64(sec) * 1000}
		return snap(sec, []*model.Process{p}, nil, nil)
	}
	for sec := 1; sec <= 25; sec++ {
		v.Update(busy(sec))
	}
	want := `03:04:06 pid=100 (churn) open=10 findings=0 rate=-
03:04:16 watching 1 processes, 2000 events/s, 0 findings
03:04:26 watching 1 processes, 2000 events/s, 0 findings
`
	if got := buf.String(); got != want {
		t.Errorf("log:\n%s\nwant:\n%s", got, want)
	}
}

func TestLive(t *testing.T) {
	var buf bytes.Buffer
	v := New(&buf, true)

	v.Update(snap(1, []*model.Process{proc(100, "fdwork", 10, false)}, nil, nil))
	first := buf.String()
	for _, s := range []string{"findings 0 active / 0", "PID", "RATE", "fdwork", "10"} {
		if !strings.Contains(first, s) {
			t.Errorf("first block lacks %q:\n%s", s, first)
		}
	}
	if strings.Contains(first, "\x1b[") {
		t.Errorf("first block clears lines that are not its own:\n%q", first)
	}

	buf.Reset()
	v.Update(snap(3, []*model.Process{proc(100, "fdwork", 30, false)}, []model.Finding{leak}, map[string]uint64{"fd_events": 2}))
	second := buf.String()
	// The 3-line block is erased first, then the finding printed once above
	// the new block.
	if !strings.HasPrefix(second, "\x1b[3A\x1b[J") {
		t.Errorf("second block does not erase the first:\n%q", second)
	}
	for _, s := range []string{"FINDING fd_leak pid=100 (fdwork) warning: open fds grew", "+10.0/s", "findings 1 active / 1", "lost fd_events=2"} {
		if !strings.Contains(second, s) {
			t.Errorf("second block lacks %q:\n%s", s, second)
		}
	}

	buf.Reset()
	v.Update(snap(4, []*model.Process{proc(100, "fdwork", 30, false)}, []model.Finding{leak}, nil))
	if strings.Contains(buf.String(), "FINDING fd_leak") {
		t.Errorf("finding printed again:\n%s", buf.String())
	}

	buf.Reset()
	if err := v.Close(nil); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), "\x1b[3A\x1b[J") || !strings.Contains(buf.String(), "OPEN-FDS") {
		t.Errorf("Close does not replace the block with the summary:\n%q", buf.String())
	}
}

func TestSummary(t *testing.T) {
	var buf bytes.Buffer
	v := New(&buf, false)
	v.Update(snap(1, []*model.Process{proc(100, "fdwork", 10, false), proc(200, "sockwork", 4, false)}, nil, nil))
	v.Update(snap(2, []*model.Process{proc(100, "fdwork", 20, false), proc(200, "sockwork", 3, true)}, nil, nil))
	resolved := leak
	resolved.Kind, resolved.PID, resolved.Comm, resolved.Severity, resolved.Active = model.KindSocketLeak, 200, "sockwork", model.SeverityCritical, false
	resolved.Stack = nil

	buf.Reset()
	// pid 200 no longer appears in the final snapshot but stays in the table.
	err := v.Close(snap(3, []*model.Process{proc(100, "fdwork", 30, false)}, []model.Finding{leak, resolved}, map[string]uint64{"fd_events": 0}))
	if err != nil {
		t.Fatal(err)
	}
	want := `PID  COMM               OPEN-FDS  LIMIT  OPENED  CLOSED  FINDINGS
100  fdwork             30        1024   53      20      1
200  sockwork (exited)  3         1024   26      20      1

findings (2):
FINDING fd_leak pid=100 (fdwork) warning: open fds grew by 20 in 2s
    __open64+0x51 (libc.so.6)
    cache_tokenizer (/srv/app/leak.py:16)
    main (fdwork)
    libfoo.so+0x1234
    0x7ffd0000
    ... 2 more frames
FINDING socket_leak pid=200 (sockwork) critical: open fds grew by 20 in 2s (no longer active)

no events lost
`
	if got := buf.String(); got != want {
		t.Errorf("summary:\n%s\nwant:\n%s", got, want)
	}
}

func TestSummaryEmpty(t *testing.T) {
	var buf bytes.Buffer
	if err := New(&buf, true).Close(nil); err != nil {
		t.Fatal(err)
	}
	want := "PID  COMM  OPEN-FDS  LIMIT  OPENED  CLOSED  FINDINGS\n\nno findings\n\nno events lost\n"
	if buf.String() != want {
		t.Errorf("summary:\n%q\nwant:\n%q", buf.String(), want)
	}
}

func TestSummaryLost(t *testing.T) {
	var buf bytes.Buffer
	v := New(&buf, false)
	if err := v.Close(snap(1, nil, nil, map[string]uint64{"fd_events": 3, "stack_map": 0, "cuda_events": 1})); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "\nlost events: cuda_events=1 fd_events=3\n") {
		t.Errorf("summary lacks lost events:\n%s", buf.String())
	}
}

type failing struct{ n int }

func (f *failing) Write(p []byte) (int, error) {
	f.n++
	return 0, errors.New("terminal gone")
}

func TestWriteErrorReturnedByClose(t *testing.T) {
	w := &failing{}
	v := New(w, false)
	v.Update(snap(1, []*model.Process{proc(100, "fdwork", 10, false)}, nil, nil))
	if err := v.Close(nil); err == nil || err.Error() != "terminal gone" {
		t.Errorf("Close = %v, want the write error", err)
	}
	if w.n != 1 {
		t.Errorf("%d writes after the first failed one, want none", w.n-1)
	}
}

// An fd leak that a socket leak explains is not shown on its own.
func TestCausedFindingNotShown(t *testing.T) {
	var buf bytes.Buffer
	v := New(&buf, false)
	sock := model.Finding{Kind: model.KindSocketLeak, PID: 100, Comm: "fdwork", Severity: model.SeverityWarning,
		FirstSeen: t0, Active: true, Summary: "CLOSE_WAIT sockets pile up"}
	fd := leak
	fd.CausedBy = &model.FindingRef{Kind: model.KindSocketLeak, PID: 100, FirstSeen: t0}
	v.Update(snap(1, []*model.Process{proc(100, "fdwork", 10, false)}, []model.Finding{sock, fd}, nil))
	if err := v.Close(nil); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, "CLOSE_WAIT sockets pile up") || strings.Contains(out, leak.Summary) {
		t.Errorf("view:\n%s\nwant the socket leak only", out)
	}
}
