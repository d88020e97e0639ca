package fdleak

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// Stack ids of the simulated opening sites; unknownSite stands for fds whose
// stack is not known (seeded from /proc), which the source leaves out of Sites.
const (
	unknownSite int64 = -1
	poolSite    int64 = 3
	initSite    int64 = 4
	reqSite     int64 = 5
	leakSite    int64 = 7
	burstSite   int64 = 9
)

var stacks = map[int64][]model.Frame{
	poolSite:  testutil.Frames("pool_grow+0x22 (fdwork)", "main+0x40 (fdwork)"),
	initSite:  testutil.Frames("load_config+0x31 (fdwork)", "main+0x12 (fdwork)"),
	reqSite:   testutil.Frames("serve_req+0x48 (fdwork)", "main+0x40 (fdwork)"),
	leakSite:  testutil.Frames("leak_tick+0x1a (fdwork)", "main+0x40 (fdwork)"),
	burstSite: testutil.Frames("fanout+0x77 (fdwork)", "main+0x40 (fdwork)"),
}

// sim is a process whose live fds a scenario opens and closes; it is sampled
// into the form the fd source produces.
type sim struct {
	limit          uint64
	fds            map[int64][]time.Time // live fds by opening stack id, oldest first
	opened, closed uint64
	rng            *rand.Rand
}

func newSim(limit uint64, seed uint64) *sim {
	return &sim{limit: limit, fds: make(map[int64][]time.Time), rng: rand.New(rand.NewPCG(seed, 1))}
}

func (s *sim) count() int {
	n := 0
	for _, f := range s.fds {
		n += len(f)
	}
	return n
}

// open opens n fds at site, spread over the second that ends at now; past the
// limit opens fail as with EMFILE.
func (s *sim) open(site int64, n int, now time.Time) {
	for i := range n {
		if s.limit > 0 && s.count() >= int(s.limit) {
			return
		}
		s.fds[site] = append(s.fds[site], now.Add(-time.Second+time.Duration(i+1)*time.Second/time.Duration(n)))
		s.opened++
	}
}

// closeNewest closes up to n of the most recently opened fds at site.
func (s *sim) closeNewest(site int64, n int) {
	n = min(n, len(s.fds[site]))
	s.fds[site] = s.fds[site][:len(s.fds[site])-n]
	s.closed += uint64(n)
}

// closeOldest closes up to n of the longest-held fds at site.
func (s *sim) closeOldest(site int64, n int) {
	n = min(n, len(s.fds[site]))
	s.fds[site] = s.fds[site][n:]
	s.closed += uint64(n)
}

func (s *sim) closeAll(site int64) { s.closeNewest(site, len(s.fds[site])) }

func (s *sim) process(pid int) *model.Process {
	p := &model.Process{PID: pid, Comm: "fdwork", FD: model.FDStats{
		Open:   s.count(),
		Limit:  s.limit,
		Opened: map[string]uint64{"file": s.opened},
		Closed: map[string]uint64{"file": s.closed},
	}}
	for _, id := range slices.Sorted(maps.Keys(s.fds)) {
		if id >= 0 && len(s.fds[id]) > 0 {
			p.FD.Sites = append(p.FD.Sites, model.FDSite{StackID: id, Stack: stacks[id], Opened: slices.Clone(s.fds[id])})
		}
	}
	return p
}

// step changes the simulated process during second sec, which ends at now.
type step func(s *sim, sec int, now time.Time)

type report struct {
	sec int
	f   model.Finding
}

// run samples s once a second from t0 (sec 0) to sec secs, after applying
// step, and collects what the detector returns.
func run(t *testing.T, d *Detector, s *sim, pid, secs int, st step) []report {
	t.Helper()
	var out []report
	for sec := 0; sec <= secs; sec++ {
		now := t0.Add(time.Duration(sec) * time.Second)
		st(s, sec, now)
		for _, f := range d.Observe(now, s.process(pid)) {
			if f.PID != pid || f.Kind != model.KindFDLeak {
				t.Fatalf("sec %d: finding for pid %d kind %q, want pid %d kind %q", sec, f.PID, f.Kind, pid, model.KindFDLeak)
			}
			out = append(out, report{sec, f})
		}
	}
	return out
}

// leak returns a step that starts from base fds of unknown stack and leaks
// rate fds/s at leakSite.
func leak(base, rate int) step {
	return func(s *sim, sec int, now time.Time) {
		if sec == 0 {
			s.open(unknownSite, base, now)
			return
		}
		s.open(leakSite, rate, now)
	}
}

func TestFlags(t *testing.T) {
	cases := []struct {
		name      string
		limit     uint64
		step      step
		rate      float64 // true growth, fds/s
		severity  string
		leakStack bool // the finding must point at leak_tick
		tte       bool // time_to_exhaustion_seconds must be set
	}{
		{name: "leak 5/s, high limit", limit: 1 << 20, step: leak(10, 5), rate: 5, severity: model.SeverityWarning, leakStack: true, tte: true},
		{name: "leak 40/s, limit 1024", limit: 1024, step: leak(10, 40), rate: 40, severity: model.SeverityCritical, leakStack: true, tte: true},
		{name: "leak 40/s, no limit known", limit: 0, step: leak(10, 40), rate: 40, severity: model.SeverityWarning, leakStack: true},
		{
			name: "leak 5/s beside a churning pool", limit: 65536, rate: 5, severity: model.SeverityWarning, leakStack: true, tte: true,
			step: func(s *sim, sec int, now time.Time) {
				if sec == 0 {
					s.open(unknownSite, 10, now)
					s.open(poolSite, 100, now)
				} else {
					s.open(leakSite, 5, now)
				}
				// Hundreds of short requests a second, none surviving the next sample.
				s.closeAll(reqSite)
				s.open(reqSite, 200+s.rng.IntN(5), now)
			},
		},
		{
			// 1 fd/s leaked next to fds opened before the detector attached:
			// too few old fds at the site yet, but the limit is near.
			name: "near limit, slow leak", limit: 1024, rate: 1, severity: model.SeverityCritical, leakStack: true, tte: true,
			step: func(s *sim, sec int, now time.Time) {
				if sec == 0 {
					s.open(unknownSite, 900, now)
					return
				}
				s.open(leakSite, 1, now)
			},
		},
		{
			// 1 fd/s of unknown stack (the stack map is full): only the
			// limit can reveal it.
			name: "near limit, slow growth, no stacks", limit: 1024, rate: 1, severity: model.SeverityCritical, tte: true,
			step: func(s *sim, sec int, now time.Time) {
				if sec == 0 {
					s.open(unknownSite, 900, now)
					return
				}
				s.open(unknownSite, 1, now)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reps := run(t, New(DefaultConfig()), newSim(tc.limit, 1), 42, 15, tc.step)
			if len(reps) == 0 {
				t.Fatal("no finding within 15s")
			}
			first := reps[0]
			f := first.f
			t.Logf("flagged at %ds: %s", first.sec, f.Summary)
			if !f.Active || f.Comm != "fdwork" || !f.FirstSeen.Equal(t0.Add(time.Duration(first.sec)*time.Second)) {
				t.Errorf("first finding: active %v comm %q first_seen %v", f.Active, f.Comm, f.FirstSeen)
			}
			if f.Severity != tc.severity {
				t.Errorf("severity %q, want %q", f.Severity, tc.severity)
			}
			ev := f.Evidence.(model.FDLeakEvidence)
			if got := ev.GrowthPerSecond; math.Abs(got-tc.rate) > 0.2*tc.rate {
				t.Errorf("growth %.2f fds/s, want %.2f ±20%%", got, tc.rate)
			}
			if tc.leakStack {
				if len(f.Stack) == 0 || f.Stack[0].Function != "leak_tick" {
					t.Errorf("stack %q, want leak_tick first", f.Stack)
				}
				if !strings.Contains(f.Summary, "opened at leak_tick+0x1a (fdwork)") {
					t.Errorf("summary %q does not name the leaking site", f.Summary)
				}
			}
			if got := ev.TimeToExhaustionSeconds; (got != nil) != tc.tte {
				t.Errorf("time_to_exhaustion_seconds set=%v, want set=%v", got != nil, tc.tte)
			}
			// Every later sample keeps reporting the same, still active, finding.
			for i, r := range reps[1:] {
				if r.sec != first.sec+i+1 || !r.f.Active || !r.f.FirstSeen.Equal(f.FirstSeen) ||
					!r.f.LastSeen.Equal(t0.Add(time.Duration(r.sec)*time.Second)) {
					t.Errorf("report at %ds: active %v first_seen %v last_seen %v", r.sec, r.f.Active, r.f.FirstSeen, r.f.LastSeen)
				}
			}
		})
	}
}

func TestEvidence(t *testing.T) {
	reps := run(t, New(DefaultConfig()), newSim(1024, 1), 42, 12, func(s *sim, sec int, now time.Time) {
		leak(10, 5)(s, sec, now)
		s.closeAll(reqSite)
		s.open(reqSite, 30, now)
		if sec == 0 {
			s.open(poolSite, 20, now)
		}
	})
	if len(reps) == 0 {
		t.Fatal("no finding")
	}
	r := reps[len(reps)-1]
	ev := r.f.Evidence.(model.FDLeakEvidence)
	// At 12s: 10 base + 20 pool + 30 requests + 60 leaked.
	if got := ev.OpenFDs; got != 120 {
		t.Errorf("open_fds %v, want 120", got)
	}
	if got := ev.Limit; got != 1024 {
		t.Errorf("limit %v, want 1024", got)
	}
	if got := ev.WindowSeconds; got != 8.0 {
		t.Errorf("window_seconds %v, want 8", got)
	}
	if ev.TimeToExhaustionSeconds == nil {
		t.Fatal("time_to_exhaustion_seconds null")
	}
	if got := *ev.TimeToExhaustionSeconds; math.Abs(got-(1024-120)/5.0) > 1 {
		t.Errorf("time_to_exhaustion_seconds %v, want %v", got, (1024-120)/5.0)
	}
	if got := ev.OpenedByKind["file"]; got != 10+20+13*30+60 {
		t.Errorf("opened_by_kind[file] %d", got)
	}
	if got := ev.ClosedByKind["file"]; got != 12*30 {
		t.Errorf("closed_by_kind[file] %d", got)
	}
	// The leak site leads, the pool's 20 come next; requests are all younger
	// than MinAge and not listed.
	top := ev.TopSites
	if len(top) != 2 {
		t.Fatalf("top_sites %+v, want the leak and pool sites", top)
	}
	if got := top[0].Stack[0].String(); got != "leak_tick+0x1a (fdwork)" {
		t.Errorf("top site %q", got)
	}
	// Leaked fds opened up to 9.0s minus MinAge: seconds 1..8 in full and
	// four of the five opened in second 9 (the fifth is exactly 3s old).
	if got := top[0].UnclosedFDs; got != 44 {
		t.Errorf("top site unclosed_fds %v, want 44", got)
	}
	if got := top[0].OldestAgeSeconds; got != 11.8 {
		t.Errorf("top site oldest_age_seconds %v, want 11.8", got)
	}
	if got := top[1].UnclosedFDs; got != 20 {
		t.Errorf("pool site unclosed_fds %v, want 20", got)
	}
	want := "fd leak: 120 open fds growing 5.0/s; 44 unclosed fds older than 3s opened at leak_tick+0x1a (fdwork); limit 1024 reached in ~3m"
	if r.f.Summary != want {
		t.Errorf("summary\n %q\nwant\n %q", r.f.Summary, want)
	}
}

func TestTimeToExhaustion(t *testing.T) {
	reps := run(t, New(DefaultConfig()), newSim(1024, 1), 42, 15, leak(10, 40))
	if len(reps) == 0 {
		t.Fatal("no finding")
	}
	f := reps[0].f
	ev := f.Evidence.(model.FDLeakEvidence)
	open := ev.OpenFDs
	want := float64(1024-open) / 40
	if ev.TimeToExhaustionSeconds == nil {
		t.Fatal("no time to exhaustion")
	}
	got := *ev.TimeToExhaustionSeconds
	if math.Abs(got-want) > 0.2*want || got <= 0 {
		t.Errorf("time to exhaustion %.1fs at %d open fds, want %.1fs ±20%%", got, open, want)
	}
	if got >= DefaultConfig().ExhaustWithin.Seconds() || f.Severity != model.SeverityCritical {
		t.Errorf("time to exhaustion %.1fs severity %q, want critical", got, f.Severity)
	}
	if !strings.Contains(f.Summary, "; limit 1024 reached in ~") {
		t.Errorf("summary %q lacks the limit forecast", f.Summary)
	}
}

func TestQuiet(t *testing.T) {
	cases := []struct {
		name  string
		limit uint64
		step  step
	}{
		{
			// 200 long-lived pool fds and 30-60 requests a second that close
			// within the second: Open wanders by tens, old counts stay flat.
			name: "stable pool with churn", limit: 4096,
			step: func(s *sim, sec int, now time.Time) {
				if sec == 0 {
					s.open(unknownSite, 10, now)
					s.open(poolSite, 200, now)
				}
				s.closeAll(reqSite)
				s.open(reqSite, 30+s.rng.IntN(31), now)
			},
		},
		{
			// The fd count alone shows a steady-looking window now and then
			// (a few an hour); the pool's flat old count keeps it quiet.
			name: "flat near the limit with churn", limit: 1024,
			step: func(s *sim, sec int, now time.Time) {
				if sec == 0 {
					s.open(poolSite, 900, now)
				}
				s.closeAll(reqSite)
				s.open(reqSite, 20+s.rng.IntN(11), now)
			},
		},
		{
			// 5000 fds within one second every 25s, held 4s, then released.
			name: "bursts", limit: 65536,
			step: func(s *sim, sec int, now time.Time) {
				if sec == 0 {
					s.open(unknownSite, 10, now)
					s.open(poolSite, 50, now)
				}
				switch sec % 25 {
				case 10:
					s.open(burstSite, 5000, now)
				case 14:
					s.closeAll(burstSite)
				}
			},
		},
		{
			// A cache filled in two batches 4s apart, then kept: two steps
			// of half the rise each, then a plateau.
			name: "two batches held", limit: 4096,
			step: func(s *sim, sec int, now time.Time) {
				if sec == 0 {
					s.open(unknownSite, 10, now)
				}
				if sec == 10 || sec == 14 {
					s.open(poolSite, 100, now)
				}
				s.closeAll(reqSite)
				s.open(reqSite, s.rng.IntN(3), now)
			},
		},
		{
			name: "start-up ramp then flat", limit: 4096,
			step: func(s *sim, sec int, now time.Time) {
				if sec <= 2 {
					s.open(initSite, 300, now)
				}
				s.closeAll(reqSite)
				s.open(reqSite, s.rng.IntN(3), now)
			},
		},
	}
	// Pools that grow by 6/s and are trimmed back, keeping their oldest or
	// newest connections. The period stays under the window: a pool growing
	// for a whole window cannot be told from a leak within it.
	for _, period := range []int{4, 6, 7} {
		for _, keepOld := range []bool{true, false} {
			cases = append(cases, struct {
				name  string
				limit uint64
				step  step
			}{
				name: fmt.Sprintf("sawtooth every %ds keeping old %v", period, keepOld), limit: 4096,
				step: func(s *sim, sec int, now time.Time) {
					if sec == 0 {
						s.open(poolSite, 10, now)
					}
					if sec%period != 0 {
						s.open(poolSite, 6, now)
						return
					}
					extra := len(s.fds[poolSite]) - 10
					if keepOld {
						s.closeNewest(poolSite, extra)
					} else {
						s.closeOldest(poolSite, extra)
					}
				},
			})
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(30) {
				for _, r := range run(t, New(DefaultConfig()), newSim(tc.limit, seed), 42, 300, tc.step) {
					t.Fatalf("seed %d: flagged at %ds: %s", seed, r.sec, r.f.Summary)
				}
			}
		})
	}
}

// Bursts must not hide a real leak: the bursty process with a 5/s leak added
// is flagged.
func TestLeakInsideNoise(t *testing.T) {
	reps := run(t, New(DefaultConfig()), newSim(65536, 1), 42, 40, func(s *sim, sec int, now time.Time) {
		if sec == 0 {
			s.open(poolSite, 50, now)
		}
		if sec%25 == 10 {
			s.open(burstSite, 5000, now)
		}
		if sec%25 == 14 {
			s.closeAll(burstSite)
		}
		if sec >= 20 {
			s.open(leakSite, 5, now)
		}
	})
	if len(reps) == 0 || reps[0].sec > 35 || !slices.Equal(reps[0].f.Stack, stacks[leakSite]) {
		t.Fatalf("leak starting at 20s beside bursts: %v", reps)
	}
}

func TestDeactivation(t *testing.T) {
	const stop = 20
	d := New(DefaultConfig())
	reps := run(t, d, newSim(1<<20, 1), 42, 60, func(s *sim, sec int, now time.Time) {
		if sec <= stop {
			leak(10, 5)(s, sec, now)
		}
	})
	if len(reps) == 0 {
		t.Fatal("no finding")
	}
	ended := -1
	for i, r := range reps {
		if !r.f.FirstSeen.Equal(reps[0].f.FirstSeen) {
			t.Errorf("report at %ds: first_seen %v, want %v", r.sec, r.f.FirstSeen, reps[0].f.FirstSeen)
		}
		if !r.f.Active {
			if ended >= 0 {
				t.Errorf("second inactive report at %ds", r.sec)
			}
			ended = i
		}
	}
	if ended != len(reps)-1 {
		t.Fatalf("inactive report %d of %d: reports after it or none", ended, len(reps))
	}
	// The last rise (19s to 20s) stays in the window, so the slope stays
	// positive, up to 27s while the leak site's old count is still growing;
	// a full Window later, at 35s, the finding ends.
	end := reps[ended]
	if end.sec != stop+7+8 {
		t.Errorf("ended at %ds, want %ds", end.sec, stop+7+8)
	}
	if !strings.HasPrefix(end.f.Summary, "fd leak ended: 110 open fds") {
		t.Errorf("ended summary %q", end.f.Summary)
	}
	for i, r := range reps {
		if r.sec != reps[0].sec+i {
			t.Fatalf("report %d at %ds, want one every second from %ds", i, r.sec, reps[0].sec)
		}
	}
}

func TestForget(t *testing.T) {
	d := New(DefaultConfig())
	a, b := newSim(1024, 1), newSim(1024, 2)
	var fa, fb []model.Finding
	for sec := 0; sec <= 12; sec++ {
		now := t0.Add(time.Duration(sec) * time.Second)
		leak(10, 5)(a, sec, now)
		leak(10, 5)(b, sec, now)
		fa, fb = d.Observe(now, a.process(1)), d.Observe(now, b.process(2))
	}
	if len(fa) != 1 || len(fb) != 1 {
		t.Fatalf("both leaks should be active at 12s: %v %v", fa, fb)
	}
	d.Forget(1)
	// Pid 1's history is gone: neither an ended report nor a finding until a
	// new window has filled, while pid 2 carries on.
	for sec := 13; sec <= 19; sec++ {
		now := t0.Add(time.Duration(sec) * time.Second)
		leak(10, 5)(a, sec, now)
		leak(10, 5)(b, sec, now)
		if got := d.Observe(now, a.process(1)); len(got) != 0 {
			t.Errorf("pid 1 at %ds after Forget: %v", sec, got)
		}
		got := d.Observe(now, b.process(2))
		if len(got) != 1 || !got[0].Active || !got[0].FirstSeen.Equal(fb[0].FirstSeen) {
			t.Errorf("pid 2 at %ds: %v", sec, got)
		}
	}
	now := t0.Add(20 * time.Second)
	leak(10, 5)(a, 20, now)
	got := d.Observe(now, a.process(1))
	if len(got) != 1 || !got[0].FirstSeen.Equal(now) {
		t.Errorf("pid 1 once a new window has filled: %v", got)
	}
}

func TestClockStepRestartsWindow(t *testing.T) {
	d := New(DefaultConfig())
	s := newSim(1<<20, 1)
	for sec := 0; sec <= 5; sec++ {
		leak(10, 5)(s, sec, t0.Add(time.Duration(sec)*time.Second))
		d.Observe(t0.Add(time.Duration(sec)*time.Second), s.process(1))
	}
	// The clock steps back 1h. The series restarts there and covers a full
	// window 7s later; samples from before the step must neither count
	// towards it nor keep the detector blind until the clock catches up.
	back := t0.Add(-time.Hour)
	for sec := 6; sec <= 13; sec++ {
		now := back.Add(time.Duration(sec) * time.Second)
		leak(10, 5)(s, sec, now)
		got := d.Observe(now, s.process(1))
		if flagged := len(got) == 1; flagged != (sec == 13) {
			t.Fatalf("at %ds after the clock stepped back: %v", sec, got)
		}
	}
}

// A leak that slows to 1 fd every 3s (below MinSlope, and uneven) is still a
// leak: once raised, the finding stays open while fds pile up at its site.
func TestSlowedLeakStaysActive(t *testing.T) {
	reps := run(t, New(DefaultConfig()), newSim(1<<20, 1), 42, 60, func(s *sim, sec int, now time.Time) {
		switch {
		case sec <= 15:
			leak(10, 5)(s, sec, now)
		case sec%3 == 0:
			s.open(leakSite, 1, now)
		}
	})
	if len(reps) == 0 || reps[0].sec != 7 {
		t.Fatalf("reports %v, want the first at 7s", reps)
	}
	for i, r := range reps {
		if r.sec != 7+i || !r.f.Active {
			t.Fatalf("report at %ds active %v, want an active report every second from 7s", r.sec, r.f.Active)
		}
	}
	if last := reps[len(reps)-1]; last.sec != 60 || !strings.Contains(last.f.Summary, "growing 0.3/s") {
		t.Errorf("last report at %ds: %s", last.sec, last.f.Summary)
	}
}

func TestDefaults(t *testing.T) {
	if got := New(Config{MinSiteFDs: 3}).cfg; got.MinSiteFDs != 3 || got.Window != 8*time.Second ||
		got.MinAge != 3*time.Second || got.MinSlope != 0.5 || got.ExhaustWithin != 10*time.Minute || got.LimitRatio != 0.8 {
		t.Errorf("New(Config{MinSiteFDs: 3}) config %+v", got)
	}
}
