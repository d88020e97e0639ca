package gpualloc

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

func TestBurstFound(t *testing.T) {
	// Steady traffic, then 3 GiB of weights loaded within one second at
	// 20s, held 2s, freed; the same again at 26s, soon after the first ended.
	reps := run(t, New(DefaultConfig()), newSim(3), 42, 60, func(s *sim, sec int, now time.Time) {
		steadyTraffic(s, now)
		switch sec {
		case 20, 26:
			s.alloc(loadSite, 12, 256*mib, now)
		case 22, 28:
			s.freeAll(loadSite)
		}
	})
	bursts := ofKind(reps, model.KindGPUAllocBurst)
	if len(bursts) == 0 {
		t.Fatal("burst not found")
	}
	first := bursts[0]
	f := first.f
	t.Logf("flagged at %ds: %s", first.sec, f.Summary)
	if first.sec != 20 || !f.Active || f.Severity != model.SeverityWarning {
		t.Fatalf("first burst report at %ds active %v severity %q, want at 20s, active, warning", first.sec, f.Active, f.Severity)
	}
	ev := burstEv(f)
	// Memory held, not bytes passed through: the step traffic of the
	// second comes and goes below the 3 GiB.
	if ev.BurstBytes != 3*gib || ev.PeakLiveBytes != 3*gib || ev.LiveBytes != 3*gib {
		t.Errorf("burst_bytes %v peak_live_bytes %v live_bytes %v, want 3 GiB", ev.BurstBytes, ev.PeakLiveBytes, ev.LiveBytes)
	}
	if inWindow := ev.BytesInWindow; inWindow < 3*gib+240*mib || inWindow > 3*gib+400*mib {
		t.Errorf("bytes_in_window %d, want 3 GiB plus one step", inWindow)
	}
	if calls := ev.CallsInWindow; calls < 12+30 || calls > 12+50 {
		t.Errorf("calls_in_window %d", calls)
	}
	// Each second's step takes 240-400 MiB and gives it back: that is the
	// baseline rise.
	if mean := ev.BaselineBytesMean; mean < 240*mib || mean > 400*mib {
		t.Errorf("baseline_bytes_mean %.0f, want the step traffic", mean)
	}
	if sd := ev.BaselineBytesStddev; sd <= 0 || sd > 200*mib {
		t.Errorf("baseline_bytes_stddev %.0f", sd)
	}
	if ev.Occurrences != 1 || ev.PeriodSeconds != nil {
		t.Errorf("occurrences %v period %v, want one burst", ev.Occurrences, val(ev.PeriodSeconds))
	}
	top := ev.TopSites
	if len(top) != 1 || top[0].Bytes != 3*gib || top[0].Share != 0.885 {
		t.Errorf("top_sites %+v, want load_weights with 3 GiB", top)
	}
	if !slices.ContainsFunc(f.Stack, func(fr model.Frame) bool { return fr.Function == "load_weights" }) {
		t.Errorf("stack %q does not name load_weights", f.Stack)
	}
	if want := "GPU allocation burst: 3.0 GiB taken and held at once (live peak 3.0 GiB), baseline "; !strings.HasPrefix(f.Summary, want) ||
		!strings.HasSuffix(f.Summary, "; most at load_weights+0x19 (trainer): 88 % of the 3.4 GiB allocated then") {
		t.Errorf("summary %q", f.Summary)
	}

	// One finding: active while held, ended after QuietIntervals calm
	// ones, and reopened by the second load from the same site, which
	// then stays open for two periods after it.
	fs := findings(bursts)
	if len(fs) != 1 {
		t.Fatalf("%d burst findings, want 1", len(fs))
	}
	var active []int
	for _, r := range bursts {
		if r.f.Active {
			active = append(active, r.sec)
		}
	}
	if want := []int{20, 21, 22, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37}; !slices.Equal(active, want) {
		t.Errorf("active at %v, want %v", active, want)
	}
	last := bursts[len(bursts)-1]
	if last.sec != 38 || last.f.Active || !strings.HasPrefix(last.f.Summary, "GPU allocation burst ended: ") {
		t.Errorf("last report at %ds active %v: %s", last.sec, last.f.Active, last.f.Summary)
	}
	if ev := burstEv(last.f); ev.Occurrences != 2 || val(ev.PeriodSeconds) != 6.0 || ev.LargestBurstBytes != 3*gib {
		t.Errorf("after two bursts: %+v, period %v", ev, val(ev.PeriodSeconds))
	}
	if !strings.Contains(last.f.Summary, "; 2 times, every ~6s, largest 3.0 GiB") {
		t.Errorf("summary %q", last.f.Summary)
	}
	if l := ofKind(reps, model.KindGPUMemoryLeak); len(l) > 0 {
		t.Errorf("burst flagged as a leak: %s", l[0].f.Summary)
	}
}

// 10 GiB taken and freed every 5 s by three processes: one finding each,
// with the count, the period and the largest burst, open while they recur.
func TestBurstRecurring(t *testing.T) {
	d := New(DefaultConfig())
	var reps []report
	for i, pid := range []int{41, 42, 43} {
		reps = append(reps, run(t, d, newSim(uint64(i)), pid, 90, func(s *sim, sec int, now time.Time) {
			steadyTraffic(s, now)
			if sec < 10+i || sec > 61 {
				return
			}
			switch (sec - 10 - i) % 5 {
			case 0:
				s.alloc(loadSite, 40, 256*mib, now)
			case 1:
				s.freeAll(loadSite)
			}
		})...)
	}
	bursts := ofKind(reps, model.KindGPUAllocBurst)
	fs := findings(bursts)
	if len(fs) != 3 {
		t.Fatalf("%d burst findings, want one per process", len(fs))
	}
	for _, f := range fs {
		last := f[len(f)-1].f
		t.Logf("pid %d: %s", last.PID, last.Summary)
		ev := burstEv(last)
		if ev.Occurrences < 10 || val(ev.PeriodSeconds) != 5.0 || ev.LargestBurstBytes != 10*gib {
			t.Errorf("pid %d: occurrences %v period %v largest %v", last.PID, ev.Occurrences, val(ev.PeriodSeconds), ev.LargestBurstBytes)
		}
		// The first burst's finding ends like a one-off's, QuietIntervals
		// after it, and the second reopens it; from then on it is open
		// until two periods after the last.
		second := slices.IndexFunc(f, func(r report) bool { return burstEv(r.f).Occurrences == 2 })
		if second < 0 {
			t.Fatalf("pid %d: no second burst", last.PID)
		}
		for _, r := range f[second : len(f)-1] {
			if !r.f.Active {
				t.Errorf("pid %d: ended at %ds while the bursts recur", last.PID, r.sec)
			}
		}
		if end := f[len(f)-1].sec; last.Active || end < 60 || end > 75 {
			t.Errorf("pid %d: last report at %ds active %v, want ended within two periods of the last burst", last.PID, end, last.Active)
		}
	}
}

// A burst markedly larger than the one its finding reported (1.5×) is a
// new finding; one a little larger joins it.
func TestBurstRegrow(t *testing.T) {
	sizes := map[int]int{20: 8, 30: 8, 40: 10, 50: 16, 60: 16} // × 256 MiB
	reps := run(t, New(DefaultConfig()), newSim(2), 42, 80, func(s *sim, sec int, now time.Time) {
		steadyTraffic(s, now)
		if n, ok := sizes[sec]; ok {
			s.alloc(loadSite, n, 256*mib, now)
		}
		if _, ok := sizes[sec-2]; ok {
			s.freeAll(loadSite)
		}
	})
	fs := findings(ofKind(reps, model.KindGPUAllocBurst))
	if len(fs) != 2 || fs[0][0].sec != 20 || fs[1][0].sec != 50 {
		t.Fatalf("%d burst findings, want one at 20s and one at 50s", len(fs))
	}
	// The first ended when the larger burst came, and was not reported after.
	old := fs[0][len(fs[0])-1]
	if ev := burstEv(old.f); old.sec != 50 || old.f.Active || ev.Occurrences != 3 || ev.LargestBurstBytes != 2560*mib {
		t.Errorf("first finding's last report at %ds: %v %+v", old.sec, old.f.Active, ev)
	}
	if ev := burstEv(fs[1][len(fs[1])-1].f); ev.Occurrences != 2 || ev.BurstBytes != 4*gib {
		t.Errorf("second finding %+v", ev)
	}
}

// Bursts from two call sites are two findings, each with its own count.
func TestBurstSites(t *testing.T) {
	reps := run(t, New(DefaultConfig()), newSim(4), 42, 90, func(s *sim, sec int, now time.Time) {
		steadyTraffic(s, now)
		if sec < 20 || sec > 62 {
			return
		}
		site := loadSite
		if sec%12 >= 6 {
			site = poolSite
		}
		switch sec % 6 {
		case 0:
			s.alloc(site, 8, 256*mib, now)
		case 1:
			s.freeAll(site)
		}
	})
	fs := findings(ofKind(reps, model.KindGPUAllocBurst))
	if len(fs) != 2 {
		t.Fatalf("%d burst findings, want one per site", len(fs))
	}
	for i, want := range []int{4, 3} { // load_weights at 24, 36, 48, 60; pool_reserve at 30, 42, 54
		last := fs[i][len(fs[i])-1].f
		if ev := burstEv(last); ev.Occurrences != want || val(ev.PeriodSeconds) != 12.0 {
			t.Errorf("%s: %+v, period %v", last.Summary, ev, val(ev.PeriodSeconds))
		}
	}
	if !strings.Contains(fs[0][0].f.Summary, "load_weights") || !strings.Contains(fs[1][0].f.Summary, "pool_reserve") {
		t.Errorf("summaries %q, %q", fs[0][0].f.Summary, fs[1][0].f.Summary)
	}
}

// Memory taken over two intervals in a row is one burst of their sum.
func TestBurstAcrossPolls(t *testing.T) {
	reps := run(t, New(DefaultConfig()), newSim(5), 42, 40, func(s *sim, sec int, now time.Time) {
		steadyTraffic(s, now)
		switch sec {
		case 20, 21:
			s.alloc(loadSite, 6, 256*mib, now)
		case 24:
			s.freeAll(loadSite)
		}
	})
	bursts := ofKind(reps, model.KindGPUAllocBurst)
	if len(findings(bursts)) != 1 || bursts[0].sec != 20 {
		t.Fatalf("burst reports %v", bursts)
	}
	ev := burstEv(bursts[1].f)
	if ev.Occurrences != 1 || ev.BurstBytes != 3*gib || ev.LargestBurstBytes != 3*gib {
		t.Errorf("at 21s: %+v", ev)
	}
}

// A burst whose allocations were freed before the poll shows in the peak
// and has no site; a later one caught live names it, and both are one
// finding.
func TestBurstSiteCaughtLater(t *testing.T) {
	reps := run(t, New(DefaultConfig()), newSim(6), 42, 40, func(s *sim, sec int, now time.Time) {
		steadyTraffic(s, now)
		switch sec {
		case 20:
			s.alloc(loadSite, 8, 256*mib, now)
			s.freeAll(loadSite)
		case 25:
			s.alloc(loadSite, 8, 256*mib, now)
		case 26:
			s.freeAll(loadSite)
		}
	})
	bursts := ofKind(reps, model.KindGPUAllocBurst)
	if fs := findings(bursts); len(fs) != 1 {
		t.Fatalf("%d burst findings, want 1", len(fs))
	}
	if bursts[0].f.Stack != nil || strings.Contains(bursts[0].f.Summary, "most at") || burstEv(bursts[0].f).BurstBytes != 2*gib {
		t.Errorf("at 20s: %s %v", bursts[0].f.Summary, bursts[0].f.Stack)
	}
	last := bursts[len(bursts)-1].f
	if burstEv(last).Occurrences != 2 || !strings.Contains(last.Summary, "most at load_weights+0x19 (trainer)") {
		t.Errorf("last: %s", last.Summary)
	}
}

func TestBurstForgottenAfterRecurWithin(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RecurWithin = 30 * time.Second
	reps := run(t, New(cfg), newSim(7), 42, 120, func(s *sim, sec int, now time.Time) {
		steadyTraffic(s, now)
		switch sec {
		case 20, 45, 100: // 25 s apart, then 55 s
			s.alloc(loadSite, 8, 256*mib, now)
		case 21, 46, 101:
			s.freeAll(loadSite)
		}
	})
	fs := findings(ofKind(reps, model.KindGPUAllocBurst))
	var got []string
	for _, f := range fs {
		got = append(got, fmt.Sprintf("%ds×%v", f[0].sec, burstEv(f[len(f)-1].f).Occurrences))
	}
	if want := []string{"20s×2", "100s×1"}; !slices.Equal(got, want) {
		t.Errorf("findings %v, want %v", got, want)
	}
}

// A burst's severity follows what its memory does: 3 GiB loaded 20 s
// after watching began and kept is a start-up step (info); released again,
// a warning; kept but loaded after the start-up window, a warning; near
// the budget or a device's memory, critical whatever it does.
func TestBurstSeverity(t *testing.T) {
	device := func() []model.GPU {
		return []model.GPU{{Index: 0, MemoryTotal: 3*gib + 256*mib, MemoryUsed: 3 * gib, MemoryUsedMax: 3*gib + 100*mib, Processes: map[int]uint64{42: 3 * gib}}}
	}
	for _, tc := range []struct {
		name     string
		release  bool
		cfg      func(*Config)
		severity string
		says     string
	}{
		{"held at start-up", false, func(*Config) {}, model.SeverityInfo, "; still held: a start-up step"},
		{"released", true, func(*Config) {}, model.SeverityWarning, "; most at load_weights"},
		{"held after start-up", false, func(c *Config) { c.StartupWindow = 10 * time.Second }, model.SeverityWarning, "; most at load_weights"},
		{"held, near the budget", false, func(c *Config) { c.MemoryBudget = 3*gib + 256*mib }, model.SeverityCritical, "; live peak within 10 % of the 3.2 GiB budget"},
		{"released, near the device's memory", true, func(c *Config) { c.Devices = device }, model.SeverityCritical, "; live peak GPU 0 within 10 % of its 3.2 GiB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			tc.cfg(&cfg)
			s := newSim(3)
			s.started = at(0)
			reps := run(t, New(cfg), s, 42, 40, func(s *sim, sec int, now time.Time) {
				steadyTraffic(s, now)
				switch {
				case sec == 20:
					s.alloc(loadSite, 12, 256*mib, now)
				case sec == 22 && tc.release:
					s.freeAll(loadSite)
				}
			})
			bursts := ofKind(reps, model.KindGPUAllocBurst)
			if len(bursts) == 0 {
				t.Fatal("burst not found")
			}
			last := bursts[len(bursts)-1].f
			if last.Severity != tc.severity || !strings.Contains(last.Summary, tc.says) {
				t.Errorf("severity %q, summary %q; want %q, saying %q", last.Severity, last.Summary, tc.severity, tc.says)
			}
		})
	}
}
