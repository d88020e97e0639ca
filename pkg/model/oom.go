package model

import "time"

// Memory snapshots at allocation failures: what held a process's GPU memory
// at the instant one of its allocations failed, and who else was on the
// device. pkg/cudatrack takes one from the kernel's live table as it stood
// at the failure (Time through MissedFrees): the kernel keeps, from the
// failure on, the allocations its frees remove, so that a burst released
// right after the failure is still in it, and those made after are left
// out. pkg/gpuoom completes it in the same poll, once NVML's figures are
// joined (History through Profile). A snapshot is immutable once its poll
// is through: later snapshots of the model share it.
const (
	// MaxSnapshots bounds the snapshots kept per process
	// (CUDAStats.Snapshots): the newest.
	MaxSnapshots = 4
	// SnapshotEvery is the least time between two snapshots of one
	// process after its first: a failure loop of a thousand a second
	// makes one a minute.
	SnapshotEvery = time.Minute
	// SnapshotHistory is how far back a snapshot's History goes.
	SnapshotHistory = time.Minute
	// SnapshotFullShare is the share of a device's memory in use (per
	// NVML) at which a failure of another error than out of memory is
	// snapshotted all the same (SnapshotDeviceFull).
	SnapshotFullShare = 0.95
	// MaxSnapshotSites bounds a snapshot's Sites; the rest are summed in
	// OtherSitesBytes.
	MaxSnapshotSites = 64
)

// Why a snapshot was taken (GPUMemorySnapshot.Why).
const (
	SnapshotOutOfMemory = "out_of_memory" // the call failed with out of memory
	SnapshotDeviceFull  = "device_full"   // another error, the device at least SnapshotFullShare used
)

// GPUMemorySnapshot is one process's GPU memory at the instant one of its
// allocations failed.
type GPUMemorySnapshot struct {
	// The failed call: its return, API, error and size asked for, and
	// its stack (the caller's frames, Python lines where read).
	Time      time.Time `json:"time"`
	API       string    `json:"api"`
	Error     string    `json:"error"`
	Code      int       `json:"code"`
	SizeBytes uint64    `json:"size_bytes"`
	Stack     []Frame   `json:"stack"`
	// Why is why it was taken: SnapshotOutOfMemory or SnapshotDeviceFull.
	Why string `json:"why"`

	// The process's hooked device memory live at the failure (pinned host
	// memory left out), and by call site: most bytes first, at most
	// MaxSnapshotSites, the others' bytes summed in OtherSitesBytes. A
	// site without a known stack has a nil Stack.
	LiveBytes       uint64         `json:"live_bytes"`
	LiveAllocations int            `json:"live_allocations"`
	Sites           []SnapshotSite `json:"sites"`
	OtherSitesBytes uint64         `json:"other_sites_bytes"`
	// FreedAfterBytes is what of LiveBytes was freed between the failure
	// and the agent's read of the kernel's tables: in the snapshot
	// because the kernel kept it.
	FreedAfterBytes uint64 `json:"freed_after_bytes"`
	// MissedFrees counts the frees after the failure the kernel could not
	// keep (its table full): the snapshot may lack that many allocations.
	MissedFrees uint64 `json:"missed_frees"`

	// History is the process's GPU memory over the SnapshotHistory before
	// the failure, one point per poll, oldest first, the failure's own
	// last (LiveBytes, NVML's figure nearest the failure).
	History []MemoryPoint `json:"history"`
	// Devices are the devices (GPUs or MIG instances) NVML listed the
	// process on in its sample nearest the failure, with every process on
	// each; nil without NVML. Where NVML did not list it (no figure
	// per process), every device of the node.
	Devices []SnapshotDevice `json:"devices"`
	// NVMLUsedBytes is NVML's figure for the process at the failure (all
	// its devices); GapBytes is NVMLUsedBytes - LiveBytes, the memory the
	// hooks do not see: the CUDA context, libraries' workspaces, memory
	// from an unhooked path. Both nil without NVML's figure.
	NVMLUsedBytes *uint64 `json:"nvml_used_bytes"`
	GapBytes      *int64  `json:"gap_bytes"`
	// Profile is where the snapshot's pprof profile (inuse_space at the
	// failure) is: the file --pprof writes, or the daemon's URL path; ""
	// when neither serves it.
	Profile string `json:"profile,omitempty"`
}

// SnapshotSite is one call site's device memory live at a failure.
type SnapshotSite struct {
	Bytes       uint64 `json:"bytes"`
	Allocations int    `json:"allocations"`
	// OldestAgeSeconds is how long its oldest live allocation had been
	// live at the failure.
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	// FreedAfterBytes is what of Bytes was freed after the failure.
	FreedAfterBytes uint64  `json:"freed_after_bytes"`
	Stack           []Frame `json:"stack"`
}

// MemoryPoint is one poll's GPU memory of a process.
type MemoryPoint struct {
	Time      time.Time `json:"time"`
	LiveBytes uint64    `json:"live_bytes"` // hooked, live at the poll
	PeakBytes uint64    `json:"peak_bytes"` // hooked, the most live since the previous poll
	// NVMLBytes is NVML's figure for the process (its last sample of the
	// poll); nil without one.
	NVMLBytes *uint64 `json:"nvml_bytes"`
}

// SnapshotDevice is a device at a failure, as NVML's sample nearest it had
// it.
type SnapshotDevice struct {
	Index            int       `json:"index"`
	MIG              *int      `json:"mig,omitempty"` // as GPU.MIG
	UUID             string    `json:"uuid"`
	Name             string    `json:"name"`
	MemoryUsedBytes  uint64    `json:"memory_used_bytes"`
	MemoryTotalBytes uint64    `json:"memory_total_bytes"`
	SampledAt        time.Time `json:"sampled_at"` // NVML's sample
	// Processes are every process NVML listed on the device, most memory
	// first, the failing one among them (Self).
	Processes []SnapshotProcess `json:"processes"`
}

// SnapshotProcess is a process on a device at a failure.
type SnapshotProcess struct {
	PID       int    `json:"pid"`
	Comm      string `json:"comm,omitempty"`
	Pod       Pod    `json:"pod"`        // where known
	UsedBytes uint64 `json:"used_bytes"` // NVML's figure on this device
	Self      bool   `json:"self"`       // the process whose allocation failed
	Watched   bool   `json:"watched"`    // this agent watches it
	// LiveBytes and TopSites, of a watched process: its hooked live
	// bytes and largest call sites (at most 3), at the failure for the
	// failing process, as of the poll for the others; nil for one not
	// watched.
	LiveBytes *uint64        `json:"live_bytes"`
	TopSites  []SnapshotSite `json:"top_sites,omitempty"`
}
