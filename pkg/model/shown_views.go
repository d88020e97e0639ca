package model

import (
	"fmt"
	"strings"
)

// Series names of the history, as they appear in a report's history.
const (
	SeriesOpenFDs             = "open_fds"                        // gauge, fds
	SeriesFDsOpened           = "fds_opened_per_second"           // rate, all kinds together
	SeriesFDsClosed           = "fds_closed_per_second"           // rate
	SeriesVoluntarySwitches   = "voluntary_switches_per_second"   // rate
	SeriesInvoluntarySwitches = "involuntary_switches_per_second" // rate
	SeriesRunqueueP99         = "runqueue_p99_seconds"            // the p99 of the waits within each interval
	// SeriesTCPPrefix + a state as the kernel names it (TCP_CLOSE_WAIT
	// is "tcp_CLOSE_WAIT"): sockets the process holds in that state.
	SeriesTCPPrefix     = "tcp_"
	SeriesGPULiveBytes  = "gpu_live_bytes"  // live device bytes; max is the kernel's high-water mark
	SeriesNVMLUsedBytes = "nvml_used_bytes" // NVML's figure for the process, every --gpu-interval
	// How busy the process kept its GPUs over the interval (the mean over
	// the devices it used), per NVML.
	SeriesGPUSMUtil  = "gpu_sm_utilization_ratio"
	SeriesGPUMemUtil = "gpu_memory_controller_utilization_ratio"
)

// Chart ids of the process section.
const (
	ChartOpenFDs         = "open_fds"
	ChartFDRates         = "fd_rates"
	ChartContextSwitches = "context_switches"
	ChartRunqueue        = "runqueue_p99"
	ChartTCP             = "tcp_sockets"
	ChartGPUMemory       = "gpu_memory"      // processes with CUDA activity only
	ChartGPUUtil         = "gpu_utilization" // processes NVML saw on a GPU only
)

var fdShown = Shown{
	View: "fd",
	Metrics: []Metric{
		{Name: "autoglm_open_fds", Help: "Live file descriptors of the process.", Type: GaugeMetric,
			Samples: func(p *Process, add func(float64, ...string)) { add(float64(p.FD.Open)) }},
		{Name: "autoglm_fd_limit", Help: "Soft RLIMIT_NOFILE of the process.", Type: GaugeMetric,
			Samples: func(p *Process, add func(float64, ...string)) { add(float64(p.FD.Limit)) }},
		{Name: "autoglm_fds_opened_total", Help: "File descriptors created since attach, by kind.", Type: CounterMetric, Labels: []string{"kind"},
			Samples: func(p *Process, add func(float64, ...string)) { each(p.FD.Opened, add) }},
		{Name: "autoglm_fds_closed_total", Help: "File descriptors released since attach, by kind.", Type: CounterMetric, Labels: []string{"kind"},
			Samples: func(p *Process, add func(float64, ...string)) { each(p.FD.Closed, add) }},
		// Set by the fd view with every errno, zeros included.
		{Name: "autoglm_fd_create_failures_total", Help: "fd-creating calls that failed since attach because the process (EMFILE) or the system (ENFILE) was out of fds.",
			Type: CounterMetric, Labels: []string{"errno"},
			Samples: func(p *Process, add func(float64, ...string)) { each(p.FD.Failed, add) }},
	},
	Figures: []Figure{
		{Name: SeriesOpenFDs, Unit: UnitFDs, Kind: Gauge, Value: func(p *Process) (Range, bool) { return At(float64(p.FD.Open)), true }},
		{Name: SeriesFDsOpened, Unit: UnitFDRate, Kind: Rate, Value: func(p *Process) (Range, bool) { return At(float64(Sum(p.FD.Opened))), true }},
		{Name: SeriesFDsClosed, Unit: UnitFDRate, Kind: Rate, Value: func(p *Process) (Range, bool) { return At(float64(Sum(p.FD.Closed))), true }},
	},
	Charts: []Chart{
		{ID: ChartOpenFDs, Title: "Open file descriptors", Unit: UnitFDs, FDLimit: true, Rank: 0,
			Lines: []Line{{Series: SeriesOpenFDs, Label: "open fds", Color: "blue"}},
			Marks: []string{KindFDLeak, KindFDExhausted}},
		{ID: ChartFDRates, Title: "File descriptors opened and closed", Unit: UnitFDRate, Rank: 30,
			Lines: []Line{{Series: SeriesFDsOpened, Label: "opened", Color: "green"}, {Series: SeriesFDsClosed, Label: "closed", Color: "grey"}}},
	},
}

// observed says whether the sched view observed p: it always sets the
// bounds, and without them zeros would be made up.
func observed(p *Process) bool { return len(p.Sched.RunqLatency.Bounds) > 0 }

var schedShown = Shown{
	View: "sched",
	Metrics: []Metric{
		{Name: "autoglm_context_switches_total", Help: "Context switches of the process's threads since attach, by type (voluntary: blocked; involuntary: preempted).",
			Type: CounterMetric, Labels: []string{"type"},
			Samples: func(p *Process, add func(float64, ...string)) {
				if observed(p) {
					add(float64(p.Sched.Voluntary), "voluntary")
					add(float64(p.Sched.Involuntary), "involuntary")
				}
			}},
		{Name: "autoglm_runqueue_latency_seconds", Help: "Time the process's threads waited runnable for a CPU, from wake-up or preemption, since attach.",
			Type: HistogramMetric, Histogram: func(p *Process) (Histogram, bool) { return p.Sched.RunqLatency, observed(p) }},
	},
	Figures: []Figure{
		{Name: SeriesVoluntarySwitches, Unit: UnitSwitches, Kind: Rate, Value: func(p *Process) (Range, bool) { return At(float64(p.Sched.Voluntary)), true }},
		{Name: SeriesInvoluntarySwitches, Unit: UnitSwitches, Kind: Rate, Value: func(p *Process) (Range, bool) { return At(float64(p.Sched.Involuntary)), true }},
		{Name: SeriesRunqueueP99, Unit: UnitSeconds, Kind: Quantile, Q: 0.99, Histogram: func(p *Process) Histogram { return p.Sched.RunqLatency }},
	},
	Charts: []Chart{
		{ID: ChartContextSwitches, Title: "Context switches", Unit: UnitSwitches, Rank: 40,
			Lines: []Line{{Series: SeriesVoluntarySwitches, Label: "voluntary", Color: "purple"}, {Series: SeriesInvoluntarySwitches, Label: "involuntary", Color: "orange"}},
			Marks: []string{KindCtxSwitchStorm}},
		{ID: ChartRunqueue, Title: "Run-queue latency, p99 of each interval", Unit: UnitSeconds, Empty: "no run-queue waits seen", Rank: 50,
			Lines: []Line{{Series: SeriesRunqueueP99, Label: "p99 wait", Color: "teal"}}},
	},
	Columns: []Column{{Head: "CS/S", Count: func(p *Process) uint64 { return p.Sched.Voluntary + p.Sched.Involuntary }}},
}

var sockShown = Shown{
	View: "sock",
	Metrics: []Metric{
		// The states it holds sockets in: a process has a few of the
		// twelve, and zeros would be most of the node's series (a state it
		// no longer holds goes stale).
		{Name: "autoglm_sockets", Help: "TCP sockets the process holds, by state; states it holds none in are left out.", Type: GaugeMetric, Labels: []string{"state"},
			Samples: func(p *Process, add func(float64, ...string)) {
				for _, st := range TCPStates {
					if n := p.Sock.TCPByState[st]; n > 0 {
						add(float64(n), st)
					}
				}
			}},
		// Every kind, zeros included, once the view filled them.
		{Name: "autoglm_socket_fds", Help: "Socket file descriptors of the process, by kind (tcp, udp, unix, other).", Type: GaugeMetric, Labels: []string{"kind"},
			Samples: func(p *Process, add func(float64, ...string)) {
				if p.Sock.ByKind != nil {
					for _, k := range SockKinds {
						add(float64(p.Sock.ByKind[k]), k)
					}
				}
			}},
	},
	Figures: []Figure{
		{Name: SeriesTCPPrefix, Unit: UnitSockets, Kind: Gauge, Members: func(p *Process) map[string]int { return p.Sock.TCPByState }},
	},
	Charts: []Chart{
		{ID: ChartTCP, Title: "TCP sockets by state", Unit: UnitSockets, Empty: "no TCP sockets", Rank: 60, Lines: tcpLines(),
			Marks: []string{KindSocketLeak}},
	},
}

// tcpLines are the lines of the TCP chart, one per state in the kernel's
// order.
func tcpLines() []Line {
	palette := []string{"blue", "green", "purple", "brown", "pink", "teal", "orange", "grey"}
	var out []Line
	for i, st := range TCPStates {
		color := palette[i%len(palette)]
		if st == "CLOSE_WAIT" {
			color = "red" // the state a socket leak piles up in
		}
		out = append(out, Line{Series: SeriesTCPPrefix + st, Label: st, Color: color})
	}
	return out
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
	},
	Figures: []Figure{
		// The kernel's mark is at least the live bytes at this poll; the
		// least is known at polls only.
		{Name: SeriesGPULiveBytes, Unit: UnitBytes, Kind: Gauge, Value: func(p *Process) (Range, bool) {
			c := &p.CUDA
			live := float64(c.LiveBytes)
			return Range{Min: live, Max: float64(max(c.LivePeakBytes, c.LiveBytes)), Last: live}, c.Active()
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
		return s
	},
}

var nvmlShown = Shown{
	View: "nvml",
	Figures: []Figure{
		{Name: SeriesNVMLUsedBytes, Unit: UnitBytes, Kind: Gauge, Value: func(p *Process) (Range, bool) {
			c := &p.CUDA
			used := c.NVMLUsedBytes
			return Range{Min: float64(min(c.NVMLMinBytes, used)), Max: float64(max(c.NVMLMaxBytes, used)), Last: float64(used)}, c.HasNVML
		}},
		{Name: SeriesGPUSMUtil, Unit: UnitRatio, Kind: Gauge, Value: func(p *Process) (Range, bool) {
			return meanUtil(p, func(u GPUUtil) float64 { return u.SM })
		}},
		{Name: SeriesGPUMemUtil, Unit: UnitRatio, Kind: Gauge, Value: func(p *Process) (Range, bool) {
			return meanUtil(p, func(u GPUUtil) float64 { return u.Memory })
		}},
	},
	Charts: []Chart{
		{ID: ChartGPUUtil, Title: "GPU utilization (NVML, per process)", Unit: UnitRatio, Optional: true, Rank: 20,
			Lines: []Line{{Series: SeriesGPUSMUtil, Label: "SM (kernels running)", Color: "green"}, {Series: SeriesGPUMemUtil, Label: "memory controller", Color: "purple"}},
			Marks: []string{KindGPUInputBound}}, // it needs the utilization this chart shows
	},
}

// meanUtil is the mean of one utilization figure over the devices p used.
func meanUtil(p *Process, of func(GPUUtil) float64) (Range, bool) {
	n := len(p.CUDA.GPUUtil)
	if n == 0 {
		return Range{}, false
	}
	var sum float64
	for _, u := range p.CUDA.GPUUtil {
		sum += of(u)
	}
	return At(sum / float64(n)), true
}

// each adds every count of m, labelled with its key.
func each(m map[string]uint64, add func(float64, ...string)) {
	for k, n := range m {
		add(float64(n), k)
	}
}

// Sum adds up a map of counts.
func Sum(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}

// IEC renders a byte count with a binary unit, e.g. "1.5 GiB".
func IEC(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTP"[exp])
}
