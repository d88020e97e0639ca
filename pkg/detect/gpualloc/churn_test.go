package gpualloc

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// 16 000 cudaMalloc+cudaFree pairs of 1 MiB a second, never more than 1 MiB
// live: 16 GiB pass through every second, but nothing is held. That is
// churn, not a burst.
func TestChurn(t *testing.T) {
	reps := run(t, New(DefaultConfig()), newSim(1), 42, 60, func(s *sim, sec int, now time.Time) {
		steadyTraffic(s, now)
		if sec >= 20 && sec < 40 {
			s.churn(16000, 1, mib, false)
			if sec == 30 {
				// One of the loop's buffers caught live at the poll.
				s.alloc(loopSite, 1, mib, now)
			}
			if sec == 31 {
				s.freeAll(loopSite)
			}
		}
	})
	for _, k := range []string{model.KindGPUAllocBurst, model.KindGPUMemoryLeak} {
		if r := ofKind(reps, k); len(r) > 0 {
			t.Errorf("churn flagged as %s at %ds: %s", k, r[0].sec, r[0].f.Summary)
		}
	}
	churn := ofKind(reps, model.KindGPUAllocChurn)
	if len(findings(churn)) != 1 {
		t.Fatalf("%d churn findings, want 1", len(findings(churn)))
	}
	first, last := churn[0], churn[len(churn)-1]
	t.Logf("flagged at %ds: %s", first.sec, first.f.Summary)
	// Three churning intervals in a row; ended after three calm ones.
	if first.sec != 22 || !first.f.Active || first.f.Severity != model.SeverityWarning {
		t.Errorf("first report at %ds active %v severity %s", first.sec, first.f.Active, first.f.Severity)
	}
	if last.sec != 42 || last.f.Active || !strings.HasPrefix(last.f.Summary, "GPU allocation churn ended: ") {
		t.Errorf("last report at %ds active %v: %s", last.sec, last.f.Active, last.f.Summary)
	}
	ev := first.f.Evidence.(model.GPUAllocChurnEvidence)
	// The step traffic's 30-50 pairs a second come on top.
	if got := ev.PairsPerSecond; got < 16030 || got > 16050 {
		t.Errorf("pairs_per_second %v", got)
	}
	if got := ev.BytesPerSecond; math.Abs(got-16000*mib) > 400*mib {
		t.Errorf("bytes_per_second %v", got)
	}
	if !strings.HasPrefix(first.f.Summary, "GPU allocation churn: 160") || !strings.Contains(first.f.Summary, "each cudaFree synchronizes the device") {
		t.Errorf("summary %q", first.f.Summary)
	}
	if first.f.Stack != nil {
		t.Errorf("a site before any was caught: %q", first.f.Stack)
	}
	// The buffer caught live names the loop from then on.
	at30 := churn[slices.IndexFunc(churn, func(r report) bool { return r.sec == 30 })].f
	if !slices.Contains(testutil.Texts(at30.Stack), "scratch_loop+0x21 (trainer)") || !strings.HasSuffix(at30.Summary, "; caught at scratch_loop+0x21 (trainer)") {
		t.Errorf("at 30s: %s %q", at30.Summary, at30.Stack)
	}
	ev = at30.Evidence.(model.GPUAllocChurnEvidence)
	if top := ev.TopSites; len(top) != 1 || top[0].CaughtLive != 1 {
		t.Errorf("top_sites %+v", top)
	}
	if frees := ev.SynchronizingFrees; frees["cudaFree"] < 10*16000 {
		t.Errorf("synchronizing_frees %v", frees)
	}
}

func TestChurnQuiet(t *testing.T) {
	for _, tc := range []struct {
		name string
		sc   scenario
	}{
		// 32 buffers of 128 KiB taken and freed every 10 ms.
		{"3200 pairs/s", func(s *sim, sec int, now time.Time) { s.churn(3200, 32, 128<<10, false) }},
		// A stream-ordered pool: cudaFreeAsync does not wait for the device.
		{"16000 async pairs/s", func(s *sim, sec int, now time.Time) { s.churn(16000, 1, mib, true) }},
		// Two seconds of churn: not sustained.
		{"short churn", func(s *sim, sec int, now time.Time) {
			if sec == 20 || sec == 21 {
				s.churn(16000, 1, mib, false)
			}
		}},
		// As many allocations a second, kept: no pairs (a leak's business).
		{"allocations not freed", func(s *sim, sec int, now time.Time) {
			if sec >= 20 && sec < 25 {
				s.alloc(cacheSite, 16000, 4<<10, now)
			}
		}},
	} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("%s seed %d", tc.name, seed), func(t *testing.T) {
				reps := run(t, New(DefaultConfig()), newSim(seed), 42, 60, func(s *sim, sec int, now time.Time) {
					steadyTraffic(s, now)
					tc.sc(s, sec, now)
				})
				if c := ofKind(reps, model.KindGPUAllocChurn); len(c) > 0 {
					t.Errorf("flagged as churn at %ds: %s", c[0].sec, c[0].f.Summary)
				}
			})
		}
	}
}

// Pairs while live bytes grow by a good part of what passes through are no
// churn: 512 MiB kept every other second of 1.5 GiB/s allocated leaves no
// three flat intervals in a row.
func TestChurnNeedsFlatLive(t *testing.T) {
	reps := run(t, New(DefaultConfig()), newSim(1), 42, 40, func(s *sim, sec int, now time.Time) {
		steadyTraffic(s, now)
		if sec >= 20 && sec < 30 {
			s.churn(6000, 1, 256<<10, false) // 1.5 GiB/s through
			if sec%2 == 0 {
				s.alloc(loadSite, 1, 512*mib, now) // held: a third of it
			}
		}
	})
	if c := ofKind(reps, model.KindGPUAllocChurn); len(c) > 0 {
		t.Errorf("flagged as churn at %ds: %s", c[0].sec, c[0].f.Summary)
	}
}

// Small buffers churned beside a training step's working set are churn:
// 64 MiB/s pass through next to 240-400 MiB taken and given back each step.
func TestChurnSmallBuffers(t *testing.T) {
	reps := run(t, New(DefaultConfig()), newSim(2), 42, 30, func(s *sim, sec int, now time.Time) {
		steadyTraffic(s, now)
		if sec >= 10 {
			s.churn(16000, 2, 4<<10, false)
		}
	})
	churn := ofKind(reps, model.KindGPUAllocChurn)
	if len(churn) == 0 || churn[0].sec != 12 {
		t.Fatalf("churn reports %v, want the first at 12s", churn)
	}
}
