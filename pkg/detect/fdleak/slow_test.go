package fdleak

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// slowReport is a finding and when, since t0, it was returned.
type slowReport struct {
	at time.Duration
	f  model.Finding
}

// slowStep changes the simulated process between the previous sample
// (prev) and now; elapsed is now - t0.
type slowStep func(s *sim, prev, now time.Time, elapsed time.Duration)

// runSlow samples s every `every` from t0 for dur, in simulated time.
func runSlow(t *testing.T, d *Detector, s *sim, dur, every time.Duration, st slowStep) []slowReport {
	t.Helper()
	var out []slowReport
	prev := t0.Add(-every)
	for el := time.Duration(0); el <= dur; el += every {
		now := t0.Add(el)
		st(s, prev, now, el)
		for _, f := range d.Observe(now, s.process(42)) {
			if f.Kind != model.KindFDLeak {
				t.Fatalf("%s: finding of kind %q", el, f.Kind)
			}
			out = append(out, slowReport{el, f})
		}
		prev = now
	}
	return out
}

// openEvery opens one fd at site at each multiple of period since t0 in
// (prev, now], at its own time.
func (s *sim) openEvery(site int64, period time.Duration, prev, now time.Time) {
	for k := prev.Sub(t0)/period + 1; t0.Add(k*period).Compare(now) <= 0; k++ {
		if at := t0.Add(k * period); at.After(prev) {
			s.fds[site] = append(s.fds[site], at)
			s.opened++
		}
	}
}

// background is a healthy server around the leak: 50 pooled fds opened at
// start and 0-30 requests in flight at each sample, none of which lives to
// the next sample.
func background(s *sim, now time.Time, elapsed time.Duration) {
	if elapsed == 0 {
		s.open(poolSite, 50, now)
	}
	s.closeAll(reqSite)
	s.open(reqSite, s.rng.IntN(31), now)
}

// Leaks too slow for the short window are found on the slow scales, in the
// time the issue asks for, with their rate, site and time to exhaustion, and
// long before the limit is three quarters used.
func TestSlowLeakFound(t *testing.T) {
	cases := []struct {
		name   string
		period time.Duration // one fd leaked every period
		limit  uint64
		every  time.Duration // sampling interval
		within time.Duration
		scale  float64 // time_scale_seconds of the finding
	}{
		{name: "1 fd every 5 s", period: 5 * time.Second, limit: 1024, every: time.Second, within: 2 * time.Minute, scale: 100},
		{name: "1 fd a minute", period: time.Minute, limit: 1024, every: time.Second, within: 30 * time.Minute, scale: 900},
		{name: "1 fd a minute, limit 256", period: time.Minute, limit: 256, every: time.Second, within: 30 * time.Minute, scale: 900},
		{name: "1 fd every 10 min, polled every 10 s", period: 10 * time.Minute, limit: 1024, every: 10 * time.Second, within: 2*time.Hour + 10*time.Minute, scale: 7200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(3) {
				s := newSim(tc.limit, seed)
				reps := runSlow(t, New(DefaultConfig()), s, tc.within+time.Hour, tc.every, func(s *sim, prev, now time.Time, el time.Duration) {
					background(s, now, el)
					s.openEvery(leakSite, tc.period, prev, now)
				})
				if len(reps) == 0 || reps[0].at > tc.within {
					t.Fatalf("seed %d: not found within %s: %v", seed, tc.within, reps)
				}
				first := reps[0]
				f, ev := first.f, first.f.Evidence.(model.FDLeakEvidence)
				t.Logf("seed %d: found after %s: %s", seed, first.at, f.Summary)
				rate := 1 / tc.period.Seconds()
				if got := ev.GrowthPerSecond; math.Abs(got-rate) > 0.25*rate {
					t.Errorf("growth %.4f fds/s, want %.4f ±25%%", got, rate)
				}
				open := ev.OpenFDs
				if float64(open) >= 0.75*float64(tc.limit) {
					t.Errorf("found at %d open fds of %d: not before 3/4 of the limit", open, tc.limit)
				}
				wantTTE := (float64(tc.limit) - float64(open)) / rate
				if got := ev.TimeToExhaustionSeconds; got == nil {
					t.Errorf("time to exhaustion null, want %.0fs", wantTTE)
				} else if math.Abs(*got-wantTTE) > 0.25*wantTTE {
					t.Errorf("time to exhaustion %v, want %.0fs ±25%%", *got, wantTTE)
				}
				if ev.TimeScaleSeconds != tc.scale {
					t.Errorf("time scale %v s, want %v", ev.TimeScaleSeconds, tc.scale)
				}
				if f.Severity != model.SeverityWarning || len(f.Stack) == 0 || f.Stack[0].Function != "leak_tick" {
					t.Errorf("severity %q stack %q, want a warning at leak_tick", f.Severity, f.Stack)
				}
				if !strings.Contains(f.Summary, "reached in ~") || !strings.Contains(f.Summary, "opened at leak_tick+0x1a (fdwork) in that time still open") {
					t.Errorf("summary %q", f.Summary)
				}
				// The leak goes on: the finding stays open to the end.
				for _, r := range reps {
					if !r.f.Active || !r.f.FirstSeen.Equal(f.FirstSeen) {
						t.Fatalf("at %s: active %v first seen %v", r.at, r.f.Active, r.f.FirstSeen)
					}
				}
			}
		})
	}
}

// A slow leak that stops is reported as ended once, within a couple of its
// scale's windows.
func TestSlowLeakEnds(t *testing.T) {
	const stop = 5 * time.Minute
	reps := runSlow(t, New(DefaultConfig()), newSim(1024, 1), 30*time.Minute, time.Second, func(s *sim, prev, now time.Time, el time.Duration) {
		background(s, now, el)
		if el <= stop {
			s.openEvery(leakSite, 5*time.Second, prev, now)
		}
	})
	if len(reps) == 0 {
		t.Fatal("no finding")
	}
	last := reps[len(reps)-1]
	if last.f.Active || last.at > stop+4*time.Minute {
		t.Fatalf("last report at %s active %v, want it ended within 4 min of the leak's end", last.at, last.f.Active)
	}
	for _, r := range reps[:len(reps)-1] {
		if !r.f.Active {
			t.Fatalf("ended twice, at %s", r.at)
		}
	}
	t.Logf("found at %s, ended at %s: %s", reps[0].at, last.at, last.f.Summary)
}

// Healthy processes whose fds grow for a while and stop, or turn over
// slowly without growing, stay quiet for hours.
func TestSlowQuiet(t *testing.T) {
	cases := []struct {
		name string
		step slowStep
	}{
		{
			// 20 connections, one every 3 s, then the pool is full.
			name: "pool fills in a minute",
			step: func(s *sim, prev, now time.Time, el time.Duration) {
				background(s, now, el)
				if el <= time.Minute {
					s.openEvery(poolSite, 3*time.Second, prev, now)
				}
			},
		},
		{
			// 10 connections every 20 s for a minute.
			name: "pool fills in batches",
			step: func(s *sim, prev, now time.Time, el time.Duration) {
				background(s, now, el)
				if el > 0 && el <= time.Minute && el%(20*time.Second) == 0 {
					s.open(poolSite, 10, now)
				}
			},
		},
		{
			// Towards 20 connections, growth decaying with a 1-minute
			// time constant (0.33/s at first).
			name: "pool filling towards its size",
			step: func(s *sim, prev, now time.Time, el time.Duration) {
				background(s, now, el)
				want := int(20 * (1 - math.Exp(-el.Seconds()/60)))
				for len(s.fds[initSite]) < want {
					s.fds[initSite] = append(s.fds[initSite], now)
					s.opened++
				}
			},
		},
		{
			name: "start-up opener",
			step: func(s *sim, prev, now time.Time, el time.Duration) {
				background(s, now, el)
				if el == 0 {
					s.open(initSite, 300, now)
				}
			},
		},
		{
			// 50 long-lived connections, each replaced after ~10 min:
			// fds opened all through every window, but no growth.
			name: "pool recycling its connections",
			step: func(s *sim, prev, now time.Time, el time.Duration) {
				background(s, now, el)
				if el == 0 {
					s.open(burstSite, 50, now)
				}
				if el%(12*time.Second) == 0 {
					s.closeOldest(burstSite, 1)
					s.fds[burstSite] = append(s.fds[burstSite], now)
					s.opened++
				}
			},
		},
		{
			// Grows by one every 20 s for 5 min, then is trimmed back.
			name: "slow sawtooth",
			step: func(s *sim, prev, now time.Time, el time.Duration) {
				background(s, now, el)
				if el%(5*time.Minute) == 0 {
					s.closeAll(poolSite)
				} else {
					s.openEvery(poolSite, 20*time.Second, prev, now)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range uint64(3) {
				for _, r := range runSlow(t, New(DefaultConfig()), newSim(1024, seed), 3*time.Hour, time.Second, tc.step) {
					t.Fatalf("seed %d: flagged at %s: %s", seed, r.at, r.f.Summary)
				}
			}
		})
	}
}
