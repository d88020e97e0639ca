package gpualloc

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// leakFinding returns the reports of the one leak finding of reps.
func leakFinding(t *testing.T, reps []report) []report {
	t.Helper()
	if b := ofKind(reps, model.KindGPUAllocBurst); len(b) > 0 {
		t.Errorf("flagged as a burst at %ds: %s", b[0].sec, b[0].f.Summary)
	}
	fs := findings(ofKind(reps, model.KindGPUMemoryLeak))
	if len(fs) != 1 {
		for _, f := range fs {
			t.Logf("leak finding at %ds: %s", f[0].sec, f[0].f.Summary)
		}
		t.Fatalf("%d leak findings, want 1", len(fs))
	}
	return fs[0]
}

func TestLeakFound(t *testing.T) {
	for seed := range uint64(5) {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			// A 2 GiB pool at start, steady step traffic, and two 4 MiB
			// tensors a second cached and never freed until second 70.
			leak := leakFinding(t, run(t, New(DefaultConfig()), newSim(seed), 42, 160, func(s *sim, sec int, now time.Time) {
				if sec == 1 {
					s.alloc(poolSite, 8, 256*mib, now)
				}
				steadyTraffic(s, now)
				if sec >= 1 && sec <= 70 {
					s.alloc(cacheSite, 2, 4*mib, now)
				}
			}))
			first := leak[0]
			f := first.f
			t.Logf("flagged at %ds: %s", first.sec, f.Summary)
			// The fast window must span 10 s of the leak, then hold 3 samples.
			if first.sec < 10 || first.sec > 15 {
				t.Errorf("flagged at %ds, want between 10s and 15s", first.sec)
			}
			if !f.Active || f.Severity != model.SeverityWarning || !f.FirstSeen.Equal(at(first.sec)) {
				t.Errorf("first finding: active %v severity %q first_seen %v", f.Active, f.Severity, f.FirstSeen)
			}
			if !slices.ContainsFunc(f.Stack, func(fr model.Frame) bool { return fr.Function == "cache_tensor" }) {
				t.Errorf("stack %q does not name cache_tensor", f.Stack)
			}
			if !strings.Contains(f.Summary, "made at cache_tensor+0x2a (trainer)") {
				t.Errorf("summary %q does not name the leaking call site", f.Summary)
			}
			ev := f.Evidence.(model.GPUMemoryLeakEvidence)
			if got := ev.GrowthBytesPerSecond; math.Abs(got-8*mib) > 0.2*8*mib {
				t.Errorf("growth %.0f B/s, want 8 MiB/s ±20%%", got)
			}
			if ev.TimeScaleSeconds != 10.0 {
				t.Errorf("time_scale_seconds %v, want the fast window", ev.TimeScaleSeconds)
			}
			top := ev.TopSites
			if len(top) == 0 || top[0].Stack[1].String() != "cache_tensor+0x2a (trainer)" || top[0].KeptAllocations == nil || *top[0].KeptAllocations < 18 {
				t.Fatalf("top_sites %+v, want cache_tensor first with its 20 allocations of the window", top)
			}
			if ev.UntrackedBytes != nil || ev.NVMLUsedBytes != nil {
				t.Errorf("untracked_bytes %v, nvml_used_bytes %v set without NVML", val(ev.UntrackedBytes), val(ev.NVMLUsedBytes))
			}
			if ev.TimeToExhaustionSeconds != nil || ev.HeadroomBytes != nil {
				t.Errorf("exhaustion %v / %v without NVML or a budget", val(ev.TimeToExhaustionSeconds), val(ev.HeadroomBytes))
			}

			// Reported every second while active, then ended once after
			// the leak stopped.
			var ended []report
			for _, r := range leak {
				if !r.f.Active {
					ended = append(ended, r)
				}
			}
			if len(ended) != 1 || ended[0].sec < 70 || leak[len(leak)-1].f.Active {
				t.Fatalf("leak findings ended %d times (last report at %ds), want once after 70s", len(ended), leak[len(leak)-1].sec)
			}
			if !strings.HasPrefix(ended[0].f.Summary, "GPU memory leak ended") {
				t.Errorf("ended summary %q", ended[0].f.Summary)
			}
		})
	}
}

// A steady leak of 10 MiB/s or more is reported within 15 s of its first
// allocation, whatever its allocations' size.
func TestLeakFast(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int    // allocations a second
		size uint64 // each
	}{
		{"10 MiB/s in 1 MiB", 10, mib},
		{"20 MiB/s in 4 MiB", 5, 4 * mib},
		{"90 MiB/s in 6 MiB", 15, 6 * mib},
		{"10 MiB/s in one 10 MiB allocation a second", 1, 10 * mib},
	} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("%s seed %d", tc.name, seed), func(t *testing.T) {
				const start = 40 // after a warm-up with a pool and steady traffic
				leak := leakFinding(t, run(t, New(DefaultConfig()), newSim(seed), 42, 120, func(s *sim, sec int, now time.Time) {
					if sec == 2 {
						s.alloc(poolSite, 4, 256*mib, now)
					}
					steadyTraffic(s, now)
					if sec >= start {
						s.alloc(cacheSite, tc.n, tc.size, now)
					}
				}))
				f := leak[0]
				t.Logf("found %ds after the first allocation: %s", f.sec-start, f.f.Summary)
				if f.sec-start > 15 {
					t.Errorf("found %ds after the first allocation, want within 15s", f.sec-start)
				}
				want := float64(tc.n) * float64(tc.size)
				if got := f.f.Evidence.(model.GPUMemoryLeakEvidence).GrowthBytesPerSecond; math.Abs(got-want) > 0.2*want {
					t.Errorf("growth %.0f B/s, want %.0f ±20%%", got, want)
				}
			})
		}
	}
}

// A slow leak, 1 MiB a minute, is reported within 15 minutes under
// steady traffic, whether it leaks often in small pieces or rarely.
func TestLeakSlow(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every int    // seconds between allocations
		size  uint64 // each
	}{
		{"256 KiB every 15s", 15, 256 << 10},
		{"1 MiB every minute", 60, mib},
	} {
		for seed := range uint64(2) {
			t.Run(fmt.Sprintf("%s seed %d", tc.name, seed), func(t *testing.T) {
				const start = 60
				leak := leakFinding(t, run(t, New(DefaultConfig()), newSim(seed), 42, 20*60, func(s *sim, sec int, now time.Time) {
					if sec == 2 {
						s.alloc(poolSite, 4, 256*mib, now)
					}
					steadyTraffic(s, now)
					if sec >= start && (sec-start)%tc.every == 0 {
						s.alloc(cacheSite, 1, tc.size, now)
					}
				}))
				f := leak[0]
				t.Logf("found %s after the first allocation: %s", time.Duration(f.sec-start)*time.Second, f.f.Summary)
				if f.sec-start > 15*60 {
					t.Errorf("found %ds after the first allocation, want within 15 min", f.sec-start)
				}
				if !strings.Contains(f.f.Summary, "made at cache_tensor+0x2a (trainer)") {
					t.Errorf("summary %q does not name the leaking call site", f.f.Summary)
				}
				if got := f.f.Evidence.(model.GPUMemoryLeakEvidence).GrowthBytesPerSecond; math.Abs(got-mib/60.0) > 0.35*mib/60 {
					t.Errorf("growth %.0f B/s, want 1 MiB/min ±35%%", got)
				}
			})
		}
	}
}

func TestLeakEvidenceWithNVML(t *testing.T) {
	d := New(DefaultConfig())
	s := newSim(1)
	var last []model.Finding
	for sec := 0; sec <= 20; sec++ {
		now := at(sec)
		if sec > 0 {
			s.alloc(cacheSite, 4, 16*mib, now)
		}
		p := s.process(42)
		p.CUDA.NVMLUsedBytes, p.CUDA.HasNVML = p.CUDA.LiveBytes+300*mib, true
		p.CUDA.UntrackedBytes = 300 * mib
		last = d.Observe(now, p)
	}
	if len(last) != 1 || last[0].Kind != model.KindGPUMemoryLeak {
		t.Fatalf("findings at 20s: %v, want one leak", last)
	}
	ev := last[0].Evidence.(model.GPUMemoryLeakEvidence)
	if ev.LiveBytes != 20*64*mib || val(ev.UntrackedBytes) != int64(300*mib) || val(ev.NVMLUsedBytes) != uint64(20*64*mib+300*mib) {
		t.Errorf("live_bytes %v untracked_bytes %v nvml_used_bytes %v", ev.LiveBytes, val(ev.UntrackedBytes), val(ev.NVMLUsedBytes))
	}
	top := ev.TopSites[0]
	// At 20s the fast window holds the allocations made after 10s, 40 of
	// them; those up to 10s are older than 10s: 10 s × 4 × 16 MiB (the last
	// of second 10 is exactly 10s old and not counted).
	if val(top.KeptAllocations) != 40 || val(top.KeptBytes) != uint64(40*16*mib) || top.OldBytes != 39*16*mib {
		t.Errorf("top site %+v: kept %v, %v", top, val(top.KeptAllocations), val(top.KeptBytes))
	}
	if top.Allocations != 80 || top.OldestAgeSeconds != 19.8 {
		t.Errorf("top site %+v", top)
	}
}

func TestLeakQuiet(t *testing.T) {
	cases := []struct {
		name string
		sc   scenario
	}{
		{
			// Balanced: long-lived buffers (~15s) in a ring kept at about
			// 300, filled in the first 8 seconds, then pushed and dropped
			// at the same rate. (A ring that takes longer than the fast
			// window to fill is a leak until it is full.)
			name: "balanced alloc/free",
			sc: func(s *sim, sec int, now time.Time) {
				if sec < 8 {
					s.alloc(ringSite, 40, 16*mib, now)
				} else {
					s.alloc(ringSite, 15+s.rng.IntN(11), 16*mib, now)
				}
				if over := s.count(ringSite) - (300 + s.rng.IntN(21) - 10); over > 0 {
					s.free(ringSite, over)
				}
				steadyTraffic(s, now)
			},
		},
		{
			// Rising load: requests arrive faster and faster and each holds
			// its buffer 5s. Live bytes grow steadily, but nothing outlives
			// a request.
			name: "load ramp",
			sc: func(s *sim, sec int, now time.Time) {
				s.alloc(ringSite, 10+sec/2+s.rng.IntN(3), 16*mib, now)
				s.freeBefore(ringSite, now.Add(-5*time.Second))
			},
		},
		{
			// A caching allocator growing its pool by 64 MiB a second for
			// 8 seconds, then keeping it.
			name: "pool warm-up then flat",
			sc: func(s *sim, sec int, now time.Time) {
				if sec >= 1 && sec <= 8 {
					s.alloc(poolSite, 1, 64*mib, now)
				}
				steadyTraffic(s, now)
			},
		},
		{
			// A warm-up ramp of many allocations, 64 MiB/s in 8 MiB
			// pieces for 10 seconds, that plateaus.
			name: "warm-up ramp plateaus",
			sc: func(s *sim, sec int, now time.Time) {
				if sec >= 1 && sec <= 10 {
					s.alloc(poolSite, 8, 8*mib, now)
				}
				steadyTraffic(s, now)
			},
		},
		{
			// A caching allocator that grows by 20 MiB segments, fast at
			// first and slower as its cache covers more requests, then stops.
			name: "caching allocator grows and stops",
			sc: func(s *sim, sec int, now time.Time) {
				if sec >= 1 && sec <= 9 {
					s.alloc(poolSite, 12-sec, 20*mib, now)
				}
				steadyTraffic(s, now)
			},
		},
		{
			// The pool grows once more, later, when a larger batch arrives.
			name: "pool grows twice",
			sc: func(s *sim, sec int, now time.Time) {
				if sec == 1 || sec == 50 {
					s.alloc(poolSite, 4, 128*mib, now)
				}
				steadyTraffic(s, now)
			},
		},
		{
			// Weights loaded in one go, kept, and replaced a minute later.
			name: "model swap",
			sc: func(s *sim, sec int, now time.Time) {
				switch sec {
				case 2, 62:
					s.freeAll(loadSite)
					s.alloc(loadSite, 20, 100*mib, now)
				}
				steadyTraffic(s, now)
			},
		},
		{
			// Buffers of 1 MiB kept 12 s, longer than the fast window, in
			// a ring of 24 filled in 2 s, and weights loaded in one go
			// beside them and swapped a minute later: the rise is the
			// load's, not the ring's.
			name: "weights loaded beside long-lived buffers",
			sc: func(s *sim, sec int, now time.Time) {
				if sec < 2 {
					s.alloc(ringSite, 12, mib, now)
				} else {
					s.alloc(ringSite, 2, mib, now)
				}
				if over := s.count(ringSite) - 24; over > 0 {
					s.free(ringSite, over)
				}
				if sec == 30 || sec == 90 {
					s.freeAll(loadSite)
					s.alloc(loadSite, 8, 256*mib, now)
				}
				steadyTraffic(s, now)
			},
		},
		{
			// 10 GiB taken every 5 s, held 2 s, freed.
			name: "periodic bursts freed",
			sc: func(s *sim, sec int, now time.Time) {
				switch sec % 5 {
				case 0:
					s.alloc(loadSite, 40, 256*mib, now)
				case 2:
					s.freeAll(loadSite)
				}
				steadyTraffic(s, now)
			},
		},
	}
	for _, tc := range cases {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("%s seed %d", tc.name, seed), func(t *testing.T) {
				// 20 minutes: long enough for the slow scales up to 10 min.
				reps := run(t, New(DefaultConfig()), newSim(seed), 42, 20*60, tc.sc)
				if l := ofKind(reps, model.KindGPUMemoryLeak); len(l) > 0 {
					t.Errorf("flagged as a leak at %ds: %s", l[0].sec, l[0].f.Summary)
				}
			})
		}
	}
}

// A warm-up that keeps growing longer than the fast window is a leak until
// it stops: that is the price of finding a real one within 15 s. The
// finding then ends.
func TestLeakLongWarmUpEnds(t *testing.T) {
	leak := leakFinding(t, run(t, New(DefaultConfig()), newSim(1), 42, 180, func(s *sim, sec int, now time.Time) {
		if sec >= 1 && sec <= 20 {
			s.alloc(poolSite, 8, 8*mib, now)
		}
		steadyTraffic(s, now)
	}))
	last := leak[len(leak)-1]
	if last.f.Active || last.sec > 20+60 {
		t.Errorf("last report at %ds active %v, want ended within a minute of the warm-up's end at 20s", last.sec, last.f.Active)
	}
}

func TestGrowthRate(t *testing.T) {
	for in, want := range map[float64]string{
		20 * mib: "20.0 MiB/s", mib / 60.0: "1.0 MiB/min", -mib / 60.0: "-1.0 MiB/min", mib / 3600.0: "1.0 MiB/h", 0: "0 B/h",
	} {
		if got := growthRate(in); got != want {
			t.Errorf("growthRate(%v) = %q, want %q", in, got, want)
		}
	}
}
