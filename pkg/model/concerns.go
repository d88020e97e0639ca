package model

import (
	"strconv"
	"time"
)

// SchedStats is the scheduler view of one process at one instant.
type SchedStats struct {
	Voluntary   uint64        // context switches since attach, all threads (monotonic)
	Involuntary uint64        // preemptions since attach, all threads (monotonic)
	Threads     []ThreadSched // per-thread totals, busiest first
	AllowedCPUs int           // CPUs in the process's affinity mask
	RunqLatency Histogram     // wake-up to on-CPU latency, cumulative since attach
}

// ThreadSched is one thread's context switches since attach.
type ThreadSched struct {
	TID         int
	Name        string
	Voluntary   uint64
	Involuntary uint64
}

// Histogram is a cumulative histogram: Counts[i] observations fell at or
// below Bounds[i] (seconds) and above Bounds[i-1]; Count and Sum cover all.
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
	Sum    float64 // seconds
}

// SockStats is the socket view of one process at one instant.
type SockStats struct {
	TCPByState map[string]int // TCP sockets by state name (ESTABLISHED, CLOSE_WAIT, ...)
	ByKind     map[string]int // live socket fds by kind (tcp, udp, unix, other) from the fd table
	CloseWait  []SockConn     // sockets sitting in CLOSE_WAIT, oldest first
}

// TCPStates names the TCP states of SockStats.TCPByState, in the kernel's
// order (include/net/tcp_states.h, from 1).
var TCPStates = []string{"ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT1", "FIN_WAIT2", "TIME_WAIT",
	"CLOSE", "CLOSE_WAIT", "LAST_ACK", "LISTEN", "CLOSING", "NEW_SYN_RECV"}

// SockKinds are the kinds of SockStats.ByKind.
var SockKinds = []string{"tcp", "udp", "unix", "other"}

// SockConn is one TCP connection of a process.
type SockConn struct {
	Local  string // ip:port
	Remote string // ip:port
	State  string
	Since  time.Time // when it entered State
	Stack  []Frame   // opening stack, from the fd table where known
	FD     int       // the process's fd for the socket (its lowest, if several)
}

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
	Failures       []CUDAFailure     // failed allocation calls since attach
	Sites          []CUDASite        // call sites: most live bytes first, then most allocated since the previous poll
	NVMLUsedBytes  uint64            // the GPU's own figure for this process (0 when NVML is absent)
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
}

// GPUUtil is how busy a process kept one device over a poll interval, the
// mean of NVML's samples in it.
type GPUUtil struct {
	Device int     // NVML index; on MIG, the parent GPU's
	MIG    *int    // on MIG, the instance's index on Device (GPU.MIG); nil on a whole GPU
	UUID   string  // the device's (a MIG instance's own on MIG)
	SM     float64 // 0..1: share of the time a kernel of the process ran
	Memory float64 // 0..1: share of the time device memory was read or written for it
	// Source says whose figure it is: UtilProcess, NVML's per-process
	// samples; UtilDevice, the whole device's, for every process on it,
	// where the device keeps no per-process samples (MIG, some vGPU).
	Source string
}

// GPUEvent is an event a device's driver reported through NVML: a fault
// (an XID error, an uncorrectable ECC error) or a change of state.
type GPUEvent struct {
	Time   time.Time
	Device int    // NVML index
	UUID   string // the device's
	Kind   string // what happened: GPUEventXID, GPUEventPState, ...
	XID    uint64 // the XID of a GPUEventXID; 0 for the other kinds
	// The MIG instance it concerns; NoInstance when not one (or the
	// whole device).
	GPUInstance, ComputeInstance uint32
}

// NoInstance is NVML's GPU or compute instance id for "not a MIG
// instance", or not known.
const NoInstance = 0xFFFFFFFF

// Kinds of GPUEvent, one per NVML event type watched; they are the type
// label of autoglm_gpu_events_total.
const (
	GPUEventXID                   = "xid"                     // XID critical error
	GPUEventDoubleBitECC          = "double_bit_ecc"          // uncorrectable device memory error
	GPUEventSingleBitECC          = "single_bit_ecc"          // corrected device memory error
	GPUEventSingleBitECCStorm     = "single_bit_ecc_storm"    // corrected errors at a high rate
	GPUEventDRAMRetirement        = "dram_retirement"         // a memory page retired or row remapped
	GPUEventDRAMRetirementFailure = "dram_retirement_failure" // retiring or remapping failed
	GPUEventNonFatalPoison        = "nonfatal_poison"         // poisoned memory consumed, contained
	GPUEventFatalPoison           = "fatal_poison"            // poisoned memory consumed, not contained
	GPUEventUnavailable           = "gpu_unavailable"         // the GPU stopped answering
	GPUEventRecoveryAction        = "gpu_recovery_action"     // the driver asks for a reset, reboot or drain
	GPUEventPState                = "pstate"                  // performance state changed
	GPUEventClock                 = "clock"                   // clocks changed
	GPUEventPowerSourceChange     = "power_source_change"     // AC or battery
	GPUEventMIGConfigChange       = "mig_config_change"       // MIG instances created or destroyed
)

// XIDKey is a device and an XID, to count the XID errors of each device.
type XIDKey struct {
	Device int
	UUID   string
	XID    uint64
}

// GPUEventKey is a device and a kind of GPUEvent, to count the events of
// each device.
type GPUEventKey struct {
	Device int
	UUID   string
	Kind   string
}

// Sources of GPUUtil.
const (
	UtilProcess = "process"
	UtilDevice  = "device"
)

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

// GPU is one device as NVML reports it.
type GPU struct {
	Index      int
	UUID       string
	Name       string
	MemoryUsed uint64
	// The least and most of the samples since the previous poll,
	// MemoryUsed among them.
	MemoryUsedMin, MemoryUsedMax uint64
	MemoryTotal                  uint64
	Utilization                  float64        // 0..1: share of the time a kernel ran
	MemoryUtilization            float64        // 0..1: share of the time device memory was read or written
	Processes                    map[int]uint64 // device memory used on this GPU, by pid
	// PerProcessUtil says whether the device keeps per-process
	// utilization samples (GPUUtil's UtilProcess); false on MIG and some
	// vGPU setups, and before the first sample.
	PerProcessUtil bool
	// MIG is, on a MIG instance, its index among the MIG devices of its
	// parent, the GPU Index; nil on a whole GPU. A MIG instance is a
	// device of its own, with its memory and its processes: a parent in
	// MIG mode lists none, lest a process count twice.
	MIG *int
	// GPUInstance is a MIG instance's GPU instance id, as nvidia-smi and
	// the events that concern the instance name it; NoInstance when not
	// known. Unset on a whole GPU.
	GPUInstance uint32
}

// Label names g in metrics (the gpu label) and messages: see DeviceLabel.
func (g GPU) Label() string { return DeviceLabel(g.Index, g.MIG) }

// Label names the device of u as GPU.Label does.
func (u GPUUtil) Label() string { return DeviceLabel(u.Device, u.MIG) }

// DeviceLabel names a device: its NVML index, "0"; a MIG instance by its
// parent's index and its own on it, "0/mig1". At most seven MIG devices
// per GPU keep the label's values few.
func DeviceLabel(index int, mig *int) string {
	if mig == nil {
		return strconv.Itoa(index)
	}
	return strconv.Itoa(index) + "/mig" + strconv.Itoa(*mig)
}
