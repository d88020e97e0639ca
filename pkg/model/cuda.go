package model

import (
	"fmt"
	"strings"
	"time"
)

// Finding kinds of the CUDA view, as they appear in reports, metrics and
// --fail-on.
const (
	KindGPUAllocBurst   = "gpu_alloc_burst"
	KindGPUMemoryLeak   = "gpu_memory_leak"
	KindGPUAllocFailure = "gpu_alloc_failure"
	KindGPUAllocChurn   = "gpu_alloc_churn"
)

// CUDAStats is the GPU-allocation view of one process at one instant.
type CUDAStats struct {
	LiveBytes  uint64 // device bytes allocated and not freed, from the kernel's live map
	LiveAllocs int    // live device allocations
	// LivePeakBytes is the most device bytes live at any instant since the
	// previous poll (that poll's and this one's values included): a
	// high-water mark the kernel keeps at every allocation, so a spike
	// between two polls is not lost.
	LivePeakBytes  uint64
	HostLiveBytes  uint64            // pinned host bytes (cudaMallocHost, cudaHostAlloc, ...) allocated and not freed; not in LiveBytes or Sites
	AllocBytes     map[string]uint64 // bytes allocated since attach, by API (monotonic)
	HostAllocBytes uint64            // pinned host bytes allocated since attach (monotonic); included in AllocBytes
	FreeBytes      map[string]uint64 // bytes freed since attach, by API (monotonic)
	AllocCalls     map[string]uint64 // allocation calls since attach, by API (monotonic)
	Calls          map[string]uint64 // every hooked call since attach, frees and cuMemMap/cuMemUnmap included, by API (monotonic)
	Failures       []CUDAFailure     // failed allocation calls since attach: the latest 1000
	// FailedCalls counts every failed allocation call since attach, by
	// API and error (monotonic).
	FailedCalls   map[CUDAFailureKind]uint64
	Sites         []CUDASite // call sites: most live bytes first, then most allocated since the previous poll
	NVMLUsedBytes uint64     // the GPU's own figure for this process (0 when NVML is absent)
	// The least and most of NVML's samples (every --gpu-interval) since
	// the previous poll, NVMLUsedBytes among them.
	NVMLMinBytes, NVMLMaxBytes uint64
	HasNVML                    bool
	UntrackedBytes             int64    // NVMLUsedBytes - LiveBytes: contexts, caching, paths not hooked
	Libraries                  []string // CUDA libraries hooked in this process
	// GPUUtil is how busy the process kept each device it ran on since the
	// previous poll, by device index; nil without NVML or any device.
	GPUUtil []GPUUtil
	// GPUEvents are the driver faults (XID errors, uncorrectable ECC
	// errors) reported since the previous poll by the devices the process
	// uses; on MIG, those of its own GPU instance and the whole device's.
	GPUEvents []GPUEvent
	// Verdict says what held its GPU back over the last window
	// (detect/inputbound): "gpu_bound" (the GPU, busy), "input_bound"
	// (the CPU side, while the GPU idled), "" (neither, or not known yet).
	Verdict string
	// VerdictHost is what the host did over the verdict's window: how
	// long it waited on the GPU. Nil without a verdict, or where the
	// host's waits are not known (the process's CUDA libraries not
	// hooked).
	VerdictHost *VerdictHost
	// Waits are the host's waits on the GPU (wait.go).
	Waits CUDAWaits
	// Launches counts kernel launches; nil unless --launches.
	Launches *CUDALaunches
	// Snapshots are the process's GPU memory at its allocation failures
	// (oom.go): the newest MaxSnapshots, oldest first, shared with
	// earlier snapshots of the model.
	Snapshots []*GPUMemorySnapshot
}

// VerdictHost is the host side of a verdict.
type VerdictHost struct {
	// WaitShare is the share of the window the thread that waited most on
	// the GPU spent waiting (CUDAWaits.Share over the window), 0..1.
	WaitShare float64
	// Confirmed says, of a gpu_bound verdict, that the host waited on the
	// GPU most of the window: the GPU was busy with the host's work, not
	// another's, and the host could not go on without it.
	Confirmed bool
}

// Active reports whether the process shows any CUDA activity; sinks show
// CUDA figures only for those.
func (c *CUDAStats) Active() bool {
	var n uint64
	for _, m := range []map[string]uint64{c.AllocBytes, c.FreeBytes, c.AllocCalls} {
		for _, v := range m {
			n += v
		}
	}
	return len(c.Libraries) > 0 || c.LiveBytes > 0 || len(c.Failures) > 0 || n > 0 || len(c.GPUUtil) > 0
}

// CUDAFailureKind is an API and the error one of its calls failed with.
type CUDAFailureKind struct{ API, Error string }

// CUDAFailure is one failed allocation.
type CUDAFailure struct {
	Time  time.Time
	API   string
	Size  uint64
	Code  int    // the return code
	Error string // its name, e.g. cudaErrorMemoryAllocation
	Stack []Frame
}

// CUDASite is one call site of device memory: the live allocations it
// made, and what went through it, from the kernel's per-site counters.
type CUDASite struct {
	StackID int64
	Stack   []Frame
	Bytes   uint64
	Allocs  []time.Time // allocation time of each live allocation made here
	// Since tracking began (monotonic); a free counts for the site of the
	// block it frees, so that memory allocated and freed between two
	// polls still has a site.
	AllocBytes, AllocCalls, FreeBytes, FreeCalls uint64
	// Allocated here since the previous poll.
	RecentBytes, RecentCalls uint64
}

// GPUAllocBurstEvidence is a gpu_alloc_burst's evidence.
type GPUAllocBurstEvidence struct {
	BaselineBytesMean    float64 `json:"baseline_bytes_mean"`
	BaselineBytesStddev  float64 `json:"baseline_bytes_stddev"`
	BurstBytes           uint64  `json:"burst_bytes"`
	BytesInWindow        uint64  `json:"bytes_in_window"`
	CallsInWindow        uint64  `json:"calls_in_window"`
	LargestBurstBytes    uint64  `json:"largest_burst_bytes"`
	LargestPeakLiveBytes uint64  `json:"largest_peak_live_bytes"`
	LiveBytes            uint64  `json:"live_bytes"`
	// NearFull is what the peak came close to; nil for nothing.
	NearFull      *string `json:"near_full"`
	Occurrences   int     `json:"occurrences"`
	PeakLiveBytes uint64  `json:"peak_live_bytes"`
	// PeriodSeconds is nil until a burst recurs.
	PeriodSeconds *float64    `json:"period_seconds"`
	StartupStep   bool        `json:"startup_step"`
	TopSites      []BurstSite `json:"top_sites"`
	WindowSeconds float64     `json:"window_seconds"`
}

// BurstSite is a call site that allocated in a burst's interval.
type BurstSite struct {
	Bytes uint64  `json:"bytes"`
	Share float64 `json:"share"` // of the interval's bytes
	Stack []Frame `json:"stack"`
}

func (e GPUAllocBurstEvidence) EvidenceKind() string { return KindGPUAllocBurst }

func (e GPUAllocBurstEvidence) Card(c Card) {
	c.Bytes("burst_bytes", "burst", e.BurstBytes)
	c.Bytes("peak_live_bytes", "peak live", e.PeakLiveBytes)
	c.Bytes("largest_burst_bytes", "largest burst", e.LargestBurstBytes)
	c.Bytes("largest_peak_live_bytes", "largest peak live", e.LargestPeakLiveBytes)
	c.Bytes("live_bytes", "live now", e.LiveBytes)
	if e.NearFull != nil {
		c.Text("near_full", "near full", *e.NearFull)
	}
	c.Count("occurrences", "occurrences", e.Occurrences)
	if e.PeriodSeconds != nil {
		c.Duration("period_seconds", "period", *e.PeriodSeconds)
	}
	c.Bytes("bytes_in_window", "allocated in its interval", e.BytesInWindow)
	c.CountUint64("calls_in_window", "calls in its interval", e.CallsInWindow)
	c.Duration("window_seconds", "window", e.WindowSeconds)
	c.MeanBytes("baseline_bytes_mean", "baseline rise", e.BaselineBytesMean, e.BaselineBytesStddev)
	c.YesNo("startup_step", "start-up step", e.StartupStep)
	var sites []Row
	for _, s := range e.TopSites {
		sites = append(sites, Row{Cells: []Cell{BytesCell(s.Bytes), ShareCell(s.Share)}, Stack: s.Stack})
	}
	c.Table("top_sites", "top sites", []string{"allocated", "share"}, sites)
}

// GPUMemoryLeakEvidence is a gpu_memory_leak's evidence.
type GPUMemoryLeakEvidence struct {
	AllocBytesSinceAttach uint64  `json:"alloc_bytes_since_attach"`
	FreeBytesSinceAttach  uint64  `json:"free_bytes_since_attach"`
	GrowthBytesPerSecond  float64 `json:"growth_bytes_per_second"`
	// HeadroomBytes and HeadroomOf are nil without NVML or a budget.
	HeadroomBytes   *uint64 `json:"headroom_bytes"`
	HeadroomOf      *string `json:"headroom_of"`
	LiveAllocations int     `json:"live_allocations"`
	LiveBytes       uint64  `json:"live_bytes"`
	// MinAgeSeconds and OldBytesAtTopSite are set on the classic window
	// only, NVMLUsedBytes and UntrackedBytes with NVML only.
	MinAgeSeconds     *float64 `json:"min_age_seconds,omitempty"`
	NVMLUsedBytes     *uint64  `json:"nvml_used_bytes,omitempty"`
	OldBytesAtTopSite *int64   `json:"old_bytes_at_top_site,omitempty"`
	TimeScaleSeconds  float64  `json:"time_scale_seconds"`
	// TimeToExhaustionSeconds is nil when no bound is known or the bytes
	// do not grow.
	TimeToExhaustionSeconds *float64      `json:"time_to_exhaustion_seconds"`
	TopSites                []GPULeakSite `json:"top_sites"`
	UntrackedBytes          *int64        `json:"untracked_bytes,omitempty"`
	WindowSeconds           float64       `json:"window_seconds"`
}

// GPULeakSite is a call site whose device allocations stay live.
type GPULeakSite struct {
	Allocations int    `json:"allocations"`
	Bytes       uint64 `json:"bytes"`
	// KeptAllocations and KeptBytes are set on the fast and slow scales,
	// OldBytesGrowth on the classic window.
	KeptAllocations  *int    `json:"kept_allocations,omitempty"`
	KeptBytes        *uint64 `json:"kept_bytes,omitempty"`
	OldBytes         int64   `json:"old_bytes"`
	OldBytesGrowth   *int64  `json:"old_bytes_growth,omitempty"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	Stack            []Frame `json:"stack"`
}

func (e GPUMemoryLeakEvidence) EvidenceKind() string { return KindGPUMemoryLeak }

func (e GPUMemoryLeakEvidence) Card(c Card) {
	c.Bytes("live_bytes", "live", e.LiveBytes)
	c.Count("live_allocations", "live allocations", e.LiveAllocations)
	c.BytesRate("growth_bytes_per_second", "growth", e.GrowthBytesPerSecond)
	if e.TimeToExhaustionSeconds != nil {
		c.Duration("time_to_exhaustion_seconds", "time to exhaustion", *e.TimeToExhaustionSeconds)
	}
	if e.HeadroomBytes != nil {
		var of string
		if e.HeadroomOf != nil {
			of = *e.HeadroomOf
		}
		c.BytesOf("headroom_bytes", "headroom", *e.HeadroomBytes, of)
	}
	c.Duration("window_seconds", "window", e.WindowSeconds)
	c.Duration("time_scale_seconds", "time scale", e.TimeScaleSeconds)
	if e.MinAgeSeconds != nil {
		c.Duration("min_age_seconds", "min age", *e.MinAgeSeconds)
	}
	if e.OldBytesAtTopSite != nil {
		c.SignedBytes("old_bytes_at_top_site", "old at top site", *e.OldBytesAtTopSite)
	}
	if e.NVMLUsedBytes != nil {
		c.Bytes("nvml_used_bytes", "NVML used", *e.NVMLUsedBytes)
	}
	if e.UntrackedBytes != nil {
		c.SignedBytes("untracked_bytes", "untracked", *e.UntrackedBytes)
	}
	c.Bytes("alloc_bytes_since_attach", "allocated since attach", e.AllocBytesSinceAttach)
	c.Bytes("free_bytes_since_attach", "freed since attach", e.FreeBytesSinceAttach)
	// Kept and old-growth columns where some site has them (they depend
	// on the scale).
	var kept, growth bool
	for _, s := range e.TopSites {
		kept = kept || s.KeptAllocations != nil || s.KeptBytes != nil
		growth = growth || s.OldBytesGrowth != nil
	}
	head := []string{"live", "allocations", "old", "oldest"}
	if kept {
		head = append(head, "kept", "kept allocations")
	}
	if growth {
		head = append(head, "old growth")
	}
	var sites []Row
	for _, s := range e.TopSites {
		cells := []Cell{BytesCell(s.Bytes), CountCell(s.Allocations), SignedBytesCell(s.OldBytes), DurationCell(s.OldestAgeSeconds)}
		if kept {
			cells = append(cells, optionalCell(s.KeptBytes, BytesCell), optionalCell(s.KeptAllocations, CountCell))
		}
		if growth {
			cells = append(cells, optionalCell(s.OldBytesGrowth, BytesChangeCell))
		}
		sites = append(sites, Row{Cells: cells, Stack: s.Stack})
	}
	c.Table("top_sites", "top sites", head, sites)
}

// GPUAllocFailureEvidence is a gpu_alloc_failure's evidence.
type GPUAllocFailureEvidence struct {
	API          string    `json:"api"`
	Code         int       `json:"code"`
	Count        int       `json:"count"`
	Error        string    `json:"error"`
	FirstFailure time.Time `json:"first_failure"`
	LastFailure  time.Time `json:"last_failure"`
	LiveBytes    uint64    `json:"live_bytes"`
	MaxSizeBytes uint64    `json:"max_size_bytes"`
	SizeBytes    uint64    `json:"size_bytes"` // the latest
	// Snapshot is the process's GPU memory at the first of these
	// failures that one was taken at (oom.go); nil when none was (the
	// process not tracked then, not out of memory).
	Snapshot *GPUMemorySnapshot `json:"snapshot,omitempty"`
	// Snapshots counts the snapshots taken at these failures: the first,
	// then at most one a SnapshotEvery.
	Snapshots int `json:"snapshots,omitempty"`
}

func (e GPUAllocFailureEvidence) EvidenceKind() string { return KindGPUAllocFailure }

func (e GPUAllocFailureEvidence) Card(c Card) {
	c.Text("api", "call", e.API)
	c.Text("error", "error", fmt.Sprintf("%s (%d)", e.Error, e.Code))
	c.Bytes("size_bytes", "size", e.SizeBytes)
	c.Bytes("max_size_bytes", "largest size", e.MaxSizeBytes)
	c.Count("count", "failures", e.Count)
	c.Time("first_failure", "first", e.FirstFailure)
	c.Time("last_failure", "last", e.LastFailure)
	c.Bytes("live_bytes", "live", e.LiveBytes)
	// Older reports' failures have no snapshot: their cards end here.
	if e.Snapshots > 0 {
		c.Count("snapshots", "memory snapshots", e.Snapshots)
	}
	if e.Snapshot != nil {
		e.Snapshot.card(c)
	}
}

// GPUAllocChurnEvidence is a gpu_alloc_churn's evidence.
type GPUAllocChurnEvidence struct {
	BytesPerSecond     float64           `json:"bytes_per_second"`
	HeldBytes          uint64            `json:"held_bytes"`
	LiveBytes          uint64            `json:"live_bytes"`
	MaxPairsPerSecond  float64           `json:"max_pairs_per_second"`
	PairsPerSecond     float64           `json:"pairs_per_second"`
	SynchronizingFrees map[string]uint64 `json:"synchronizing_frees"`
	TopSites           []ChurnSite       `json:"top_sites"`
}

// ChurnSite is a call site of a churning loop.
type ChurnSite struct {
	CaughtLive int     `json:"caught_live"`
	Stack      []Frame `json:"stack"`
}

func (e GPUAllocChurnEvidence) EvidenceKind() string { return KindGPUAllocChurn }

func (e GPUAllocChurnEvidence) Card(c Card) {
	c.Rate("pairs_per_second", "alloc/free pairs", e.PairsPerSecond, "pairs/s")
	c.Rate("max_pairs_per_second", "most pairs", e.MaxPairsPerSecond, "pairs/s")
	c.BytesRate("bytes_per_second", "allocated", e.BytesPerSecond)
	c.Bytes("held_bytes", "held at most", e.HeldBytes)
	c.Bytes("live_bytes", "live", e.LiveBytes)
	c.Counts("synchronizing_frees", "synchronizing frees", e.SynchronizingFrees)
	var sites []Row
	for _, s := range e.TopSites {
		sites = append(sites, Row{Cells: []Cell{CountCell(s.CaughtLive)}, Stack: s.Stack})
	}
	c.Table("top_sites", "top sites", []string{"caught live"}, sites)
}

// The evidence of the view's kinds reads into their structs.
func init() {
	registerEvidence[GPUAllocBurstEvidence]()
	registerEvidence[GPUMemoryLeakEvidence]()
	registerEvidence[GPUAllocFailureEvidence]()
	registerEvidence[GPUAllocChurnEvidence]()
}

// The CUDA view's series in a report's history, and its chart.
const (
	SeriesGPULiveBytes = "gpu_live_bytes" // live device bytes; max is the kernel's high-water mark

	ChartGPUMemory = "gpu_memory" // processes with CUDA activity only

	// SeriesCUDAWaitShare is the share of each interval the most waiting
	// thread spent in synchronising CUDA calls (CUDAWaits.Share), drawn
	// on the GPU utilization chart: the other side of a GPU-bound job.
	SeriesCUDAWaitShare = "cuda_wait_share_ratio"
)

// waitsByAPI sums the waits of c's sites by API: calls and seconds.
func waitsByAPI(c *CUDAStats) (calls map[string]uint64, seconds map[string]float64) {
	calls, seconds = map[string]uint64{}, map[string]float64{}
	for _, s := range c.Waits.Sites {
		calls[s.API] += s.Calls
		seconds[s.API] += s.Seconds
	}
	return calls, seconds
}

// cudaSamples adds p's values from of, only for processes with CUDA
// activity: fewer series.
func cudaSamples(of func(c *CUDAStats, add func(float64, ...string))) func(*Process, func(float64, ...string)) {
	return func(p *Process, add func(float64, ...string)) {
		if p.CUDA.Active() {
			of(&p.CUDA, add)
		}
	}
}

var cudaShown = Shown{
	View: "cuda",
	Metrics: []Metric{
		{Name: "autoglm_cuda_alloc_bytes_total", Help: "Bytes allocated through hooked CUDA calls since attach, by API.", Type: CounterMetric, Labels: []string{"api"},
			Samples: cudaSamples(func(c *CUDAStats, add func(float64, ...string)) { each(c.AllocBytes, add) })},
		{Name: "autoglm_cuda_free_bytes_total", Help: "Bytes freed through hooked CUDA calls since attach, by API.", Type: CounterMetric, Labels: []string{"api"},
			Samples: cudaSamples(func(c *CUDAStats, add func(float64, ...string)) { each(c.FreeBytes, add) })},
		{Name: "autoglm_cuda_alloc_calls_total", Help: "Hooked CUDA allocation calls since attach, by API.", Type: CounterMetric, Labels: []string{"api"},
			Samples: cudaSamples(func(c *CUDAStats, add func(float64, ...string)) { each(c.AllocCalls, add) })},
		{Name: "autoglm_cuda_live_bytes", Help: "Bytes allocated through hooked CUDA calls and not freed.", Type: GaugeMetric,
			Samples: cudaSamples(func(c *CUDAStats, add func(float64, ...string)) { add(float64(c.LiveBytes)) })},
		{Name: "autoglm_cuda_alloc_failures_total", Help: "Failed CUDA allocation calls since attach, by API and error.", Type: CounterMetric, Labels: []string{"api", "error"},
			Samples: cudaSamples(func(c *CUDAStats, add func(float64, ...string)) {
				for k, n := range c.FailedCalls {
					add(float64(n), k.API, k.Error)
				}
			})},
		{Name: "autoglm_cuda_untracked_bytes", Help: "Device memory NVML reports for the process minus the bytes the CUDA hooks see live.", Type: GaugeMetric,
			Samples: cudaSamples(func(c *CUDAStats, add func(float64, ...string)) {
				if c.HasNVML {
					add(float64(c.UntrackedBytes))
				}
			})},
		{Name: "autoglm_cuda_sync_calls_total", Help: "Synchronising CUDA calls (the host waiting on the GPU: cudaStreamSynchronize, synchronous cudaMemcpy, ...) since attach, by API; a driver call made inside a runtime call counts once, under the runtime's.", Type: CounterMetric, Labels: []string{"api"},
			Samples: cudaSamples(func(c *CUDAStats, add func(float64, ...string)) {
				calls, _ := waitsByAPI(c)
				each(calls, add)
			})},
		{Name: "autoglm_cuda_sync_wait_seconds_total", Help: "Time the process's threads waited in synchronising CUDA calls since attach, by API.", Type: CounterMetric, Labels: []string{"api"},
			Samples: cudaSamples(func(c *CUDAStats, add func(float64, ...string)) {
				_, secs := waitsByAPI(c)
				for api, v := range secs {
					add(v, api)
				}
			})},
		{Name: "autoglm_cuda_sync_wait_seconds", Help: "Each synchronising CUDA call's wait since attach, all APIs.", Type: HistogramMetric,
			Histogram: func(p *Process) (Histogram, bool) {
				return p.CUDA.Waits.Histogram, p.CUDA.Active() && p.CUDA.Waits.Calls > 0
			}},
		{Name: "autoglm_cuda_launches_total", Help: "CUDA kernel launches since attach, by API (hooked only with --launches).", Type: CounterMetric, Labels: []string{"api"},
			Samples: cudaSamples(func(c *CUDAStats, add func(float64, ...string)) {
				if c.Launches != nil {
					each(c.Launches.Calls, add)
				}
			})},
		{Name: "autoglm_cuda_launch_seconds", Help: "Each CUDA kernel launch call's latency since attach (hooked only with --launches).", Type: HistogramMetric,
			Histogram: func(p *Process) (Histogram, bool) {
				if l := p.CUDA.Launches; l != nil && p.CUDA.Active() && l.Histogram.Count > 0 {
					return l.Histogram, true
				}
				return Histogram{}, false
			}},
	},
	Figures: []Figure{
		// The kernel's mark is at least the live bytes at this poll; the
		// least is known at polls only.
		{Name: SeriesGPULiveBytes, Unit: UnitBytes, Kind: Gauge, Value: func(p *Process) (Range, bool) {
			c := &p.CUDA
			live := float64(c.LiveBytes)
			return Range{Min: live, Max: float64(max(c.LivePeakBytes, c.LiveBytes)), Last: live}, c.Active()
		}},
		// Known at polls only: the share of the interval since the
		// previous one.
		{Name: SeriesCUDAWaitShare, Unit: UnitRatio, Kind: Gauge, Value: func(p *Process) (Range, bool) {
			return At(p.CUDA.Waits.Share), p.CUDA.Active() && p.CUDA.Waits.Calls > 0
		}},
	},
	// GPU memory right after the fds, for the processes that use it:
	// what this tool is mostly pointed at.
	Charts: []Chart{
		{ID: ChartGPUMemory, Title: "GPU memory: tracked allocations vs NVML", Unit: UnitBytes, Optional: true, Rank: 10,
			Lines: []Line{{Series: SeriesGPULiveBytes, Label: "tracked live (eBPF)", Color: "blue", Band: "peak between polls"},
				{Series: SeriesNVMLUsedBytes, Label: "NVML per process", Color: "orange", Band: "least–most of NVML samples"}},
			// Every process on a GPU has the memory chart; not every
			// GPU keeps per-process utilization.
			Marks: []string{KindGPUAllocBurst, KindGPUMemoryLeak, KindGPUAllocFailure, KindGPUAllocChurn, KindGPUXID, KindGPUECCError}},
	},
	State: func(p *Process) string {
		if !p.CUDA.Active() {
			return ""
		}
		return " gpu_live=" + strings.ReplaceAll(IEC(p.CUDA.LiveBytes), " ", "")
	},
	Line: func(p *Process) string {
		c := &p.CUDA
		if !c.Active() {
			return ""
		}
		s := fmt.Sprintf("pid %d (%s) GPU memory: %s live in %d allocations", p.PID, p.Comm, IEC(c.LiveBytes), c.LiveAllocs)
		if c.HasNVML {
			s += fmt.Sprintf(", %s per NVML", IEC(c.NVMLUsedBytes))
		}
		if n := len(c.Failures); n > 0 {
			s += fmt.Sprintf(", %d failed allocations", n)
		}
		if w := &c.Waits; w.Calls > 0 {
			s += fmt.Sprintf("; waited on the GPU %.3gs in %d synchronising calls", w.Seconds, w.Calls)
		}
		return s
	},
}
