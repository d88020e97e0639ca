// Package gpualloc judges the GPU allocations of a process, as the CUDA
// hooks report them, and finds four things:
//
//   - a burst: far more device memory taken and held at once than the
//     process's intervals usually take, which is what tips a shared GPU into
//     OOM; bursts that recur from one call site are one finding;
//   - churn: thousands of allocate-and-free pairs a second with live bytes
//     flat, each free synchronizing the device;
//   - a leak: live device memory that keeps growing while allocations no
//     request lives long enough to hold pile up at the same stack, with the
//     time left until the device (or a given budget) is full;
//   - failed allocations, named by their error, API, size and stack, with
//     what held the memory when one failed where a snapshot was taken.
//
// Healthy programs do much that looks alike at a glance: caching allocators
// grab a large pool once and keep it, training loops allocate and free the
// same amount every step. The detectors ask for the signal that tells those
// apart: a burst must beat the process's own mean and spread, a leak must
// grow steadily and pin allocations made all along its window to one stack.
package gpualloc

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/episode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/series"
	stackpkg "github.com/open-autoglm/autoglm-ebpf/pkg/detect/stack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Config holds the detector thresholds. Zero fields take the DefaultConfig value.
type Config struct {
	// Bursts. A burst is memory held, not bytes passed through: the rise
	// of live bytes within one interval above where the interval started,
	// to the most that was live at any instant (the kernel's high-water
	// mark). The baseline is an exponentially weighted mean and variance
	// of that rise, learnt from intervals that were not bursts.
	WarmUp         int     // intervals learnt before the baseline is trusted
	Sigmas         float64 // a burst exceeds the baseline mean by this many standard deviations
	MinRatio       float64 // and is at least this many times the baseline mean
	BurstFloor     uint64  // a rise below this is no burst
	BurstCeiling   uint64  // a rise this large is a burst even during warm-up
	Alpha          float64 // weight of each new interval in the baseline
	QuietIntervals int     // intervals without a burst (or churn) before its finding may end
	// Recurring bursts. The bursts of one call site are one finding, with
	// their count, period and largest size; it stays open while they recur
	// (until QuietIntervals and twice the period have passed without one)
	// and a burst from the site within RecurWithin of the last reopens it.
	RecurWithin time.Duration
	// A burst at least RegrowRatio times the one that opened its site's
	// finding is a new finding: the problem got markedly worse.
	RegrowRatio float64
	// A burst's severity follows what the memory does: one that began
	// within StartupWindow of watching (of the process's start under
	// run) and stays held is a start-up step (weights loaded, an
	// allocator's warm-up, a KV-cache reservation): info. One that came
	// within NearFullShare of the device's memory or of MemoryBudget is
	// critical; any other is a warning.
	StartupWindow time.Duration
	NearFullShare float64

	// Churn: an interval churns when allocate + synchronizing-free pairs
	// (cudaFree, cuMemFree_v2) run at ChurnRate a second or more while
	// live bytes stay flat: they change over the interval by at most
	// ChurnFlatShare of the bytes allocated in it, i.e. what is allocated
	// is freed again. ChurnConfirm churning intervals in a row make a
	// finding.
	ChurnRate      float64
	ChurnFlatShare float64
	ChurnConfirm   int

	// Leaks are judged at several time scales, the shortest first; the
	// stronger the evidence, the shorter the window that must show it.
	// Fast: LeakFastAllocs allocations or more from one site made all
	// through the last LeakFastWindow and all still live, live bytes
	// rising by about what they hold.
	LeakFastWindow time.Duration
	LeakFastAllocs int
	// Classic: live bytes rising steadily over LeakWindow while
	// allocations older than LeakMinAge pile up at one stack.
	LeakWindow time.Duration
	LeakMinAge time.Duration
	// Slow: on each of LeakScales (floors of live bytes per step, in
	// bounded memory), LeakScaleAllocs allocations or more from one site
	// made all through the scale's window and still live, the floor rising
	// by about what they hold.
	LeakScales      []series.Scale
	LeakScaleAllocs int
	// Growth below LeakMinRise over the fast window or a slow scale's is
	// too small to report.
	LeakMinRise uint64
	// How long the leak condition must hold, at every sample, before a
	// finding is raised: a ring or pool filling early in the window, plus
	// noise, can pass for a leak in the last sample or two before the fill
	// leaves it. Time, not samples, so that slow or irregular polls do not
	// delay the verdict and fast ones do not hasten it.
	LeakConfirm time.Duration

	// Exhaustion: a leak's time until the memory runs out, against the free
	// memory of the fullest device the process uses (Devices, from NVML)
	// and MemoryBudget (bytes the process may use; 0 for none), whichever
	// comes first. A leak that gets there within ExhaustWithin is critical.
	ExhaustWithin time.Duration
	MemoryBudget  uint64
	// Devices returns the GPUs as NVML last sampled them, nil without NVML
	// (the pipeline sets it); nil for none.
	Devices func() []model.GPU

	// Failures.
	FailureQuiet time.Duration // time without a new failure before a failure finding ends
}

// DefaultConfig returns the thresholds used when none are given.
func DefaultConfig() Config {
	return Config{
		WarmUp:         5,
		Sigmas:         4,
		MinRatio:       2,
		BurstFloor:     256 << 20,
		BurstCeiling:   4 << 30,
		Alpha:          0.1,
		QuietIntervals: 3,
		RecurWithin:    10 * time.Minute,
		RegrowRatio:    1.5,
		StartupWindow:  10 * time.Minute,
		NearFullShare:  0.9,
		// A cudaMalloc plus a synchronizing cudaFree cost the host some
		// 20 µs at best on current GPUs, and each free drains the device's
		// queue: at 5000 pairs/s a tenth of a thread goes to the allocator
		// and the host never gets more than 200 µs of work ahead of the
		// GPU. A caching allocator calls them a few times a second.
		ChurnRate:      5000,
		ChurnFlatShare: 0.1,
		ChurnConfirm:   3,
		// 10 s: no request or step holds its buffers that long at a steady
		// rate; with LeakConfirm a steady leak is found 10-12 s after its
		// first allocation, and a warm-up that plateaus within 10 s of its
		// start stays quiet.
		LeakFastWindow: 10 * time.Second,
		LeakFastAllocs: 10,
		LeakWindow:     30 * time.Second,
		LeakMinAge:     10 * time.Second,
		// 1 MiB/min in allocations of up to 1 MiB shows within 10 min;
		// a leak of one allocation every 10 min within 2 h.
		LeakScales: []series.Scale{
			{Step: 5 * time.Second, Points: 24},
			{Step: 30 * time.Second, Points: 20},
			{Step: 5 * time.Minute, Points: 24},
			{Step: 30 * time.Minute, Points: 24},
		},
		LeakScaleAllocs: 8,
		LeakMinRise:     1 << 20,
		LeakConfirm:     2 * time.Second,
		ExhaustWithin:   10 * time.Minute,
		FailureQuiet:    30 * time.Second,
	}
}

const topSitesShown = 3 // sites listed in the evidence

// Detector keeps a short history per process. It is safe for concurrent use.
type Detector struct {
	cfg   Config
	procs episode.Procs[procState]
}

type procState struct {
	// The previous observation: its time (zero before the first), live
	// bytes and monotonic totals.
	last                time.Time
	live                uint64
	bytes, calls        uint64  // device bytes allocated, allocation calls (all APIs)
	devCalls, syncFrees uint64  // device allocation calls, synchronizing frees
	learnt              int     // intervals in the burst baseline
	mean, vari          float64 // baseline rise per interval (bytes) and its variance
	run                 *occurrence
	bursts              []*burstGroup // by call site, oldest first
	churn               churnState

	// Leaks.
	series []sample      // samples of the last LeakWindow (twice LeakFastWindow, if longer)
	trend  *series.Multi // live bytes at LeakScales
	leak   episode.Episode
	shown  int // the verdict (index) the finding reports

	// Failures.
	counted  *model.CUDAFailure // the last entry of p.CUDA.Failures already counted
	failures map[failKey]*failGroup
}

// New returns a detector with cfg, zero fields replaced by defaults.
func New(cfg Config) *Detector {
	def := DefaultConfig()
	orDef := func(v *float64, d float64) {
		if *v <= 0 {
			*v = d
		}
	}
	orDef(&cfg.Sigmas, def.Sigmas)
	orDef(&cfg.MinRatio, def.MinRatio)
	orDef(&cfg.Alpha, def.Alpha)
	orDef(&cfg.RegrowRatio, def.RegrowRatio)
	orDef(&cfg.NearFullShare, def.NearFullShare)
	orDef(&cfg.ChurnRate, def.ChurnRate)
	orDef(&cfg.ChurnFlatShare, def.ChurnFlatShare)
	orDefInt := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	orDefInt(&cfg.WarmUp, def.WarmUp)
	orDefInt(&cfg.QuietIntervals, def.QuietIntervals)
	orDefInt(&cfg.ChurnConfirm, def.ChurnConfirm)
	orDefInt(&cfg.LeakFastAllocs, def.LeakFastAllocs)
	orDefInt(&cfg.LeakScaleAllocs, def.LeakScaleAllocs)
	orDefDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	orDefDur(&cfg.RecurWithin, def.RecurWithin)
	orDefDur(&cfg.StartupWindow, def.StartupWindow)
	orDefDur(&cfg.LeakFastWindow, def.LeakFastWindow)
	orDefDur(&cfg.LeakWindow, def.LeakWindow)
	orDefDur(&cfg.LeakMinAge, def.LeakMinAge)
	orDefDur(&cfg.LeakConfirm, def.LeakConfirm)
	orDefDur(&cfg.ExhaustWithin, def.ExhaustWithin)
	orDefDur(&cfg.FailureQuiet, def.FailureQuiet)
	if cfg.BurstFloor == 0 {
		cfg.BurstFloor = def.BurstFloor
	}
	if cfg.BurstCeiling == 0 {
		cfg.BurstCeiling = def.BurstCeiling
	}
	if cfg.LeakMinRise == 0 {
		cfg.LeakMinRise = def.LeakMinRise
	}
	if cfg.LeakScales == nil {
		cfg.LeakScales = def.LeakScales
	}
	return &Detector{cfg: cfg}
}

// Observe takes one sample of a process (p.CUDA filled; p.PID, p.Comm set)
// taken at now, and returns the findings about that process that are new,
// still active (updated LastSeen and evidence) or just ended. A finding that
// ends is returned once with Active=false; only a burst finding comes back
// after that, active again with the same FirstSeen, when its site bursts
// again within RecurWithin.
func (d *Detector) Observe(now time.Time, p *model.Process) []model.Finding {
	return d.procs.With(p.PID, func() *procState {
		if !p.CUDA.Active() {
			// Nothing to judge, and in --all most processes never touch
			// CUDA: their state (the leak trend's rings) is made when they do.
			return nil
		}
		return &procState{failures: map[failKey]*failGroup{}, trend: series.NewMulti(d.cfg.LeakScales...)}
	}, func(st *procState) []model.Finding {
		iv, ok := st.advance(now, &p.CUDA)
		var out []model.Finding
		out = append(out, d.observeBursts(now, p, st, iv, ok)...)
		out = append(out, d.observeChurn(now, p, st, iv, ok)...)
		out = append(out, d.observeLeak(now, p, st)...)
		out = append(out, d.observeFailures(now, p, st)...)
		return out
	})
}

// Forget drops all state of pid (process exited).
func (d *Detector) Forget(pid int) { d.procs.Forget(pid) }

// interval is what a process did between two observations.
type interval struct {
	since   time.Time // the previous observation; zero before the first
	seconds float64   // its length; 0 for the first, whose span is unknown
	// Live device bytes at its start and end, and the most live at any
	// instant within it.
	start, end, peak    uint64
	bytes, calls        uint64 // device bytes allocated, allocation calls (all APIs)
	devCalls, syncFrees uint64 // device allocation calls, synchronizing frees
}

// rise is the memory the interval took and held at once: live bytes at
// their peak above where they started.
func (iv interval) rise() uint64 { return iv.peak - min(iv.peak, iv.start) }

// advance returns the interval since the previous observation and makes cs
// the new one; false when the clock stepped back (no interval to judge).
func (st *procState) advance(now time.Time, cs *model.CUDAStats) (interval, bool) {
	bytes, calls := deviceAllocBytes(cs), sum(cs.AllocCalls)
	devCalls, syncFrees := deviceAllocCalls(cs), synchronizingFrees(cs)
	iv := interval{since: st.last, start: st.live, end: cs.LiveBytes, peak: max(cs.LivePeakBytes, cs.LiveBytes)}
	ok := st.last.IsZero() || now.After(st.last)
	if ok {
		if bytes < st.bytes || calls < st.calls || devCalls < st.devCalls || syncFrees < st.syncFrees {
			// Totals went down: the source restarted its counters.
			st.bytes, st.calls, st.devCalls, st.syncFrees = 0, 0, 0, 0
		}
		iv.bytes, iv.calls = bytes-st.bytes, calls-st.calls
		iv.devCalls, iv.syncFrees = devCalls-st.devCalls, syncFrees-st.syncFrees
		if !st.last.IsZero() {
			iv.seconds = now.Sub(st.last).Seconds()
		}
	}
	st.last, st.live = now, cs.LiveBytes
	st.bytes, st.calls, st.devCalls, st.syncFrees = bytes, calls, devCalls, syncFrees
	return iv, ok
}

// ---- failures ----

// failKey groups failures: one finding per API, error and stack.
type failKey struct {
	api, err string
	code     int // tells errors apart when the source has no name for them
	stack    string
}

type failGroup struct {
	f       model.Finding
	count   int
	first   time.Time // first failure's time
	last    time.Time // last failure's time
	lastNew time.Time // observation that last brought a failure
	size    uint64    // last requested size
	maxSize uint64
	// The memory snapshots of its failures (CUDAStats.Snapshots): the
	// first, kept for the group's life although the list rolls; how many
	// there were; the time of the newest counted, which tells the next
	// ones (the list is oldest first) without keeping them.
	snapshot  *model.GPUMemorySnapshot
	snapshots int
	snapped   time.Time
}

func (d *Detector) observeFailures(now time.Time, p *model.Process, st *procState) []model.Finding {
	fails := newFailures(p.CUDA.Failures, st.counted)
	if len(fails) > 0 {
		last := fails[len(fails)-1] // a copy: the list is the source's
		st.counted = &last
	}
	for _, fl := range fails {
		at := fl.Time
		if at.IsZero() {
			at = now
		}
		k := failKey{fl.API, fl.Error, fl.Code, stackpkg.Key(fl.Stack)}
		g := st.failures[k]
		if g == nil {
			g = &failGroup{first: at, f: model.Finding{
				Kind: model.KindGPUAllocFailure, PID: p.PID, FirstSeen: st.uniqueFirstSeen(at),
				Stack: slices.Clone(fl.Stack),
			}}
			st.failures[k] = g
		}
		g.count++
		g.last = at
		g.lastNew = now
		g.size = fl.Size
		g.maxSize = max(g.maxSize, fl.Size)
	}

	takeSnapshots(st.failures, p.CUDA.Snapshots)

	var out []model.Finding
	for _, k := range slices.SortedFunc(maps.Keys(st.failures), func(a, b failKey) int {
		return st.failures[a].f.FirstSeen.Compare(st.failures[b].f.FirstSeen)
	}) {
		g := st.failures[k]
		active := now.Sub(g.lastNew) < d.cfg.FailureQuiet
		out = append(out, d.fillFailure(g, k, now, p, active))
		if !active {
			delete(st.failures, k)
		}
	}
	return out
}

// takeSnapshots gives each failure group the snapshots taken at its
// failures: a snapshot is keyed by its failure (its Time is the failure's),
// so one of the group's API, error and stack taken between its first and
// last failure is of one of them. Those after the newest a group counted
// are new to it.
func takeSnapshots(groups map[failKey]*failGroup, snaps []*model.GPUMemorySnapshot) {
	for _, s := range snaps {
		if s == nil {
			continue
		}
		var g *failGroup
		for k, cand := range groups {
			if k.api == s.API && k.err == s.Error && k.code == s.Code && !s.Time.Before(cand.first) && !s.Time.After(cand.last) &&
				k.stack == stackpkg.Key(s.Stack) {
				g = cand
				break
			}
		}
		if g == nil || !s.Time.After(g.snapped) {
			continue
		}
		if g.snapshot == nil {
			g.snapshot = s
		}
		g.snapshots++
		g.snapped = s.Time
	}
}

// newFailures returns the entries of list after counted. The source keeps
// only its newest failures, so a full list stays the same length as new
// ones push old ones out: the last counted entry, not a count, marks where
// the new ones start.
func newFailures(list []model.CUDAFailure, counted *model.CUDAFailure) []model.CUDAFailure {
	if counted == nil {
		return list
	}
	for i := len(list) - 1; i >= 0; i-- {
		f := list[i]
		if f.Time.Equal(counted.Time) && f.API == counted.API && f.Code == counted.Code && f.Size == counted.Size &&
			slices.Equal(f.Stack, counted.Stack) {
			return list[i+1:]
		}
	}
	// All entries are newer than the last one counted.
	return list
}

// uniqueFirstSeen returns at, moved on by a nanosecond while another open
// failure finding of the process has it: findings are told apart by kind,
// pid and first sighting, and two failures may share a timestamp.
func (st *procState) uniqueFirstSeen(at time.Time) time.Time {
	for {
		taken := false
		for _, g := range st.failures {
			if g.f.FirstSeen.Equal(at) {
				taken = true
				break
			}
		}
		if !taken {
			return at
		}
		at = at.Add(time.Nanosecond)
	}
}

func (d *Detector) fillFailure(g *failGroup, k failKey, now time.Time, p *model.Process, active bool) model.Finding {
	f := g.f
	f.Comm = p.Comm
	f.LastSeen = now
	f.Active = active
	oom := model.OutOfMemory(k.err, k.code)
	f.Severity = model.SeverityWarning
	if oom {
		f.Severity = model.SeverityCritical
	}
	errName := k.err
	if errName == "" {
		errName = fmt.Sprintf("error %d", k.code)
	}
	var b strings.Builder
	head := "GPU allocation failed"
	if !active {
		head = "GPU allocation failures ended"
	}
	fmt.Fprintf(&b, "%s: %s returned %s", head, k.api, errName)
	if oom {
		b.WriteString(" (out of memory)")
	}
	fmt.Fprintf(&b, " for %s", human(float64(g.size)))
	if len(f.Stack) > 0 {
		fmt.Fprintf(&b, " at %s", callSite(f.Stack))
	}
	if g.count > 1 {
		fmt.Fprintf(&b, "; %d times", g.count)
	}
	if g.snapshot != nil {
		b.WriteString(". ")
		b.WriteString(g.snapshot.Describe(callSite))
	}
	f.Summary = b.String()
	f.Evidence = model.GPUAllocFailureEvidence{
		API:          k.api,
		Error:        k.err,
		Code:         k.code,
		SizeBytes:    g.size,
		MaxSizeBytes: g.maxSize,
		Count:        g.count,
		FirstFailure: g.first,
		LastFailure:  g.last,
		LiveBytes:    p.CUDA.LiveBytes,
		Snapshot:     g.snapshot,
		Snapshots:    g.snapshots,
	}
	return f
}

// ---- helpers ----

// deviceAllocBytes is the bytes allocated on the device since attach: the
// total over all APIs less pinned host memory, which is not on the GPU (as
// LiveBytes leaves it out).
func deviceAllocBytes(cs *model.CUDAStats) uint64 {
	all := sum(cs.AllocBytes)
	return all - min(cs.HostAllocBytes, all)
}

// hostAllocAPIs allocate pinned host memory, not device memory.
var hostAllocAPIs = []string{"cudaMallocHost", "cudaHostAlloc", "cuMemAllocHost_v2", "cuMemHostAlloc"}

// syncFreeAPIs free device memory and wait for the device to finish its
// queued work first; the stream-ordered cudaFreeAsync and cuMemFreeAsync do
// not, which is what makes a pool cheap to churn.
var syncFreeAPIs = []string{"cudaFree", "cuMemFree_v2"}

// deviceAllocCalls is the device allocation calls since attach.
func deviceAllocCalls(cs *model.CUDAStats) uint64 {
	n := sum(cs.AllocCalls)
	for _, api := range hostAllocAPIs {
		n -= min(cs.AllocCalls[api], n)
	}
	return n
}

// synchronizingFrees is the calls of syncFreeAPIs since attach.
func synchronizingFrees(cs *model.CUDAStats) uint64 {
	var n uint64
	for _, api := range syncFreeAPIs {
		n += cs.Calls[api]
	}
	return n
}

func sum(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

// callSite names the frame a reader wants: the innermost one outside the
// CUDA libraries, i.e. the code that asked for the memory. Whether a stack
// starts inside the library or at its caller depends on where it was taken.
func callSite(stack []model.Frame) string {
	// The user's Python frame where there are Python frames (pkg/pyframes).
	if site, ok := stackpkg.PythonSite(stack); ok {
		return site.String()
	}
	for _, f := range stack {
		// libcudart.so.12, libcuda.so.1, symbolized or not.
		if !strings.HasPrefix(f.Module, "libcuda") {
			return f.String()
		}
	}
	if len(stack) > 0 {
		return stack[0].String()
	}
	return "an unknown stack"
}

// human renders a byte count with a binary unit, e.g. "1.5 GiB".
func human(b float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for math.Abs(b) >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", b)
	}
	return fmt.Sprintf("%.1f %s", b, units[i])
}
