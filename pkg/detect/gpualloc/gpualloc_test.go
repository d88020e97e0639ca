package gpualloc

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
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

const (
	mib = 1 << 20
	gib = 1 << 30
)

// Stack ids of the simulated allocation sites; the innermost frame is the
// CUDA library, as the hooks see it.
const (
	stepSite  int64 = 3 // per-step activations, freed within the step
	poolSite  int64 = 4 // caching allocator reserving its pool
	cacheSite int64 = 5 // the leak: tensors cached and never released
	loadSite  int64 = 7 // weights loaded in one go
	ringSite  int64 = 9 // long-lived buffers in a ring
)

var stacks = map[int64][]string{
	stepSite:  {"cudaMalloc+0x10 (libcudart.so.12)", "train_step+0x31 (trainer)", "main+0x40 (trainer)"},
	poolSite:  {"cuMemAlloc_v2+0x8 (libcuda.so.1)", "pool_reserve+0x12 (trainer)", "main+0x22 (trainer)"},
	cacheSite: {"cudaMalloc+0x10 (libcudart.so.12)", "cache_tensor+0x2a (trainer)", "train_step+0x55 (trainer)", "main+0x40 (trainer)"},
	loadSite:  {"cudaMalloc+0x10 (libcudart.so.12)", "load_weights+0x19 (trainer)", "main+0x60 (trainer)"},
	ringSite:  {"cudaMalloc+0x10 (libcudart.so.12)", "ring_push+0x44 (trainer)", "main+0x40 (trainer)"},
}

type alloc struct {
	site int64
	size uint64
	at   time.Time
}

// sim is a process whose device allocations a scenario makes and frees; it
// is sampled into the form the CUDA source produces.
type sim struct {
	live                     []alloc // oldest first
	allocBytes, freed, calls uint64
	hostBytes, hostCalls     uint64 // pinned host allocations (cudaMallocHost), never live on the device
	failures                 []model.CUDAFailure
	rng                      *rand.Rand
}

func newSim(seed uint64) *sim { return &sim{rng: rand.New(rand.NewPCG(seed, 7))} }

// alloc makes n allocations of size at site, spread over the second that
// ends at now.
func (s *sim) alloc(site int64, n int, size uint64, now time.Time) {
	for i := range n {
		s.live = append(s.live, alloc{site, size, now.Add(-time.Second + time.Duration(i+1)*time.Second/time.Duration(n))})
		s.allocBytes += size
		s.calls++
	}
}

// allocHost makes n pinned host allocations of size: counted by the source
// under cudaMallocHost and in HostAllocBytes, but neither live device bytes
// nor a site.
func (s *sim) allocHost(n int, size uint64) {
	s.hostBytes += uint64(n) * size
	s.hostCalls += uint64(n)
}

// free releases up to n of the oldest allocations at site.
func (s *sim) free(site int64, n int) {
	s.live = slices.DeleteFunc(s.live, func(a alloc) bool {
		if a.site != site || n == 0 {
			return false
		}
		n--
		s.freed += a.size
		return true
	})
}

// freeBefore releases every allocation at site made before cutoff.
func (s *sim) freeBefore(site int64, cutoff time.Time) {
	s.live = slices.DeleteFunc(s.live, func(a alloc) bool {
		if a.site != site || !a.at.Before(cutoff) {
			return false
		}
		s.freed += a.size
		return true
	})
}

func (s *sim) count(site int64) int {
	n := 0
	for _, a := range s.live {
		if a.site == site {
			n++
		}
	}
	return n
}

func (s *sim) freeAll(site int64) { s.free(site, s.count(site)) }

// step allocates and frees the same amount within one second: a training
// step's activations, n of 8 MiB each.
func (s *sim) step(n int, now time.Time) {
	s.alloc(stepSite, n, 8*mib, now)
	s.freeAll(stepSite)
}

func (s *sim) process(pid int) *model.Process {
	p := &model.Process{PID: pid, Comm: "trainer", CUDA: model.CUDAStats{
		LiveAllocs: len(s.live),
		AllocBytes: map[string]uint64{"cudaMalloc": s.allocBytes},
		FreeBytes:  map[string]uint64{"cudaFree": s.freed},
		AllocCalls: map[string]uint64{"cudaMalloc": s.calls},
		Failures:   slices.Clone(s.failures),
		Libraries:  []string{"libcudart.so.12"},
	}}
	bySite := map[int64]*model.CUDASite{}
	for _, a := range s.live {
		p.CUDA.LiveBytes += a.size
		cs := bySite[a.site]
		if cs == nil {
			cs = &model.CUDASite{StackID: a.site, Stack: stacks[a.site]}
			bySite[a.site] = cs
		}
		cs.Bytes += a.size
		cs.Allocs = append(cs.Allocs, a.at)
	}
	for _, id := range slices.Sorted(maps.Keys(bySite)) {
		p.CUDA.Sites = append(p.CUDA.Sites, *bySite[id])
	}
	slices.SortStableFunc(p.CUDA.Sites, func(a, b model.CUDASite) int { return int(b.Bytes>>20) - int(a.Bytes>>20) })
	if s.hostCalls > 0 {
		p.CUDA.AllocBytes["cudaMallocHost"] = s.hostBytes
		p.CUDA.AllocCalls["cudaMallocHost"] = s.hostCalls
		p.CUDA.HostAllocBytes = s.hostBytes
	}
	return p
}

// scenario changes the simulated process during second sec, which ends at now.
type scenario func(s *sim, sec int, now time.Time)

type report struct {
	sec int
	f   model.Finding
}

// run samples s once a second from t0 (sec 0) to sec secs, after applying
// sc, and collects what the detector returns.
func run(t *testing.T, d *Detector, s *sim, pid, secs int, sc scenario) []report {
	t.Helper()
	var out []report
	for sec := 0; sec <= secs; sec++ {
		now := t0.Add(time.Duration(sec) * time.Second)
		sc(s, sec, now)
		for _, f := range d.Observe(now, s.process(pid)) {
			if f.PID != pid || f.Comm != "trainer" {
				t.Fatalf("sec %d: finding for pid %d comm %q", sec, f.PID, f.Comm)
			}
			out = append(out, report{sec, f})
		}
	}
	return out
}

func ofKind(reps []report, kind string) []report {
	var out []report
	for _, r := range reps {
		if r.f.Kind == kind {
			out = append(out, r)
		}
	}
	return out
}

// steadyTraffic is a training loop: 30-50 activations of 8 MiB (240-400
// MiB) a second, freed within the second.
func steadyTraffic(s *sim, now time.Time) { s.step(30+s.rng.IntN(21), now) }

func TestLeakFound(t *testing.T) {
	for seed := range uint64(5) {
		t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
			// A 2 GiB pool at start, steady step traffic, and two 4 MiB
			// tensors a second cached and never freed until second 70.
			reps := run(t, New(DefaultConfig()), newSim(seed), 42, 160, func(s *sim, sec int, now time.Time) {
				if sec == 1 {
					s.alloc(poolSite, 8, 256*mib, now)
				}
				steadyTraffic(s, now)
				if sec >= 1 && sec <= 70 {
					s.alloc(cacheSite, 2, 4*mib, now)
				}
			})
			if b := ofKind(reps, model.KindGPUAllocBurst); len(b) > 0 {
				t.Errorf("steady traffic flagged as a burst at %ds: %s", b[0].sec, b[0].f.Summary)
			}
			leaks := ofKind(reps, model.KindGPUMemoryLeak)
			if len(leaks) == 0 {
				t.Fatal("leak not found")
			}
			first := leaks[0]
			f := first.f
			t.Logf("flagged at %ds: %s", first.sec, f.Summary)
			// A full 30s window is needed, and old bytes only start piling
			// up 10s into the leak.
			if first.sec < 30 || first.sec > 45 {
				t.Errorf("flagged at %ds, want between 30s and 45s", first.sec)
			}
			if !f.Active || f.Severity != model.SeverityWarning || !f.FirstSeen.Equal(t0.Add(time.Duration(first.sec)*time.Second)) {
				t.Errorf("first finding: active %v severity %q first_seen %v", f.Active, f.Severity, f.FirstSeen)
			}
			if !slices.ContainsFunc(f.Stack, func(fr string) bool { return strings.Contains(fr, "cache_tensor") }) {
				t.Errorf("stack %q does not name cache_tensor", f.Stack)
			}
			if !strings.Contains(f.Summary, "allocated at cache_tensor+0x2a (trainer)") {
				t.Errorf("summary %q does not name the leaking call site", f.Summary)
			}
			if got := f.Evidence["growth_bytes_per_second"].(float64); math.Abs(got-8*mib) > 0.2*8*mib {
				t.Errorf("growth %.0f B/s, want 8 MiB/s ±20%%", got)
			}
			top := f.Evidence["top_sites"].([]map[string]any)
			if len(top) == 0 || top[0]["stack"].([]string)[1] != "cache_tensor+0x2a (trainer)" {
				t.Fatalf("top_sites %v, want cache_tensor first", top)
			}
			if f.Evidence["old_bytes_at_top_site"].(int64) <= 0 {
				t.Errorf("old_bytes_at_top_site %v", f.Evidence["old_bytes_at_top_site"])
			}
			if _, ok := f.Evidence["untracked_bytes"]; ok {
				t.Error("untracked_bytes set without NVML")
			}

			// Reported every second while active, then ended once after
			// the leak stopped, and not raised again.
			var ended []report
			for _, r := range leaks {
				if !r.f.FirstSeen.Equal(f.FirstSeen) {
					t.Fatalf("a second leak finding at %ds: %s", r.sec, r.f.Summary)
				}
				if !r.f.Active {
					ended = append(ended, r)
				}
			}
			if len(ended) != 1 || ended[0].sec < 70 || leaks[len(leaks)-1].f.Active {
				t.Fatalf("leak findings ended %d times (last report at %ds), want once after 70s", len(ended), leaks[len(leaks)-1].sec)
			}
			if !strings.HasPrefix(ended[0].f.Summary, "GPU memory leak ended") {
				t.Errorf("ended summary %q", ended[0].f.Summary)
			}
		})
	}
}

func TestLeakEvidenceWithNVML(t *testing.T) {
	d := New(DefaultConfig())
	s := newSim(1)
	var last []model.Finding
	for sec := 0; sec <= 40; sec++ {
		now := t0.Add(time.Duration(sec) * time.Second)
		if sec > 0 {
			s.alloc(cacheSite, 4, 16*mib, now)
		}
		p := s.process(42)
		p.CUDA.NVMLUsedBytes, p.CUDA.HasNVML = p.CUDA.LiveBytes+300*mib, true
		p.CUDA.UntrackedBytes = 300 * mib
		last = d.Observe(now, p)
	}
	if len(last) != 1 || last[0].Kind != model.KindGPUMemoryLeak {
		t.Fatalf("findings at 40s: %v, want one leak", last)
	}
	ev := last[0].Evidence
	if ev["live_bytes"] != uint64(40*64*mib) || ev["untracked_bytes"] != int64(300*mib) {
		t.Errorf("live_bytes %v untracked_bytes %v", ev["live_bytes"], ev["untracked_bytes"])
	}
	top := ev["top_sites"].([]map[string]any)[0]
	// At 40s, allocations made up to 30s are older than 10s: 30 s × 4 × 16 MiB
	// (the last of second 30 is exactly 10s old and not counted).
	if got, want := top["old_bytes"], int64(119*16*mib); got != want {
		t.Errorf("top site old_bytes %v, want %v", got, want)
	}
	if top["allocations"] != 160 || top["oldest_age_seconds"] != 39.8 {
		t.Errorf("top site %v", top)
	}
}

func TestLeakQuiet(t *testing.T) {
	cases := []struct {
		name string
		sc   scenario
	}{
		{
			// Balanced: long-lived buffers (~15s) in a ring kept at about
			// 300, pushed and dropped at the same rate.
			name: "balanced alloc/free",
			sc: func(s *sim, sec int, now time.Time) {
				s.alloc(ringSite, 15+s.rng.IntN(11), 16*mib, now)
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
	}
	for _, tc := range cases {
		for seed := range uint64(5) {
			t.Run(fmt.Sprintf("%s seed %d", tc.name, seed), func(t *testing.T) {
				reps := run(t, New(DefaultConfig()), newSim(seed), 42, 180, tc.sc)
				if l := ofKind(reps, model.KindGPUMemoryLeak); len(l) > 0 {
					t.Errorf("flagged as a leak at %ds: %s", l[0].sec, l[0].f.Summary)
				}
			})
		}
	}
}

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
	ev := f.Evidence
	inWindow := ev["bytes_in_window"].(uint64)
	if inWindow < 3*gib || inWindow > 3*gib+400*mib {
		t.Errorf("bytes_in_window %d, want 3 GiB plus one step", inWindow)
	}
	if calls := ev["calls_in_window"].(uint64); calls < 12+30 || calls > 12+50 {
		t.Errorf("calls_in_window %d", calls)
	}
	if mean := ev["baseline_bytes_mean"].(float64); mean < 240*mib || mean > 400*mib {
		t.Errorf("baseline_bytes_mean %.0f, want the step traffic", mean)
	}
	if sd := ev["baseline_bytes_stddev"].(float64); sd <= 0 || sd > 200*mib {
		t.Errorf("baseline_bytes_stddev %.0f", sd)
	}
	if ev["live_bytes"] != uint64(3*gib) {
		t.Errorf("live_bytes %v, want 3 GiB", ev["live_bytes"])
	}
	top := ev["top_sites"].([]map[string]any)
	if len(top) != 1 || top[0]["bytes"] != uint64(3*gib) {
		t.Errorf("top_sites %v, want load_weights with 3 GiB", top)
	}
	if !slices.ContainsFunc(f.Stack, func(fr string) bool { return strings.Contains(fr, "load_weights") }) {
		t.Errorf("stack %q does not name load_weights", f.Stack)
	}
	if !strings.Contains(f.Summary, human(float64(inWindow))+" in ") || !strings.Contains(f.Summary, "most at load_weights+0x19 (trainer)") {
		t.Errorf("summary %q", f.Summary)
	}

	// Active for the burst interval and until QuietIntervals calm ones
	// passed, then ended; the second load, judged against a baseline that
	// did not learn the first, is a new finding.
	var findings []time.Time
	for _, r := range bursts {
		if !slices.ContainsFunc(findings, r.f.FirstSeen.Equal) {
			findings = append(findings, r.f.FirstSeen)
		}
	}
	if len(findings) != 2 || !findings[1].Equal(t0.Add(26*time.Second)) {
		t.Fatalf("burst findings first seen at %v, want 20s and 26s", findings)
	}
	var endedAt []int
	for _, r := range bursts {
		if !r.f.Active {
			endedAt = append(endedAt, r.sec)
		}
	}
	if !slices.Equal(endedAt, []int{23, 29}) {
		t.Errorf("bursts ended at %v, want [23 29]", endedAt)
	}
	if l := ofKind(reps, model.KindGPUMemoryLeak); len(l) > 0 {
		t.Errorf("burst flagged as a leak: %s", l[0].f.Summary)
	}
}

// Pinned host memory is not on the GPU: 3 GiB of cudaMallocHost in one
// second, or 6 GiB right after attach, is no device burst; the same bytes on
// the device are.
func TestBurstHostMemory(t *testing.T) {
	for _, tc := range []struct {
		name string
		sec  int
	}{{"after warm-up", 20}, {"right after attach", 0}} {
		bytes := uint64(3 * gib)
		if tc.sec == 0 {
			bytes = 6 * gib // over BurstCeiling
		}
		n := int(bytes / (256 * mib))
		for _, host := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s host %v", tc.name, host), func(t *testing.T) {
				reps := run(t, New(DefaultConfig()), newSim(3), 42, 40, func(s *sim, sec int, now time.Time) {
					steadyTraffic(s, now)
					if sec == tc.sec {
						if host {
							s.allocHost(n, 256*mib)
						} else {
							s.alloc(loadSite, n, 256*mib, now)
						}
					}
				})
				bursts := ofKind(reps, model.KindGPUAllocBurst)
				if host {
					if len(bursts) > 0 {
						t.Errorf("pinned host memory flagged as a burst at %ds: %s", bursts[0].sec, bursts[0].f.Summary)
					}
					return
				}
				if len(bursts) == 0 || bursts[0].sec != tc.sec {
					t.Fatalf("device burst not flagged at %ds: %v", tc.sec, bursts)
				}
				if got := bursts[0].f.Evidence["bytes_in_window"].(uint64); got < bytes {
					t.Errorf("bytes_in_window %d, want at least %d", got, bytes)
				}
			})
		}
	}
}

func TestBurstWarmUp(t *testing.T) {
	cases := []struct {
		name  string
		sec   int
		bytes uint64
		want  bool
	}{
		{"1 GiB loaded right after attach", 1, gib, false},
		{"3 GiB loaded during warm-up", 3, 3 * gib, false},
		{"6 GiB loaded during warm-up", 3, 6 * gib, true},
		{"6 GiB in the first sample", 0, 6 * gib, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reps := run(t, New(DefaultConfig()), newSim(1), 42, 20, func(s *sim, sec int, now time.Time) {
				if sec == tc.sec {
					s.alloc(loadSite, int(tc.bytes/(256*mib)), 256*mib, now)
				}
				steadyTraffic(s, now)
			})
			bursts := ofKind(reps, model.KindGPUAllocBurst)
			if got := len(bursts) > 0; got != tc.want {
				t.Fatalf("burst found %v, want %v (%v)", got, tc.want, bursts)
			}
			if tc.want && bursts[0].sec != tc.sec {
				t.Errorf("flagged at %ds, want %ds", bursts[0].sec, tc.sec)
			}
		})
	}
}

func TestBurstQuiet(t *testing.T) {
	cases := []struct {
		name string
		sc   scenario
	}{
		{"steady traffic", func(s *sim, sec int, now time.Time) { steadyTraffic(s, now) }},
		{
			// Heavy traffic (1.2-2.8 GiB a second) with wide noise: far
			// above the floor, never far above its own baseline.
			name: "heavy noisy traffic",
			sc: func(s *sim, sec int, now time.Time) {
				s.step(150+s.rng.IntN(201), now)
			},
		},
		{
			// An idle process that now and then allocates less than the floor.
			name: "idle with small allocations",
			sc: func(s *sim, sec int, now time.Time) {
				if sec%17 == 0 {
					s.step(25, now) // 200 MiB
				}
			},
		},
		{
			// Traffic that doubles over a minute: the baseline follows it.
			name: "slowly rising traffic",
			sc: func(s *sim, sec int, now time.Time) {
				s.step(40+sec*40/60+s.rng.IntN(5), now)
			},
		},
	}
	for _, tc := range cases {
		for seed := range uint64(10) {
			t.Run(fmt.Sprintf("%s seed %d", tc.name, seed), func(t *testing.T) {
				reps := run(t, New(DefaultConfig()), newSim(seed), 42, 300, tc.sc)
				if b := ofKind(reps, model.KindGPUAllocBurst); len(b) > 0 {
					t.Errorf("flagged as a burst at %ds: %s", b[0].sec, b[0].f.Summary)
				}
			})
		}
	}
}

func TestBurstUnevenIntervals(t *testing.T) {
	// A sample that comes 2.5s late holds 2.5 intervals of steady traffic:
	// judged by rate, that is no burst.
	d := New(DefaultConfig())
	s := newSim(1)
	now := t0
	for i := range 40 {
		gap := time.Second
		if i == 30 {
			gap = 2500 * time.Millisecond
			s.step(100, now.Add(gap-time.Second)) // the 1.5 seconds before the last
		}
		now = now.Add(gap)
		s.step(40, now)
		for _, f := range d.Observe(now, s.process(42)) {
			t.Errorf("%s at sample %d: %s", f.Kind, i, f.Summary)
		}
	}
}

func TestFailures(t *testing.T) {
	d := New(DefaultConfig())
	s := newSim(1)
	oomStack := []string{"cudaMalloc+0x10 (libcudart.so.12)", "alloc_batch+0x3c (trainer)", "main+0x40 (trainer)"}
	devStack := []string{"cudaMalloc+0x10 (libcudart.so.12)", "init_device+0x11 (trainer)", "main+0x12 (trainer)"}
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	oom := func(sec int, size uint64) model.CUDAFailure {
		return model.CUDAFailure{Time: at(sec).Add(-time.Second / 2), API: "cudaMalloc", Size: size, Code: 2, Error: "cudaErrorMemoryAllocation", Stack: oomStack}
	}
	noDev := model.CUDAFailure{Time: at(1).Add(-time.Second / 2), API: "cudaMalloc", Size: 64 * mib, Code: 100, Error: "cudaErrorNoDevice", Stack: devStack}

	observe := func(sec int) []model.Finding {
		return d.Observe(at(sec), s.process(42))
	}
	if fs := observe(0); len(fs) != 0 {
		t.Fatalf("findings without failures: %v", fs)
	}
	// Two different failures with the same timestamp, and an OOM.
	s.failures = append(s.failures, noDev, oom(1, 8*gib))
	s.failures[1].Time = noDev.Time
	fs := observe(1)
	if len(fs) != 2 {
		t.Fatalf("findings at 1s: %v, want two", fs)
	}
	byErr := map[string]model.Finding{}
	for _, f := range fs {
		if f.Kind != model.KindGPUAllocFailure || !f.Active {
			t.Fatalf("finding %+v", f)
		}
		byErr[f.Evidence["error"].(string)] = f
	}
	nd, om := byErr["cudaErrorNoDevice"], byErr["cudaErrorMemoryAllocation"]
	if nd.Severity != model.SeverityWarning || om.Severity != model.SeverityCritical {
		t.Errorf("severities: no device %q, oom %q; want warning, critical", nd.Severity, om.Severity)
	}
	if nd.FirstSeen.Equal(om.FirstSeen) {
		t.Error("two failure findings share FirstSeen: the pipeline would merge them")
	}
	if want := "GPU allocation failed: cudaMalloc returned cudaErrorNoDevice for 64.0 MiB at init_device+0x11 (trainer)"; nd.Summary != want {
		t.Errorf("summary\n %q\nwant\n %q", nd.Summary, want)
	}
	if !slices.Equal(nd.Stack, devStack) || nd.Evidence["size_bytes"] != uint64(64*mib) || nd.Evidence["api"] != "cudaMalloc" || nd.Evidence["code"] != 100 {
		t.Errorf("no-device finding %+v", nd)
	}

	// The list is unchanged: no new count. Then two more OOMs at the same
	// stack make one finding with a count of 3.
	for sec := 2; sec <= 4; sec++ {
		for _, f := range observe(sec) {
			if f.Evidence["count"] != 1 || !f.Active {
				t.Errorf("at %ds: %s count %v active %v", sec, f.Evidence["error"], f.Evidence["count"], f.Active)
			}
		}
	}
	s.failures = append(s.failures, oom(5, 4*gib), oom(5, 2*gib))
	fs = observe(5)
	var got model.Finding
	for _, f := range fs {
		if f.Evidence["error"] == "cudaErrorMemoryAllocation" {
			got = f
		}
	}
	if got.Evidence["count"] != 3 || got.Evidence["max_size_bytes"] != uint64(8*gib) || !got.FirstSeen.Equal(om.FirstSeen) {
		t.Fatalf("OOM finding after 3 failures: %+v", got)
	}
	if want := "GPU allocation failed: cudaMalloc returned cudaErrorMemoryAllocation (out of memory) for 2.0 GiB at alloc_batch+0x3c (trainer); 3 times"; got.Summary != want {
		t.Errorf("summary\n %q\nwant\n %q", got.Summary, want)
	}

	// Quiet: the no-device finding ends 30s after 1s, the OOM one 30s
	// after 5s; each once, then nothing.
	ended := map[string]int{}
	for sec := 6; sec <= 60; sec++ {
		for _, f := range observe(sec) {
			if !f.Active {
				ended[f.Evidence["error"].(string)] = sec
			}
		}
	}
	if ended["cudaErrorNoDevice"] != 31 || ended["cudaErrorMemoryAllocation"] != 35 {
		t.Errorf("ended at %v, want no device at 31s, OOM at 35s", ended)
	}

	// A new OOM at the same stack later is a new finding.
	s.failures = append(s.failures, oom(61, 8*gib))
	fs = observe(61)
	if len(fs) != 1 || !fs[0].Active || fs[0].Evidence["count"] != 1 || fs[0].FirstSeen.Equal(om.FirstSeen) {
		t.Errorf("findings after a new failure: %v", fs)
	}
}

func TestFailureCodeOnly(t *testing.T) {
	// A source that knows only the return code: 2 is out of memory for
	// both the runtime and the driver API.
	d := New(DefaultConfig())
	p := &model.Process{PID: 1, Comm: "x", CUDA: model.CUDAStats{Failures: []model.CUDAFailure{
		{Time: t0, API: "cuMemAlloc_v2", Size: gib, Code: 2},
		{Time: t0.Add(time.Millisecond), API: "cuMemAlloc_v2", Size: gib, Code: 201},
	}}}
	fs := d.Observe(t0.Add(time.Second), p)
	if len(fs) != 2 || fs[0].Severity != model.SeverityCritical || fs[1].Severity != model.SeverityWarning {
		t.Fatalf("findings %v, want critical for code 2, warning for 201", fs)
	}
	if !strings.Contains(fs[0].Summary, "returned error 2 (out of memory) for 1.0 GiB") {
		t.Errorf("summary %q", fs[0].Summary)
	}
}

func TestForget(t *testing.T) {
	d := New(DefaultConfig())
	s := newSim(1)
	s.failures = []model.CUDAFailure{{Time: t0, API: "cudaMalloc", Code: 2, Error: "cudaErrorMemoryAllocation"}}
	if fs := d.Observe(t0, s.process(42)); len(fs) != 1 {
		t.Fatalf("findings %v", fs)
	}
	d.Forget(42)
	// A new process with the pid starts from nothing: its single failure
	// is new to it.
	fs := d.Observe(t0.Add(time.Second), s.process(42))
	if len(fs) != 1 || fs[0].Evidence["count"] != 1 {
		t.Errorf("after Forget: %v", fs)
	}
}

func TestClockStep(t *testing.T) {
	d := New(DefaultConfig())
	s := newSim(1)
	for i, sec := range []int{0, 1, 2, 3, 1, 2, 3, 4, 5, 6} {
		now := t0.Add(time.Duration(sec) * time.Second)
		s.step(40, now)
		if fs := d.Observe(now, s.process(42)); len(fs) != 0 {
			t.Errorf("sample %d: %v", i, fs)
		}
	}
}

func TestHuman(t *testing.T) {
	for b, want := range map[float64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 3 * gib: "3.0 GiB", -2 * mib: "-2.0 MiB"} {
		if got := human(b); got != want {
			t.Errorf("human(%v) = %q, want %q", b, got, want)
		}
	}
}

func TestFailuresListShrinks(t *testing.T) {
	// A source that keeps only its latest failures: after it drops old
	// entries, the ones still listed are not counted again, new ones are,
	// also when the list stays the same length.
	d := New(DefaultConfig())
	f := func(ms int) model.CUDAFailure {
		return model.CUDAFailure{Time: t0.Add(time.Duration(ms) * time.Millisecond), API: "cudaMalloc", Size: gib, Code: 2, Error: "cudaErrorMemoryAllocation"}
	}
	p := &model.Process{PID: 1, Comm: "x"}
	counts := []any{}
	for i, list := range [][]model.CUDAFailure{{f(1), f(2), f(3)}, {f(3)}, {f(3), f(4)}, {f(4), f(5)}, {f(4), f(5)}, {f(6), f(7)}} {
		p.CUDA.Failures = list
		fs := d.Observe(t0.Add(time.Duration(i+1)*time.Second), p)
		if len(fs) != 1 {
			t.Fatalf("step %d: %v", i, fs)
		}
		counts = append(counts, fs[0].Evidence["count"])
	}
	if want := []any{3, 3, 4, 5, 5, 7}; !slices.Equal(counts, want) {
		t.Errorf("counts %v, want %v", counts, want)
	}
}

func TestCallSite(t *testing.T) {
	for _, c := range []struct {
		stack []string
		want  string
	}{
		{[]string{"cudaMalloc+0x10 (libcudart.so.12)", "libcuda.so.1+0x4410", "grow+0x2 (app)", "main (app)"}, "grow+0x2 (app)"},
		{[]string{"grow+0x2 (app)", "main (app)"}, "grow+0x2 (app)"},
		{[]string{"cuMemAlloc_v2 (libcuda.so.1)"}, "cuMemAlloc_v2 (libcuda.so.1)"},
		{nil, "an unknown stack"},
	} {
		if got := callSite(c.stack); got != c.want {
			t.Errorf("callSite(%q) = %q, want %q", c.stack, got, c.want)
		}
	}
}
