// Package model holds the data that flows through the pipeline: what a source
// observed about each process in one interval, and what detectors concluded.
// Sources fill it, detectors read it, sinks (terminal, JSON, Prometheus) show it.
package model

import "time"

// Finding kinds, as they appear in reports, metrics and --fail-on.
const (
	KindFDLeak          = "fd_leak"
	KindFDExhausted     = "fd_exhausted"
	KindSocketLeak      = "socket_leak"
	KindCtxSwitchStorm  = "ctx_switch_storm"
	KindGPUAllocBurst   = "gpu_alloc_burst"
	KindGPUMemoryLeak   = "gpu_memory_leak"
	KindGPUAllocFailure = "gpu_alloc_failure"
	KindGPUAllocChurn   = "gpu_alloc_churn"
	KindGPUXID          = "gpu_xid"
	KindGPUECCError     = "gpu_ecc_error"
	KindGPUInputBound   = "gpu_input_bound"
)

// Kinds lists every finding kind, for flag validation and metric pre-creation.
var Kinds = []string{KindFDLeak, KindFDExhausted, KindSocketLeak, KindCtxSwitchStorm, KindGPUAllocBurst, KindGPUMemoryLeak, KindGPUAllocFailure, KindGPUAllocChurn, KindGPUXID, KindGPUECCError, KindGPUInputBound}

// Severities, lowest first.
const (
	SeverityInfo     = "info"
	SeverityWarning  = "warning"
	SeverityCritical = "critical"
)

// FD kinds as reported by the fd source; the order matches the BPF enum fd_kind.
var FDKinds = []string{"other", "file", "socket", "pipe", "eventfd", "epoll", "timerfd", "signalfd", "inotify", "pidfd", "memfd"}

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
	// Evidence is the struct of Kind (evidence.go), held by value: what
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

// FDSite groups the live fds of a process by the user stack that opened them.
type FDSite struct {
	StackID int64       // BPF stack id; negative when unknown (seeded from /proc, or stack map full)
	Stack   []Frame     // symbolized frames, innermost first
	Opened  []time.Time // open time of each live fd opened here
	FDs     []int32     // the fd numbers, in the order of Opened
	// Since tracking began (monotonic), from the kernel's per-site
	// counters; a close counts for the site that opened the fd.
	OpenedTotal, ClosedTotal uint64
}

// FDStats is the fd view of one process at one instant.
type FDStats struct {
	Open int // live fds in the kernel table
	// OpenSockets is how many of them are sockets.
	OpenSockets int
	Limit       uint64            // soft RLIMIT_NOFILE
	Opened      map[string]uint64 // fds created since attach, by kind (monotonic)
	Closed      map[string]uint64 // fds released since attach, by kind (monotonic)
	Sites       []FDSite          // live fds by opening stack; sites with a known stack only
	// PastSites are the sites that opened fds since attach and hold none
	// now (OpenedTotal and ClosedTotal only): the most opened first, in
	// that order and with their stacks, as many as the pipeline symbolizes
	// (Config.TopSites), then the others in no order.
	PastSites []FDSite
	// Failed counts the fd-creating calls that failed because the process
	// (EMFILE) or the system (ENFILE) was out of fds, since attach, by
	// errno name (FDErrnos; monotonic).
	Failed map[string]uint64
	// LastFailure is the latest of those calls; nil when there was none.
	LastFailure *FDFailure
	// OpenAtAttach is how many fds the process held when watching began
	// (from /proc): one at its limit then was out of fds before any call
	// could be seen failing.
	OpenAtAttach int
}

// FDErrnos name the errnos of FDStats.Failed; the order matches the BPF
// enum fd_fail.
var FDErrnos = []string{"EMFILE", "ENFILE"}

// FDFailure is an fd-creating call that failed for want of fds.
type FDFailure struct {
	Time    time.Time
	Kind    string  // the kind of fd it tried to create (FDKinds)
	StackID int64   // its call site, numbered as FDSite.StackID
	Stack   []Frame // symbolized frames, innermost first
}

// Pod says where a process runs in Kubernetes; empty outside a pod.
type Pod struct {
	UID         string `json:"pod_uid,omitempty"`      // canonical dashed pod UID, from the cgroup
	ContainerID string `json:"container_id,omitempty"` // 64-hex container id, from the cgroup
	Namespace   string `json:"namespace,omitempty"`    // from the API server, when reachable
	Name        string `json:"pod,omitempty"`
	Container   string `json:"container,omitempty"`
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
	// Views says, for each view (Views lists them), why it is down: ""
	// when it runs, "loading" while its BPF side loads.
	Views map[string]string
	// BPFMemory is the kernel memory of each loaded view's BPF maps and
	// programs (their memlock), by view; "stacks" is that of the stack and
	// Python frame maps the fd and cuda views share (pkg/stacks).
	BPFMemory map[string]uint64
	// FDReads is what the fd view read from /proc to learn fd tables.
	FDReads FDReads
}

// FDReads counts, since the start, how the fd view learnt the fds of the
// processes it watches (monotonic): listings of /proc/PID/fd, fds described
// one by one (a readlink each), fds taken from the parent's table by a
// child tracked from its fork, and descriptions put off to a later poll by
// the per-poll bound (an fd put off at two polls counts twice). Children
// tracked from fork that were gone before any poll took them are counted
// with the fds they opened, and cost no /proc read.
type FDReads struct {
	Listings, Described, Inherited, Deferred uint64
	// Copied counts children whose fds came from the kernel's copy of
	// their open-fd bitmap (taken at fork and at exec), not a listing.
	Copied uint64
	// PerPoll is the bound on descriptions a poll, node-wide.
	PerPoll                     int
	ShortLived, ShortLivedOpens uint64
}

// Views are the parts of the tool that can be up or down on their own: the
// BPF concerns, Python frames (carried by the fd and cuda objects), and
// NVML.
var Views = []string{"fd", "sched", "sock", "cuda", "python", "nvml"}
