package gpualloc

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

const (
	mib = 1 << 20
	gib = 1 << 30
)

// Stack ids of the simulated allocation sites; the innermost frame is the
// CUDA library, as the hooks see it.
const (
	stepSite  int64 = 3  // per-step activations, freed within the step
	poolSite  int64 = 4  // caching allocator reserving its pool
	cacheSite int64 = 5  // the leak: tensors cached and never released
	loadSite  int64 = 7  // weights loaded in one go
	ringSite  int64 = 9  // long-lived buffers in a ring
	loopSite  int64 = 11 // a loop allocating and freeing a buffer thousands of times a second
)

var stacks = map[int64][]model.Frame{
	stepSite:  testutil.Frames("cudaMalloc+0x10 (libcudart.so.12)", "train_step+0x31 (trainer)", "main+0x40 (trainer)"),
	poolSite:  testutil.Frames("cuMemAlloc_v2+0x8 (libcuda.so.1)", "pool_reserve+0x12 (trainer)", "main+0x22 (trainer)"),
	cacheSite: testutil.Frames("cudaMalloc+0x10 (libcudart.so.12)", "cache_tensor+0x2a (trainer)", "train_step+0x55 (trainer)", "main+0x40 (trainer)"),
	loadSite:  testutil.Frames("cudaMalloc+0x10 (libcudart.so.12)", "load_weights+0x19 (trainer)", "main+0x60 (trainer)"),
	ringSite:  testutil.Frames("cudaMalloc+0x10 (libcudart.so.12)", "ring_push+0x44 (trainer)", "main+0x40 (trainer)"),
	loopSite:  testutil.Frames("cudaMalloc+0x10 (libcudart.so.12)", "scratch_loop+0x21 (trainer)", "main+0x40 (trainer)"),
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
	liveBytes, peak          uint64  // live device bytes now, and the most since the last sample
	allocBytes, freed, calls uint64
	frees, asyncFrees        uint64 // cudaFree and cudaFreeAsync calls
	hostBytes, hostCalls     uint64 // pinned host allocations (cudaMallocHost), never live on the device
	failures                 []model.CUDAFailure
	rng                      *rand.Rand
	started                  time.Time // when watching began; zero: unknown
}

func newSim(seed uint64) *sim { return &sim{rng: rand.New(rand.NewPCG(seed, 7))} }

// alloc makes n allocations of size at site, spread over the second that
// ends at now.
func (s *sim) alloc(site int64, n int, size uint64, now time.Time) {
	for i := range n {
		s.live = append(s.live, alloc{site, size, now.Add(-time.Second + time.Duration(i+1)*time.Second/time.Duration(n))})
		s.allocBytes += size
		s.calls++
		s.liveBytes += size
		s.peak = max(s.peak, s.liveBytes)
	}
}

// allocHost makes n pinned host allocations of size: counted by the source
// under cudaMallocHost and in HostAllocBytes, but neither live device bytes
// nor a site.
func (s *sim) allocHost(n int, size uint64) {
	s.hostBytes += uint64(n) * size
	s.hostCalls += uint64(n)
}

// churn makes n pairs of a size allocation and its cudaFree (cudaFreeAsync
// when async), threads at a time: live bytes never rise by more than
// threads × size.
func (s *sim) churn(n, threads int, size uint64, async bool) {
	s.allocBytes += uint64(n) * size
	s.freed += uint64(n) * size
	s.calls += uint64(n)
	if async {
		s.asyncFrees += uint64(n)
	} else {
		s.frees += uint64(n)
	}
	s.peak = max(s.peak, s.liveBytes+uint64(threads)*size)
}

// free releases up to n of the oldest allocations at site.
func (s *sim) free(site int64, n int) {
	s.live = slices.DeleteFunc(s.live, func(a alloc) bool {
		if a.site != site || n == 0 {
			return false
		}
		n--
		s.release(a)
		return true
	})
}

func (s *sim) release(a alloc) {
	s.freed += a.size
	s.frees++
	s.liveBytes -= a.size
}

// freeBefore releases every allocation at site made before cutoff.
func (s *sim) freeBefore(site int64, cutoff time.Time) {
	s.live = slices.DeleteFunc(s.live, func(a alloc) bool {
		if a.site != site || !a.at.Before(cutoff) {
			return false
		}
		s.release(a)
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

// process samples the simulated process; the peak starts over from there.
func (s *sim) process(pid int) *model.Process {
	p := &model.Process{PID: pid, Comm: "trainer", Started: s.started, CUDA: model.CUDAStats{
		LiveBytes:     s.liveBytes,
		LivePeakBytes: max(s.peak, s.liveBytes),
		LiveAllocs:    len(s.live),
		AllocBytes:    map[string]uint64{"cudaMalloc": s.allocBytes},
		FreeBytes:     map[string]uint64{"cudaFree": s.freed},
		AllocCalls:    map[string]uint64{"cudaMalloc": s.calls},
		Calls:         map[string]uint64{"cudaMalloc": s.calls, "cudaFree": s.frees, "cudaFreeAsync": s.asyncFrees},
		Failures:      slices.Clone(s.failures),
		Libraries:     []string{"libcudart.so.12"},
	}}
	s.peak = s.liveBytes
	bySite := map[int64]*model.CUDASite{}
	for _, a := range s.live {
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
		p.CUDA.Calls["cudaMallocHost"] = s.hostCalls
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

// at is the time of second sec of a run.
func at(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }

// findings groups reports by finding (first sighting), in order.
func findings(reps []report) [][]report {
	var out [][]report
	for _, r := range reps {
		i := slices.IndexFunc(out, func(g []report) bool { return g[0].f.FirstSeen.Equal(r.f.FirstSeen) })
		if i < 0 {
			out = append(out, nil)
			i = len(out) - 1
		}
		out[i] = append(out[i], r)
	}
	return out
}

// burstEv and failureEv are the evidence of a burst and of a failure.
func burstEv(f model.Finding) model.GPUAllocBurstEvidence {
	return f.Evidence.(model.GPUAllocBurstEvidence)
}

func failureEv(f model.Finding) model.GPUAllocFailureEvidence {
	return f.Evidence.(model.GPUAllocFailureEvidence)
}

// val is what p points at, nil for nil: an evidence value as JSON has it,
// to compare and print.
func val[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
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
				if got := burstEv(bursts[0].f).BytesInWindow; got < bytes {
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
	// A sample that comes 2.5s late holds 2.5 intervals of steady traffic,
	// 2.5 times the bytes of one: judged by what is held at once, that is
	// no burst.
	d := New(DefaultConfig())
	s := newSim(1)
	now := t0
	for i := range 40 {
		gap := time.Second
		if i == 30 {
			gap = 2500 * time.Millisecond
			s.step(40, now.Add(time.Second)) // the 1.5 seconds before the last
			s.step(20, now.Add(gap-time.Second))
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
	oomStack := testutil.Frames("cudaMalloc+0x10 (libcudart.so.12)", "alloc_batch+0x3c (trainer)", "main+0x40 (trainer)")
	devStack := testutil.Frames("cudaMalloc+0x10 (libcudart.so.12)", "init_device+0x11 (trainer)", "main+0x12 (trainer)")
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
		byErr[failureEv(f).Error] = f
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
	if ev := failureEv(nd); !slices.Equal(nd.Stack, devStack) || ev.SizeBytes != 64*mib || ev.API != "cudaMalloc" || ev.Code != 100 {
		t.Errorf("no-device finding %+v", nd)
	}

	// The list is unchanged: no new count. Then two more OOMs at the same
	// stack make one finding with a count of 3.
	for sec := 2; sec <= 4; sec++ {
		for _, f := range observe(sec) {
			if ev := failureEv(f); ev.Count != 1 || !f.Active {
				t.Errorf("at %ds: %s count %v active %v", sec, ev.Error, ev.Count, f.Active)
			}
		}
	}
	s.failures = append(s.failures, oom(5, 4*gib), oom(5, 2*gib))
	fs = observe(5)
	var got model.Finding
	for _, f := range fs {
		if failureEv(f).Error == "cudaErrorMemoryAllocation" {
			got = f
		}
	}
	if ev, _ := got.Evidence.(model.GPUAllocFailureEvidence); ev.Count != 3 || ev.MaxSizeBytes != 8*gib || !got.FirstSeen.Equal(om.FirstSeen) {
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
				ended[failureEv(f).Error] = sec
			}
		}
	}
	if ended["cudaErrorNoDevice"] != 31 || ended["cudaErrorMemoryAllocation"] != 35 {
		t.Errorf("ended at %v, want no device at 31s, OOM at 35s", ended)
	}

	// A new OOM at the same stack later is a new finding.
	s.failures = append(s.failures, oom(61, 8*gib))
	fs = observe(61)
	if len(fs) != 1 || !fs[0].Active || failureEv(fs[0]).Count != 1 || fs[0].FirstSeen.Equal(om.FirstSeen) {
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
	if len(fs) != 1 || failureEv(fs[0]).Count != 1 {
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
	counts := []int{}
	for i, list := range [][]model.CUDAFailure{{f(1), f(2), f(3)}, {f(3)}, {f(3), f(4)}, {f(4), f(5)}, {f(4), f(5)}, {f(6), f(7)}} {
		p.CUDA.Failures = list
		fs := d.Observe(t0.Add(time.Duration(i+1)*time.Second), p)
		if len(fs) != 1 {
			t.Fatalf("step %d: %v", i, fs)
		}
		counts = append(counts, failureEv(fs[0]).Count)
	}
	if want := []int{3, 3, 4, 5, 5, 7}; !slices.Equal(counts, want) {
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
		if got := callSite(testutil.Frames(c.stack...)); got != c.want {
			t.Errorf("callSite(%q) = %q, want %q", c.stack, got, c.want)
		}
	}
}

// A failure group carries the memory snapshot of its failures: the first
// one taken, kept when the source's list of four rolls past it, and how
// many were taken over the group's life, each once; its summary says what
// the snapshot shows. A group without one (another error, another stack,
// a snapshot from before the group) has neither.
func TestFailureSnapshot(t *testing.T) {
	d := New(DefaultConfig())
	s := newSim(1)
	oomStack := testutil.Frames("cudaMalloc+0x10 (libcudart.so.12)", "alloc_batch+0x3c (trainer)", "main+0x40 (trainer)")
	otherStack := testutil.Frames("cudaMalloc+0x10 (libcudart.so.12)", "alloc_scratch+0x10 (trainer)", "main+0x40 (trainer)")
	oom := func(sec int) model.CUDAFailure {
		return model.CUDAFailure{Time: at(sec).Add(-time.Second / 2), API: "cudaMalloc", Size: 2 * gib, Code: 2, Error: "cudaErrorMemoryAllocation", Stack: oomStack}
	}
	snap := func(f model.CUDAFailure) *model.GPUMemorySnapshot {
		return &model.GPUMemorySnapshot{Time: f.Time, API: f.API, Error: f.Error, Code: f.Code, SizeBytes: f.Size, Stack: f.Stack, Why: model.SnapshotOutOfMemory,
			LiveBytes: 22 * gib, Sites: []model.SnapshotSite{{Bytes: 18 * gib, Allocations: 3, Stack: stacks[cacheSite]}},
			Devices: []model.SnapshotDevice{{Index: 3, Processes: []model.SnapshotProcess{
				{PID: 77, Pod: model.Pod{Namespace: "batch", Name: "embed-7"}, UsedBytes: 51 * gib}, {PID: 42, Self: true, UsedBytes: 22 * gib}}}}}
	}
	noDev := model.CUDAFailure{Time: at(1).Add(-time.Second / 4), API: "cudaMalloc", Size: 64 * mib, Code: 100, Error: "cudaErrorNoDevice", Stack: oomStack}
	// Out of memory at another stack, in the same second: its snapshot
	// is not the group's.
	elsewhere := oom(1)
	elsewhere.Time, elsewhere.Stack = at(1).Add(-time.Second/8), otherStack
	// A snapshot of the group's API, error and stack from before its first
	// failure (an earlier group's, ended) is not its.
	stale := snap(oom(-100))

	var snaps []*model.GPUMemorySnapshot
	observe := func(sec int) map[string]model.Finding {
		p := s.process(42)
		p.CUDA.Snapshots = slices.Clone(snaps)
		out := map[string]model.Finding{}
		for _, f := range d.Observe(at(sec), p) {
			out[failureEv(f).Error+" "+callSite(f.Stack)] = f
		}
		return out
	}
	const oomKey, otherKey, noDevKey = "cudaErrorMemoryAllocation alloc_batch+0x3c (trainer)", "cudaErrorMemoryAllocation alloc_scratch+0x10 (trainer)",
		"cudaErrorNoDevice alloc_batch+0x3c (trainer)"

	first := snap(oom(1))
	s.failures = append(s.failures, noDev, oom(1), elsewhere)
	snaps = []*model.GPUMemorySnapshot{stale, first}
	fs := observe(1)
	if len(fs) != 3 {
		t.Fatalf("findings %v, want three groups", fs)
	}
	om := fs[oomKey]
	if ev := failureEv(om); ev.Snapshot != first || ev.Snapshots != 1 {
		t.Errorf("OOM group: snapshot %p (%d), want %p (1)", ev.Snapshot, ev.Snapshots, first)
	}
	want := "GPU allocation failed: cudaMalloc returned cudaErrorMemoryAllocation (out of memory) for 2.0 GiB at alloc_batch+0x3c (trainer). " +
		"Out of memory on GPU 3: this process held 22.0 GiB (top: cache_tensor+0x2a (trainer) 18.0 GiB); pod batch/embed-7 held 51.0 GiB on the same GPU."
	if om.Summary != want {
		t.Errorf("summary\n %q\nwant\n %q", om.Summary, want)
	}
	for _, k := range []string{otherKey, noDevKey} {
		f := fs[k]
		if ev := failureEv(f); ev.Snapshot != nil || ev.Snapshots != 0 || strings.Contains(f.Summary, "held") {
			t.Errorf("%s: snapshot %v (%d), summary %q; want none", k, ev.Snapshot, ev.Snapshots, f.Summary)
		}
		if data, err := json.Marshal(f.Evidence); err != nil || strings.Contains(string(data), "snapshot") {
			t.Errorf("%s: evidence %s (%v), want no snapshot keys", k, data, err)
		}
	}

	// The same list again: nothing new.
	if ev := failureEv(observe(2)[oomKey]); ev.Snapshot != first || ev.Snapshots != 1 {
		t.Errorf("at 2s: snapshot %p (%d), want the first (1)", ev.Snapshot, ev.Snapshots)
	}
	// Four more failures with a snapshot each: the list keeps the newest
	// four, the group its first and the count of all.
	for sec := 3; sec <= 6; sec++ {
		f := oom(sec)
		s.failures = append(s.failures, f)
		snaps = append(snaps, snap(f))
		snaps = snaps[max(0, len(snaps)-model.MaxSnapshots):]
		ev := failureEv(observe(sec)[oomKey])
		if ev.Snapshot != first || ev.Snapshots != sec-1 {
			t.Errorf("at %ds: snapshot %p (%d), want the first (%d)", sec, ev.Snapshot, ev.Snapshots, sec-1)
		}
	}
	if slices.Contains(snaps, first) {
		t.Fatal("the list did not roll past the first snapshot")
	}
}
