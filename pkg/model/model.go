// Package model holds the data that flows through the pipeline: what a source
// observed about each process in one interval, and what detectors concluded.
// Sources fill it, detectors read it, sinks (terminal, JSON, Prometheus) show it.
package model

import "time"

// Kinds lists every finding kind, for flag validation and metric pre-creation;
// each view's file (fd.go, sock.go, ...) declares its own.
var Kinds = []string{KindFDLeak, KindFDExhausted, KindSocketLeak, KindCtxSwitchStorm, KindGPUAllocBurst, KindGPUMemoryLeak, KindGPUAllocFailure, KindGPUAllocChurn, KindGPUXID, KindGPUECCError, KindGPUInputBound, KindGPUSyncStorm, KindNCCLStraggler, KindNCCLHang}

// Severities, lowest first.
const (
	SeverityInfo     = "info"
	SeverityWarning  = "warning"
	SeverityCritical = "critical"
)

// SeverityLevel orders severities: 1 info, 2 warning, 3 critical, 0 for
// anything else. /metrics serves a finding's severity as this number, so
// that its series keeps its identity when it escalates.
func SeverityLevel(s string) int {
	switch s {
	case SeverityInfo:
		return 1
	case SeverityWarning:
		return 2
	case SeverityCritical:
		return 3
	}
	return 0
}

// Finding is one detector verdict about one process.
type Finding struct {
	Kind      string    `json:"kind"`
	PID       int       `json:"pid"`
	Comm      string    `json:"comm"`
	Severity  string    `json:"severity"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	Active    bool      `json:"active"`
	Summary   string    `json:"summary"`
	Stack     []Frame   `json:"stack"`
	// Evidence is the struct of Kind (its view's file), held by value: what
	// adds to it sets a changed copy, as a finding's evidence may be
	// shared with an earlier snapshot's.
	Evidence Evidence `json:"evidence"`
	// CausedBy names the finding that explains this one, which is then
	// not a problem of its own (an fd leak made of CLOSE_WAIT sockets is
	// the socket leak's); nil for a finding that stands on its own.
	CausedBy *FindingRef `json:"caused_by,omitempty"`
	// Related names other findings about the same process that this one
	// explains or that bear on it.
	Related []FindingRef `json:"related,omitempty"`
}

// FindingRef points at a finding: kind, pid and first sighting identify one.
type FindingRef struct {
	Kind      string    `json:"kind"`
	PID       int       `json:"pid"`
	FirstSeen time.Time `json:"first_seen"`
}

// Ref returns the reference to f.
func (f *Finding) Ref() FindingRef {
	return FindingRef{Kind: f.Kind, PID: f.PID, FirstSeen: f.FirstSeen}
}

// Pod says where a process runs in Kubernetes; empty outside a pod.
type Pod struct {
	UID         string `json:"pod_uid,omitempty"`      // canonical dashed pod UID, from the cgroup
	ContainerID string `json:"container_id,omitempty"` // 64-hex container id, from the cgroup
	Namespace   string `json:"namespace,omitempty"`    // from the API server, when reachable
	Name        string `json:"pod,omitempty"`
	Container   string `json:"container,omitempty"`
	// Cgroup is the process's cgroup path (podinfo.Cgroup.Path): outside
	// a pod, the unit its series are summed by (a Slurm job step, a
	// systemd service, a login session).
	Cgroup string `json:"cgroup,omitempty"`
}

// Process is what the pipeline knows about one target at one instant.
type Process struct {
	PID     int
	PPID    int // its parent when watching began
	Comm    string
	Pod     Pod
	Started time.Time // when watching began
	Exited  bool      // the process has gone; this is its last snapshot
	FD      FDStats
	Sched   SchedStats
	Sock    SockStats
	CUDA    CUDAStats
	NCCL    NCCLStats
}

// Events counts what the kernel saw the process do since watching began:
// fds created and released, context switches and hooked CUDA calls.
func (p *Process) Events() uint64 {
	var n uint64
	for _, m := range []map[string]uint64{p.FD.Opened, p.FD.Closed, p.CUDA.Calls} {
		for _, v := range m {
			n += v
		}
	}
	return n + p.Sched.Voluntary + p.Sched.Involuntary
}

// TrackFailure is a view that could not follow a process, and why: an
// errno's name (EPERM, ENOENT, ...) or "other".
type TrackFailure struct {
	View, Reason string
}

// Snapshot is the whole state after one interval; sinks receive one per interval.
type Snapshot struct {
	Time      time.Time
	Start     time.Time         // when the run began
	Targets   []int             // pids asked for
	Processes []*Process        // watched processes, including those that exited this interval
	Findings  []Finding         // every finding so far, active or not
	Lost      map[string]uint64 // lost events and failed map updates, by source (monotonic)
	// Refused counts what watched processes presented over a parser's
	// bounds and was not read (their frames left out), by parser;
	// monotonic. Not losses: any process can make them.
	Refused map[string]uint64
	// TrackFailures counts the processes a view could not follow (the
	// others watched them on), by view and reason; monotonic.
	TrackFailures map[TrackFailure]uint64
	GPUs          []GPU // devices as NVML last reported them; nil without NVML
	// GPUXIDs counts the XID errors each device reported since the start,
	// watched processes on it or not (monotonic).
	GPUXIDs map[XIDKey]uint64
	// GPUEventCounts counts the NVML events each device reported since
	// the start, by kind, XIDs among them (monotonic).
	GPUEventCounts map[GPUEventKey]uint64
	// Views says how each view (Views lists them) stands.
	Views map[string]ViewState
	// BPFMemory is the kernel memory of each loaded view's BPF maps and
	// programs (their memlock), by view; "stacks" is that of the stack and
	// Python frame maps the fd and cuda views share (pkg/stacks).
	BPFMemory map[string]uint64
	// FDReads is what the fd view read from /proc to learn fd tables.
	FDReads FDReads
}

// Views are the parts of the tool that can be up or down on their own: the
// BPF concerns, Python frames (carried by the fd and cuda objects), and
// NVML.
var Views = []string{"fd", "sched", "sock", "cuda", "nccl", "python", "nvml"}

// ViewState is how one view stands: up, down, or absent (down where it is
// not expected).
type ViewState struct {
	// Down says why the view does not run: "" when it runs, "loading"
	// while its BPF side loads, else what failed.
	Down string
	// Absent, set only for a view that does not run, says why it is not
	// expected on this node: then not running is no fault (the metrics
	// export autoglm_view_absent for it instead of autoglm_view_up).
	Absent Absence
}

// Absence is why a view is not expected on a node: a small fixed set, so
// that it can be a label.
type Absence string

const (
	// AbsentNoGPU: the node has no NVIDIA GPU (no /dev/nvidia0, ...), so
	// the GPU views (cuda, nccl, nvml) have nothing to see.
	AbsentNoGPU Absence = "no_gpu"
	// AbsentNoNVML: the node has GPUs, but NVML was not given to the
	// agent: no libnvidia-ml, or no GPU device nodes in its container
	// (the NVIDIA container runtime did not inject them).
	AbsentNoNVML Absence = "no_nvml"
)

// Meaning says what the absence means, for the log, `check` and /readyz.
func (a Absence) Meaning() string {
	switch a {
	case AbsentNoGPU:
		return "no NVIDIA GPU on this node"
	case AbsentNoNVML:
		return "NVML not given to the agent (no libnvidia-ml, or no GPU device nodes in its container: the NVIDIA container runtime did not inject them)"
	}
	return string(a)
}

// Shows lists what each view shows, in the order of Views.
var Shows = []Shown{fdShown, schedShown, sockShown, cudaShown, ncclShown, nvmlShown}
