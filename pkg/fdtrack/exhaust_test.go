package fdtrack

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/fdexhaust"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/fdleak"
	"github.com/open-autoglm/autoglm-ebpf/pkg/launch"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
	"golang.org/x/sys/unix"
)

// judged is the fd concern with the detectors the pipeline runs on its
// view, their findings annotated by the concern as the pipeline has it.
type judged struct {
	*Concern
	leak    *fdleak.Detector
	exhaust *fdexhaust.Detector
}

// Observe fills procs and judges them, as a poll of the pipeline does.
func (j *judged) Observe(now time.Time, procs []*model.Process) ([]model.Finding, error) {
	return testutil.Judge(now, procs, j.Fill, j.Annotate, j.leak, j.exhaust)
}

func newConcern(t *testing.T) *judged {
	t.Helper()
	testutil.RequireRoot(t)
	c, err := NewConcern(Config{ProcRoot: "/proc"}, symbolize.New("/proc"), 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &judged{Concern: c, leak: fdleak.New(fdleak.Config{}), exhaust: fdexhaust.New(fdexhaust.Config{})}
}

// poll observes p once a second, up to n times, until a finding of kind
// shows; it returns that finding (nil if none) and the polls made.
func pollFor(t *testing.T, c *judged, p *model.Process, kind string, n int) (*model.Finding, int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		// Measurement window: a poll interval; the detector's rates are
		// per second.
		time.Sleep(time.Second)
		fs, err := c.Observe(time.Now(), []*model.Process{p})
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			if f.Kind == kind {
				return &f, i
			}
		}
	}
	return nil, n
}

// checkExhausted checks what an fd_exhausted finding about the exhaust
// fixture (soft limit 256, 20 failed opens a second) must name.
func checkExhausted(t *testing.T, c *judged, p *model.Process, f *model.Finding, beforeAttach bool) {
	t.Helper()
	if f.Severity != model.SeverityCritical || !f.Active {
		t.Errorf("severity %q active %v", f.Severity, f.Active)
	}
	ev := f.Evidence.(model.FDExhaustedEvidence)
	if ev.Limit != 256 || ev.AtLimitAtAttach != beforeAttach || ev.Errno != "EMFILE" {
		t.Errorf("evidence %+v", ev)
	}
	call := ev.FailingCall
	if call == nil || !strings.Contains(strings.Join(testutil.Texts(call.Stack), " "), "try_open") {
		t.Errorf("failing call %v, want try_open", call)
	}
	// The failing call is named with its line, from the fixture's DWARF.
	line := testutil.LineOf(t, filepath.Join(testutil.RepoRoot(), "testdata", "fdwork.c"), "/* exhaust: try */")
	if !strings.Contains(f.Summary, "soft limit 256") || !strings.Contains(f.Summary, "EMFILE") || !strings.Contains(f.Summary, fmt.Sprintf("at try_open (fdwork.c:%d)", line)) {
		t.Errorf("summary %q", f.Summary)
	}
	// A few more seconds for the rate and the counters.
	var last *model.Finding
	for range 3 {
		last, _ = pollFor(t, c, p, model.KindFDExhausted, 1)
	}
	if last == nil {
		t.Fatal("finding no longer reported")
	}
	lastEv := last.Evidence.(model.FDExhaustedEvidence)
	if r := lastEv.FailuresPerSecond; r < 12 || r > 25 {
		t.Errorf("%.1f failures/s, want about 20", r)
	}
	if p.FD.Failed["EMFILE"] < 40 || p.FD.Failed["ENFILE"] != 0 {
		t.Errorf("failures %v", p.FD.Failed)
	}
	if p.FD.LastFailure == nil || p.FD.LastFailure.Kind != "file" || time.Since(p.FD.LastFailure.Time) > 2*time.Second {
		t.Errorf("last failure %+v", p.FD.LastFailure)
	}
	// Without it the process is not at its limit: the table holds
	// everything up to it, from hold_open when traced live.
	if p.FD.Open < 255 {
		t.Errorf("%d open fds, want 256", p.FD.Open)
	}
	if beforeAttach {
		return
	}
	top := lastEv.TopSites
	if len(top) == 0 || !strings.Contains(strings.Join(testutil.Texts(top[0].Stack), " "), "hold_open") {
		t.Errorf("top sites %v, want hold_open first", top)
	}
}

// fdworkFromExec starts fdwork with args, tracked by c from before exec,
// and returns its process for Observe.
func fdworkFromExec(t *testing.T, c *judged, args ...string) *model.Process {
	t.Helper()
	bin := testutil.Fixture(t, "fdwork", "-pthread")
	g, err := launch.Start(append([]string{bin}, args...), nil, nil, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Abort)
	pid := g.Cmd.Process.Pid
	if err := c.Track(pid); err != nil {
		t.Fatal(err)
	}
	p := &model.Process{PID: pid, Comm: "fdwork", Started: time.Now()}
	if err := g.Release(); err != nil {
		t.Fatal(err)
	}
	return p
}

// Tracked from before exec: the fixture fills its table, then keeps failing.
func TestExhaustedTrackedBefore(t *testing.T) {
	c := newConcern(t)
	p := fdworkFromExec(t, c, "exhaust", "256", "20", "30")
	f, polls := pollFor(t, c, p, model.KindFDExhausted, 3)
	if f == nil {
		t.Fatalf("no fd_exhausted in %d polls; open %d, failures %v", polls, p.FD.Open, p.FD.Failed)
	}
	t.Logf("found at poll %d: %s", polls, f.Summary)
	checkExhausted(t, c, p, f, false)
}

// Attached when the fixture is already at its limit and failing: found at
// once, from the failures that follow and the count seeded from /proc.
func TestExhaustedAttachedAfter(t *testing.T) {
	c := newConcern(t)
	bin := testutil.Fixture(t, "fdwork", "-pthread")
	pid := testutil.Start(t, bin, "exhaust", "256", "20", "30").Process.Pid
	if err := c.Track(pid); err != nil {
		t.Fatal(err)
	}
	p := &model.Process{PID: pid, Comm: "fdwork", Started: time.Now()}
	f, polls := pollFor(t, c, p, model.KindFDExhausted, 2)
	if f == nil {
		t.Fatalf("no fd_exhausted in %d polls; open %d, failures %v", polls, p.FD.Open, p.FD.Failed)
	}
	t.Logf("found at poll %d: %s", polls, f.Summary)
	checkExhausted(t, c, p, f, true)
}

// Near its limit (44 of 64) and opening and closing all the time, never
// failing: quiet.
func TestNearLimitQuiet(t *testing.T) {
	c := newConcern(t)
	bin := testutil.Fixture(t, "fdwork", "-pthread")
	pid := testutil.Start(t, bin, "near", "64", "40", "30").Process.Pid
	if err := c.Track(pid); err != nil {
		t.Fatal(err)
	}
	p := &model.Process{PID: pid, Comm: "fdwork", Started: time.Now()}
	for range 6 {
		if f, _ := pollFor(t, c, p, model.KindFDExhausted, 1); f != nil {
			t.Fatalf("flagged: %s", f.Summary)
		}
	}
	if p.FD.Limit != 64 || p.FD.Open < 40 || p.FD.Open > 50 || p.FD.Failed["EMFILE"] != 0 || p.FD.LastFailure != nil {
		t.Errorf("limit %d, open %d, failures %v, last %+v", p.FD.Limit, p.FD.Open, p.FD.Failed, p.FD.LastFailure)
	}
	if p.FD.Opened["file"] < 50 {
		t.Errorf("opened %v: the fixture is not churning", p.FD.Opened)
	}
}

// RLIMIT_NOFILE is read again every limitEvery polls, and at each poll once
// the process holds over half of it: a limit lowered from outside (prlimit)
// shows within limitEvery polls, and near the limit at the next poll.
func TestLimitRead(t *testing.T) {
	c := newConcern(t)
	bin := testutil.Fixture(t, "fdwork", "-pthread")
	pid := testutil.Start(t, bin, "startup", "10", "30").Process.Pid
	if err := c.Track(pid); err != nil {
		t.Fatal(err)
	}
	p := &model.Process{PID: pid, Comm: "fdwork", Started: time.Now()}
	observe := func() {
		t.Helper()
		if _, err := c.Observe(time.Now(), []*model.Process{p}); err != nil {
			t.Fatal(err)
		}
	}
	observe()
	if p.FD.Limit < 64 {
		t.Fatalf("limit %d: the fixture should start with a large one", p.FD.Limit)
	}
	setLimit := func(n uint64) {
		t.Helper()
		if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: n}, nil); err != nil {
			t.Fatal(err)
		}
	}
	setLimit(16)
	polls := 0
	for ; p.FD.Limit != 16 && polls <= limitEvery; polls++ {
		observe()
	}
	if p.FD.Limit != 16 {
		t.Fatalf("limit lowered to 16 still read as %d after %d polls", p.FD.Limit, polls)
	}
	// 10 of 16 open: read at each poll.
	setLimit(12)
	observe()
	if p.FD.Limit != 12 {
		t.Errorf("near the limit, lowered to 12: read as %d at the next poll", p.FD.Limit)
	}
}
