package sockleak

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// sim is a TCP server on 127.0.0.1:8080 whose sockets a scenario moves into
// CLOSE_WAIT and closes; it is sampled into the form the socket source gives.
type sim struct {
	closeWait   []time.Time // when each CLOSE_WAIT socket entered the state, oldest first
	established int
	port        int // next client port
	fdLimit     uint64
	fdOpen      int // fds other than the CLOSE_WAIT sockets
}

func newSim() *sim { return &sim{port: 40000} }

// hangUp moves n connections into CLOSE_WAIT, spread over the second ending at now.
func (s *sim) hangUp(n int, now time.Time) {
	for i := range n {
		s.closeWait = append(s.closeWait, now.Add(-time.Second+time.Duration(i+1)*time.Second/time.Duration(n)))
	}
}

// closeOldest closes up to n CLOSE_WAIT sockets, oldest first.
func (s *sim) closeOldest(n int) {
	s.closeWait = s.closeWait[min(n, len(s.closeWait)):]
}

func (s *sim) proc() *model.Process {
	p := &model.Process{PID: 42, Comm: "server"}
	p.FD.Limit = s.fdLimit
	p.FD.Open = s.fdOpen + len(s.closeWait)
	p.Sock.TCPByState = map[string]int{"LISTEN": 1}
	if s.established > 0 {
		p.Sock.TCPByState["ESTABLISHED"] = s.established
	}
	if n := len(s.closeWait); n > 0 {
		p.Sock.TCPByState["CLOSE_WAIT"] = n
	}
	for i, since := range s.closeWait {
		p.Sock.CloseWait = append(p.Sock.CloseWait, model.SockConn{
			Local:  "127.0.0.1:8080",
			Remote: fmt.Sprintf("127.0.0.1:%d", s.port+i),
			State:  "CLOSE_WAIT",
			Since:  since,
		})
	}
	return p
}

// run drives a scenario for secs one-second samples: step changes the sim
// before the sample at second i. It returns every finding returned, and the
// second at which each was returned.
func run(d *Detector, s *sim, secs int, step func(i int, now time.Time)) (fs []model.Finding, at []int) {
	for i := range secs {
		now := t0.Add(time.Duration(i) * time.Second)
		step(i, now)
		for _, f := range d.Observe(now, s.proc()) {
			fs = append(fs, f)
			at = append(at, i)
		}
	}
	return fs, at
}

func firstActive(fs []model.Finding, at []int) (model.Finding, int, bool) {
	for i, f := range fs {
		if f.Active {
			return f, at[i], true
		}
	}
	return model.Finding{}, -1, false
}

func TestLeakFlagged(t *testing.T) {
	d := New(Config{})
	s := newSim()
	fs, at := run(d, s, 30, func(i int, now time.Time) {
		s.established = 10 + i%3
		if i > 0 {
			s.hangUp(2, now)
		}
	})
	f, sec, ok := firstActive(fs, at)
	if !ok {
		t.Fatal("a server leaking 2 CLOSE_WAIT sockets/s was not flagged")
	}
	// The count must grow over a full window, old sockets (past MinAge)
	// must number MinCloseWait, and the first must be held a Window.
	if sec < 10 || sec > 12 {
		t.Errorf("flagged at %ds, want 10..12", sec)
	}
	if f.Kind != model.KindSocketLeak || f.PID != 42 || f.Comm != "server" || f.Severity != model.SeverityWarning {
		t.Errorf("finding header: %+v", f)
	}
	last := fs[len(fs)-1]
	if !last.Active || !last.FirstSeen.Equal(f.FirstSeen) {
		t.Fatalf("last finding %+v, want the same one still active", last)
	}
	ev := last.Evidence.(model.SocketLeakEvidence)
	if ev.CloseWait != 58 {
		t.Errorf("close_wait = %v, want 58", ev.CloseWait)
	}
	if g := ev.GrowthPerSecond; g < 1.8 || g > 2.2 {
		t.Errorf("growth_per_second = %v, want ~2", g)
	}
	if o := ev.OldestCloseWaitSeconds; o < 28 || o > 29 {
		t.Errorf("oldest_close_wait_seconds = %v, want ~28.5", o)
	}
	if st := ev.TCPByState; st["CLOSE_WAIT"] != 58 || st["LISTEN"] != 1 {
		t.Errorf("tcp_by_state = %v", st)
	}
	top := ev.TopPairs
	if len(top) != 1 || top[0].Local != "127.0.0.1:8080" || top[0].Remote != "127.0.0.1:*" || top[0].Count != 58 {
		t.Errorf("top_pairs = %+v, want one server pair with the client port masked", top)
	}
	if ev.TimeToFDLimitSeconds != nil {
		t.Errorf("time_to_fd_limit_seconds = %v with no limit known", *ev.TimeToFDLimitSeconds)
	}
}

// A leak close to the fd limit is critical: the process will fail with EMFILE.
func TestLeakNearLimitCritical(t *testing.T) {
	d := New(Config{})
	s := newSim()
	s.fdLimit, s.fdOpen = 1024, 900
	fs, _ := run(d, s, 25, func(i int, now time.Time) { s.hangUp(3, now) })
	if len(fs) == 0 {
		t.Fatal("not flagged")
	}
	last := fs[len(fs)-1]
	if last.Severity != model.SeverityCritical {
		t.Errorf("severity %s, want critical: %s", last.Severity, last.Summary)
	}
	if tte := last.Evidence.(model.SocketLeakEvidence).TimeToFDLimitSeconds; tte == nil {
		t.Error("time_to_fd_limit_seconds null, want under a minute")
	} else if *tte > 60 {
		t.Errorf("time_to_fd_limit_seconds = %v, want under a minute", *tte)
	}
}

// One socket every 2 s is a leak too, once enough old ones pile up.
func TestSlowLeakFlagged(t *testing.T) {
	d := New(Config{})
	s := newSim()
	fs, at := run(d, s, 40, func(i int, now time.Time) {
		if i%2 == 1 {
			s.hangUp(1, now)
		}
	})
	if _, sec, ok := firstActive(fs, at); !ok || sec > 22 {
		t.Fatalf("slow leak flagged at %d (ok=%v), want by 22s", sec, ok)
	}
}

// A server that closes most connections promptly but leaks one a second:
// the young CLOSE_WAIT churn does not hide the old ones piling up.
func TestPartialLeakFlagged(t *testing.T) {
	d := New(Config{})
	s := newSim()
	var leaked []time.Time
	fs, at := run(d, s, 30, func(i int, now time.Time) {
		leaked = append(leaked, now.Add(-time.Duration(i%7)*100*time.Millisecond))
		s.closeWait = append(slices.Clone(leaked), now.Add(-50*time.Millisecond), now.Add(-20*time.Millisecond))
	})
	if _, _, ok := firstActive(fs, at); !ok {
		t.Fatal("a server leaking one connection in ten was not flagged")
	}
}

// A leak in bursts (10 every 3 s) still grows across the window.
func TestBurstyLeakFlagged(t *testing.T) {
	d := New(Config{})
	s := newSim()
	fs, at := run(d, s, 30, func(i int, now time.Time) {
		if i%3 == 0 {
			s.hangUp(10, now)
		}
	})
	if _, _, ok := firstActive(fs, at); !ok {
		t.Fatal("bursty leak not flagged")
	}
}

// A healthy server under steady load: every peer's FIN is followed by a
// close within milliseconds, so CLOSE_WAIT sockets exist but are young.
func TestHealthyServerQuiet(t *testing.T) {
	d := New(Config{})
	s := newSim()
	rng := rand.New(rand.NewPCG(1, 2))
	fs, _ := run(d, s, 300, func(i int, now time.Time) {
		s.established = 80 + rng.IntN(40)
		s.closeWait = s.closeWait[:0]
		for range rng.IntN(6) {
			s.closeWait = append(s.closeWait, now.Add(-time.Duration(rng.IntN(300))*time.Millisecond))
		}
	})
	if len(fs) > 0 {
		t.Fatalf("healthy server flagged: %s", fs[0].Summary)
	}
}

// slowCloser runs a server for secs seconds that takes 5..9 CLOSE_WAIT
// sockets a second and closes each after its own hold, drawn from
// [minHold, minHold+spread) seconds (a long request after the peer
// half-closed).
func slowCloser(secs, minHold, spread int) (fs []model.Finding, at []int) {
	d := New(Config{})
	s := newSim()
	rng := rand.New(rand.NewPCG(3, 4))
	var until []time.Time // when each CLOSE_WAIT socket is closed, parallel to s.closeWait
	return run(d, s, secs, func(i int, now time.Time) {
		n := len(s.closeWait)
		s.hangUp(5+rng.IntN(5), now)
		for _, since := range s.closeWait[n:] {
			until = append(until, since.Add(time.Duration(minHold*1000+rng.IntN(spread*1000))*time.Millisecond))
		}
		var keep, keepUntil []time.Time
		for k, u := range until {
			if u.After(now) {
				keep = append(keep, s.closeWait[k])
				keepUntil = append(keepUntil, u)
			}
		}
		s.closeWait, until = keep, keepUntil
	})
}

// Sockets held past MinAge but closed within the window: the count churns
// but does not grow, and the old ones do not stay.
func TestSlowCloserQuiet(t *testing.T) {
	if fs, _ := slowCloser(1200, 4, 5); len(fs) > 0 {
		t.Fatalf("flagged at %v: %s", fs[0].FirstSeen.Sub(t0), fs[0].Summary)
	}
}

// Sockets held longer than the window look like a leak while the server
// ramps up (none has been closed yet). Once closings show, the finding ends,
// and the steady state, where arrivals hide closings in the count, is quiet.
func TestLongHoldEndsAfterRampUp(t *testing.T) {
	for _, h := range []struct{ min, spread int }{{8, 8}, {5, 30}} {
		fs, at := slowCloser(1200, h.min, h.spread)
		ends := 0
		for k, f := range fs {
			if !f.FirstSeen.Equal(fs[0].FirstSeen) {
				t.Errorf("hold %d..%ds: second finding at %ds: %s", h.min, h.min+h.spread, at[k], f.Summary)
				break
			}
			if !f.Active {
				ends++
				if at[k] > 2*(h.min+h.spread) {
					t.Errorf("hold %d..%ds: ended only at %ds", h.min, h.min+h.spread, at[k])
				}
			}
		}
		if len(fs) > 0 && ends != 1 {
			t.Errorf("hold %d..%ds: ended %d times", h.min, h.min+h.spread, ends)
		}
	}
}

// CLOSE_WAIT sockets that were there before watching began and never change
// are no growth: nothing to report.
func TestFixedCloseWaitQuiet(t *testing.T) {
	d := New(Config{})
	s := newSim()
	for range 30 {
		s.closeWait = append(s.closeWait, t0.Add(-time.Hour))
	}
	fs, _ := run(d, s, 120, func(i int, now time.Time) { s.established = 5 + i%4 })
	if len(fs) > 0 {
		t.Fatalf("fixed set flagged: %s", fs[0].Summary)
	}
}

// One batch of sockets entering CLOSE_WAIT together (a peer restart) is one
// jump, not growth.
func TestOneBatchQuiet(t *testing.T) {
	d := New(Config{})
	s := newSim()
	fs, _ := run(d, s, 120, func(i int, now time.Time) {
		if i == 20 {
			s.hangUp(40, now)
		}
	})
	if len(fs) > 0 {
		t.Fatalf("one batch flagged: %s", fs[0].Summary)
	}
}

// Fewer old CLOSE_WAIT sockets than MinCloseWait are not reported, however
// steadily they came.
func TestBelowMinimumQuiet(t *testing.T) {
	d := New(Config{})
	s := newSim()
	fs, _ := run(d, s, 60, func(i int, now time.Time) {
		if i > 0 && i <= 8 && i%2 == 0 {
			s.hangUp(1, now)
		}
	})
	if len(fs) > 0 {
		t.Fatalf("4 sockets flagged: %s", fs[0].Summary)
	}
}

// The leak is fixed and the process closes its CLOSE_WAIT sockets: the
// finding ends once, with Active=false, and stays ended.
func TestDeactivates(t *testing.T) {
	d := New(Config{})
	s := newSim()
	fs, at := run(d, s, 80, func(i int, now time.Time) {
		switch {
		case i < 30:
			s.hangUp(2, now)
		case i < 40:
			s.closeOldest(6)
		}
	})
	_, first, ok := firstActive(fs, at)
	if !ok {
		t.Fatal("never flagged")
	}
	var ended []int
	for i, f := range fs {
		if !f.Active {
			ended = append(ended, at[i])
		}
		if at[i] > first && !f.FirstSeen.Equal(fs[0].FirstSeen) {
			t.Errorf("second finding at %ds", at[i])
		}
	}
	if len(ended) != 1 {
		t.Fatalf("ended at %v, want exactly once", ended)
	}
	if ended[0] < 30 || ended[0] > 42 {
		t.Errorf("ended at %ds, want soon after the closing began at 30s", ended[0])
	}
	if at[len(at)-1] != ended[0] {
		t.Errorf("findings after the end: last at %ds", at[len(at)-1])
	}
	if fs[len(fs)-1].Summary[:len("socket leak ended")] != "socket leak ended" {
		t.Errorf("summary %q", fs[len(fs)-1].Summary)
	}
}

// The leak stops but the leaked sockets stay: they are still leaked, so the
// finding stays active.
func TestStaysActiveWhileHeld(t *testing.T) {
	d := New(Config{})
	s := newSim()
	fs, at := run(d, s, 90, func(i int, now time.Time) {
		if i < 30 {
			s.hangUp(2, now)
		}
	})
	if len(fs) == 0 {
		t.Fatal("never flagged")
	}
	for i, f := range fs {
		if !f.Active {
			t.Fatalf("ended at %ds though no socket was closed", at[i])
		}
	}
	if at[len(at)-1] != 89 {
		t.Errorf("last finding at %ds, want every sample", at[len(at)-1])
	}
}

func TestForgetAndClockStep(t *testing.T) {
	d := New(Config{})
	s := newSim()
	run(d, s, 25, func(i int, now time.Time) { s.hangUp(2, now) })
	// The clock steps back: the history restarts and the same state is not
	// judged on a broken series.
	if fs := d.Observe(t0, s.proc()); len(fs) != 1 || !fs[0].Active {
		t.Fatalf("after a clock step: %v", fs)
	}
	d.Forget(42)
	if fs := d.Observe(t0.Add(time.Hour), s.proc()); len(fs) != 0 {
		t.Fatalf("after Forget: %v", fs)
	}
}

func TestTopPairs(t *testing.T) {
	var conns []model.SockConn
	add := func(n int, local, remote string) {
		for range n {
			conns = append(conns, model.SockConn{Local: local, Remote: remote})
		}
	}
	// A client leaking connections to a database: our port is ephemeral.
	for i := range 4 {
		add(1, fmt.Sprintf("10.0.0.2:%d", 50000+i), "10.0.0.9:5432")
	}
	// A server side on IPv6, and one lone connection.
	for i := range 3 {
		add(1, "[::1]:8080", fmt.Sprintf("[::1]:%d", 41000+i))
	}
	add(1, "10.0.0.2:33333", "10.0.0.7:443")
	got := topPairs(conns)
	want := []pair{
		{"10.0.0.2:*", "10.0.0.9:5432", 4},
		{"[::1]:8080", "[::1]:*", 3},
		{"10.0.0.2:*", "10.0.0.7:*", 1},
	}
	if !slices.Equal(got, want) {
		t.Errorf("topPairs = %v\nwant %v", got, want)
	}
}

func TestOpeningStack(t *testing.T) {
	a := testutil.Frames("accept4+0x10 (libc.so.6)", "accept_conn+0x9 (server)")
	b := testutil.Frames("accept4+0x10 (libc.so.6)", "admin_accept+0x9 (server)")
	conns := []model.SockConn{{Stack: b}, {Stack: a}, {Stack: a}, {}}
	got, n := openingStack(conns)
	if n != 2 || len(got) != 2 || got[1] != a[1] {
		t.Fatalf("openingStack = %q, %d; want %q, 2", got, n, a)
	}
	if got, n := openingStack([]model.SockConn{{}, {}}); got != nil || n != 0 {
		t.Fatalf("no known stacks: got %q, %d", got, n)
	}
}
