package model

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Finding kinds of the NVML view, as they appear in reports, metrics and
// --fail-on.
const (
	KindGPUXID        = "gpu_xid"
	KindGPUECCError   = "gpu_ecc_error"
	KindGPUInputBound = "gpu_input_bound"
)

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
	// Processes are those on the device it concerns (on MIG, on its GPU
	// instance, or on any instance for a fault of the whole GPU) in the
	// window it came in, by pid; a fault's only (nil for the other kinds).
	Processes []DeviceProcess
}

// DeviceProcess is a process NVML listed on a device.
type DeviceProcess struct {
	PID  int    `json:"pid"`
	Comm string `json:"comm,omitempty"` // of a watched process; "" for one not watched
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

// Classes of XID (GPUXIDEvidence.Class), after NVIDIA's XID catalogue
// (detect/gpuxid holds which XID is of which).
const (
	// XIDApplication: a fault of the application's own kernels (an
	// illegal address, an exception), or the cleanup after one; the GPU
	// is fine.
	XIDApplication = "application"
	// XIDDevice: a fault of the device (its memory, driver or firmware,
	// NVLink or bus); every process on it is affected.
	XIDDevice = "device"
	// XIDUnknown: an XID not classified here.
	XIDUnknown = "unknown"
)

// GPUXIDEvidence is a gpu_xid's evidence.
type GPUXIDEvidence struct {
	Class        string        `json:"class"`
	Count        int           `json:"count"`
	Device       int           `json:"device"`
	FirstAt      time.Time     `json:"first_at"`
	LastAt       time.Time     `json:"last_at"`
	Meaning      string        `json:"meaning"`
	MIGInstances []MIGInstance `json:"mig_instances,omitempty"`
	// Processes are those on the device (on MIG, on the instance) while
	// it reported the XID, by pid.
	Processes []DeviceProcess `json:"processes,omitempty"`
	UUID      string          `json:"uuid"`
	XID       uint64          `json:"xid"`
}

func (e GPUXIDEvidence) EvidenceKind() string { return KindGPUXID }

func (e GPUXIDEvidence) Card(c Card) {
	c.CountUint64("xid", "XID", e.XID)
	c.Text("class", "class", e.Class)
	c.Text("meaning", "meaning", e.Meaning)
	gpuFaultCard(c, e.Device, e.UUID, e.Count, e.FirstAt, e.LastAt, e.MIGInstances)
	var rows []Row
	for _, p := range e.Processes {
		comm := p.Comm
		if comm == "" {
			comm = "(not watched)"
		}
		rows = append(rows, Row{Cells: []Cell{CountCell(p.PID), TextCell(comm)}})
	}
	c.Table("processes", "processes on the device", []string{"pid", "comm"}, rows)
}

// GPUECCEvidence is a gpu_ecc_error's evidence.
type GPUECCEvidence struct {
	Count        int           `json:"count"`
	Device       int           `json:"device"`
	FirstAt      time.Time     `json:"first_at"`
	LastAt       time.Time     `json:"last_at"`
	MIGInstances []MIGInstance `json:"mig_instances,omitempty"`
	UUID         string        `json:"uuid"`
}

// MIGInstance is a MIG instance a fault was reported on.
type MIGInstance struct {
	ComputeInstance uint32 `json:"compute_instance"`
	GPUInstance     uint32 `json:"gpu_instance"`
}

func (e GPUECCEvidence) EvidenceKind() string { return KindGPUECCError }

func (e GPUECCEvidence) Card(c Card) {
	gpuFaultCard(c, e.Device, e.UUID, e.Count, e.FirstAt, e.LastAt, e.MIGInstances)
}

// gpuFaultCard writes what the cards of a device's faults (XID and ECC
// errors) share: the device, how often and when, on which MIG instances.
func gpuFaultCard(c Card, device int, uuid string, count int, first, last time.Time, mig []MIGInstance) {
	c.Count("device", "device", device)
	c.Text("uuid", "uuid", uuid)
	c.Count("count", "count", count)
	c.Time("first_at", "first", first)
	c.Time("last_at", "last", last)
	var inst []string
	for _, m := range mig {
		inst = append(inst, fmt.Sprintf("GI %d CI %d", m.GPUInstance, m.ComputeInstance))
	}
	c.Text("mig_instances", "MIG instances", strings.Join(inst, ", "))
}

// GPUInputBoundEvidence is a gpu_input_bound's evidence.
type GPUInputBoundEvidence struct {
	// HostWaitShare is the share of the window the host waited on the GPU
	// (the thread that waited most); absent where the waits are not known,
	// and in reports from before they were.
	HostWaitShare     *float64         `json:"host_wait_share,omitempty"`
	SMUtilizationMean float64          `json:"sm_utilization_mean"`
	StarvedShare      float64          `json:"starved_share"`
	Verdict           string           `json:"verdict"`
	Waiting           []WaitingProcess `json:"waiting"`
	WindowSeconds     float64          `json:"window_seconds"`
}

// WaitingProcess is a process that waited for a CPU while the GPU idled.
type WaitingProcess struct {
	AllowedCPUs    int             `json:"allowed_cpus"`
	Comm           string          `json:"comm"`
	PID            int             `json:"pid"`
	Role           string          `json:"role"` // "itself" or "child"
	RunqP99Seconds float64         `json:"runq_p99_seconds"`
	Threads        []WaitingThread `json:"threads"`
}

// WaitingThread is a thread of a waiting process, by how often it was
// preempted.
type WaitingThread struct {
	Name      string `json:"name"`
	Preempted uint64 `json:"preempted"`
	TID       int    `json:"tid"`
}

func (e GPUInputBoundEvidence) EvidenceKind() string { return KindGPUInputBound }

func (e GPUInputBoundEvidence) Card(c Card) {
	c.Text("verdict", "verdict", e.Verdict)
	c.Share("sm_utilization_mean", "SM utilization", e.SMUtilizationMean)
	if e.HostWaitShare != nil {
		c.Share("host_wait_share", "host waiting on the GPU", *e.HostWaitShare)
	}
	c.Share("starved_share", "intervals starved", e.StarvedShare)
	c.Duration("window_seconds", "window", e.WindowSeconds)
	var waiting []Row
	for _, w := range e.Waiting {
		var lines []string
		for _, t := range w.Threads {
			lines = append(lines, fmt.Sprintf("%s (tid %d) preempted %d times", t.Name, t.TID, t.Preempted))
		}
		waiting = append(waiting, Row{Cells: []Cell{CountCell(w.PID), TextCell(w.Comm), TextCell(w.Role), DurationCell(w.RunqP99Seconds), CountCell(w.AllowedCPUs)}, Lines: lines})
	}
	c.Table("waiting", "waiting for a CPU", []string{"pid", "comm", "role", "run-queue p99", "CPUs"}, waiting)
}

// The evidence of the view's kinds reads into their structs.
func init() {
	registerEvidence[GPUXIDEvidence]()
	registerEvidence[GPUECCEvidence]()
	registerEvidence[GPUInputBoundEvidence]()
}

// NVML's series of a process in a report's history, and its chart.
const (
	SeriesNVMLUsedBytes = "nvml_used_bytes" // NVML's figure for the process, every --gpu-interval
	// How busy the process kept its GPUs over the interval (the mean over
	// the devices it used), per NVML.
	SeriesGPUSMUtil  = "gpu_sm_utilization_ratio"
	SeriesGPUMemUtil = "gpu_memory_controller_utilization_ratio"

	ChartGPUUtil = "gpu_utilization" // processes NVML saw on a GPU only
)

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
			Lines: []Line{{Series: SeriesGPUSMUtil, Label: "SM (kernels running)", Color: "green"}, {Series: SeriesGPUMemUtil, Label: "memory controller", Color: "purple"},
				// The host side beside it (pkg/model/cuda.go): a GPU-bound
				// loop waits on the GPU most of the time.
				{Series: SeriesCUDAWaitShare, Label: "host waiting on the GPU (busiest thread)", Color: "orange"}},
			// Both are judged on what this chart shows: the GPU's
			// utilization, and for a sync storm the host's waits.
			Marks: []string{KindGPUInputBound, KindGPUSyncStorm}},
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
