package model

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

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

// OutOfMemory tells out-of-memory failures from the rest: by the error's
// name where the source knows it, else by code, which is 2 for out of
// memory in both the runtime (cudaErrorMemoryAllocation) and the driver
// (CUDA_ERROR_OUT_OF_MEMORY).
func OutOfMemory(name string, code int) bool {
	if name == "" {
		return code == 2
	}
	n := strings.ToLower(name)
	return strings.Contains(n, "memoryallocation") || strings.Contains(n, "out_of_memory") || strings.Contains(n, "outofmemory")
}

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

// Describe says what a snapshot shows, as a finding's summary or a log
// line would: why the call failed and on which device, what the process
// held and where most of it, the largest other process on that device,
// and what NVML counts that the hooks do not see, e.g. "Out of memory on
// GPU 3: this process held 22.0 GiB (top: allocate_kv_cache
// (engine.py:210) 18.0 GiB); pod batch/embed-7 held 51.0 GiB on the same
// GPU. NVML counts 3.0 GiB more: context, workspaces, unhooked paths."
// site names a call site by its stack as the caller's findings do
// (pkg/detect/stack knows which frame a reader wants; the model does not);
// a site it names "" is left unnamed.
func (s *GPUMemorySnapshot) Describe(site func([]Frame) string) string {
	var b strings.Builder
	on := s.failingDevices()
	switch s.Why {
	case SnapshotOutOfMemory:
		b.WriteString("Out of memory")
	default:
		fmt.Fprintf(&b, "%s returned %s", s.API, s.errorName())
	}
	if len(on) > 0 {
		labels := make([]string, len(on))
		for i, d := range on {
			labels[i] = d.label()
		}
		plural := ""
		if len(on) > 1 {
			plural = "s"
		}
		fmt.Fprintf(&b, " on GPU%s %s", plural, strings.Join(labels, ", "))
		if s.Why == SnapshotDeviceFull && len(on) == 1 && on[0].MemoryTotalBytes > 0 {
			fmt.Fprintf(&b, " (%.0f %% used)", 100*float64(on[0].MemoryUsedBytes)/float64(on[0].MemoryTotalBytes))
		}
	}
	fmt.Fprintf(&b, ": this process held %s", IEC(s.LiveBytes))
	var notes []string
	if len(s.Sites) > 0 && s.Sites[0].Bytes > 0 {
		top := s.Sites[0]
		name := site(top.Stack)
		if name == "" {
			name = "a site without a stack"
		}
		notes = append(notes, fmt.Sprintf("top: %s %s", name, IEC(top.Bytes)))
	}
	if s.FreedAfterBytes > 0 {
		notes = append(notes, fmt.Sprintf("%s of it freed right after", IEC(s.FreedAfterBytes)))
	}
	if len(notes) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(notes, "; "))
	}
	if len(on) > 0 {
		where := "on the same GPU"
		if len(on) > 1 {
			where = "on its GPUs"
		}
		if d, p, ok := s.largestNeighbour(on); ok {
			if len(on) > 1 {
				where = "on GPU " + d.label()
			}
			fmt.Fprintf(&b, "; %s held %s %s", p.name(), IEC(p.UsedBytes), where)
		} else {
			fmt.Fprintf(&b, "; no other process %s", where)
		}
	}
	b.WriteString(".")
	if s.GapBytes != nil && *s.GapBytes > 0 {
		fmt.Fprintf(&b, " NVML counts %s more: context, workspaces, unhooked paths.", IEC(uint64(*s.GapBytes)))
	}
	return b.String()
}

// errorName is the failed call's error, by name where the source knew it.
func (s *GPUMemorySnapshot) errorName() string {
	if s.Error != "" {
		return s.Error
	}
	return fmt.Sprintf("error %d", s.Code)
}

// failingDevices are the devices the failure was on: those NVML listed
// the process on; where it listed it on none (no figure per process), the
// node's only device, or none when there are several.
func (s *GPUMemorySnapshot) failingDevices() []*SnapshotDevice {
	var on []*SnapshotDevice
	for i := range s.Devices {
		d := &s.Devices[i]
		if slices.ContainsFunc(d.Processes, func(p SnapshotProcess) bool { return p.Self }) {
			on = append(on, d)
		}
	}
	if len(on) == 0 && len(s.Devices) == 1 {
		on = append(on, &s.Devices[0])
	}
	return on
}

// largestNeighbour is the process other than the failing one that NVML
// counted the most memory for on one of the devices on; false when there
// is none.
func (s *GPUMemorySnapshot) largestNeighbour(on []*SnapshotDevice) (*SnapshotDevice, *SnapshotProcess, bool) {
	var dev *SnapshotDevice
	var best *SnapshotProcess
	for _, d := range on {
		for i := range d.Processes {
			p := &d.Processes[i]
			if !p.Self && (best == nil || p.UsedBytes > best.UsedBytes) {
				dev, best = d, p
			}
		}
	}
	return dev, best, best != nil
}

// label names a device as the report does: its index, and its MIG
// instance on MIG.
func (d *SnapshotDevice) label() string { return DeviceLabel(d.Index, d.MIG) }

// name is how a sentence names a process: its pod where known, else its
// comm and pid.
func (p *SnapshotProcess) name() string {
	switch {
	case p.Pod.Name != "" && p.Pod.Namespace != "":
		return "pod " + p.Pod.Namespace + "/" + p.Pod.Name
	case p.Pod.Name != "":
		return "pod " + p.Pod.Name
	case p.Comm != "":
		return fmt.Sprintf("%s (pid %d)", p.Comm, p.PID)
	}
	return fmt.Sprintf("pid %d", p.PID)
}

// card writes a snapshot's rows on its failure's card (the keys are the
// snapshot's, under the evidence's "snapshot").
func (s *GPUMemorySnapshot) card(c Card) {
	c.Phrase("snapshot", "snapshot", func(p Card) {
		p.Time("time", "at", s.Time)
		p.Text("api", "of", s.API)
		p.Bytes("size_bytes", "for", s.SizeBytes)
	})
	why := s.Why
	switch s.Why {
	case SnapshotOutOfMemory:
		why = "out of memory"
	case SnapshotDeviceFull:
		why = fmt.Sprintf("%s with the device at least %.0f %% used", s.errorName(), 100*SnapshotFullShare)
	}
	c.Text("snapshot.why", "taken for", why)
	c.Bytes("snapshot.live_bytes", "live at the failure", s.LiveBytes)
	c.Count("snapshot.live_allocations", "live allocations", s.LiveAllocations)
	c.Bytes("snapshot.freed_after_bytes", "of it freed right after", s.FreedAfterBytes)
	c.CountUint64("snapshot.missed_frees", "frees after it not kept", s.MissedFrees)
	if s.NVMLUsedBytes != nil {
		c.Bytes("snapshot.nvml_used_bytes", "NVML used", *s.NVMLUsedBytes)
	}
	if s.GapBytes != nil {
		c.SignedBytes("snapshot.gap_bytes", "not hooked (context, workspaces, other paths)", *s.GapBytes)
	}
	c.Text("snapshot.profile", "profile", s.Profile)
	var sites []Row
	for _, t := range s.Sites {
		sites = append(sites, Row{Cells: []Cell{BytesCell(t.Bytes), CountCell(t.Allocations), DurationCell(t.OldestAgeSeconds), BytesCell(t.FreedAfterBytes)}, Stack: t.Stack})
	}
	c.Table("snapshot.sites", "live at the failure, by site", []string{"live", "allocations", "oldest", "freed after"}, sites)
	if s.OtherSitesBytes > 0 {
		c.Bytes("snapshot.other_sites_bytes", "at other sites", s.OtherSitesBytes)
	}
	for _, d := range s.Devices {
		c.Phrase("snapshot.devices", "GPU "+d.label(), func(p Card) {
			p.Text("name", "", d.Name)
			p.Bytes("memory_used_bytes", "used", d.MemoryUsedBytes)
			p.Bytes("memory_total_bytes", "of", d.MemoryTotalBytes)
			p.Time("sampled_at", "sampled at", d.SampledAt)
		})
		var procs, theirs []Row
		for _, p := range d.Processes {
			pid := CountCell(p.PID)
			if p.Self {
				pid = TextCell(fmt.Sprintf("%d (self)", p.PID))
			}
			var pod Cell
			if p.Pod.Name != "" {
				pod = TextCell(strings.TrimPrefix(p.Pod.Namespace+"/"+p.Pod.Name, "/"))
			}
			procs = append(procs, Row{Cells: []Cell{pid, TextCell(p.Comm), pod, BytesCell(p.UsedBytes), YesNoCell(p.Watched), optionalCell(p.LiveBytes, BytesCell)}})
			if p.Self {
				continue // its sites are listed above
			}
			for _, t := range p.TopSites {
				theirs = append(theirs, Row{Cells: []Cell{CountCell(p.PID), BytesCell(t.Bytes), CountCell(t.Allocations), DurationCell(t.OldestAgeSeconds)}, Stack: t.Stack})
			}
		}
		c.Table("snapshot.devices.processes", "processes on GPU "+d.label(), []string{"pid", "comm", "pod", "NVML used", "watched", "live"}, procs)
		c.Table("snapshot.devices.processes.top_sites", "their top sites on GPU "+d.label(), []string{"pid", "live", "allocations", "oldest"}, theirs)
	}
	if len(s.History) > 0 {
		c.Phrase("snapshot.history", "the minute before", func(p Card) {
			low, high, peak := s.History[0].LiveBytes, s.History[0].LiveBytes, uint64(0)
			var nvmlLow, nvmlHigh *uint64
			for _, m := range s.History {
				low, high, peak = min(low, m.LiveBytes), max(high, m.LiveBytes), max(peak, m.PeakBytes)
				if n := m.NVMLBytes; n != nil {
					if nvmlLow == nil || *n < *nvmlLow {
						nvmlLow = n
					}
					if nvmlHigh == nil || *n > *nvmlHigh {
						nvmlHigh = n
					}
				}
			}
			p.Bytes("live_bytes", "live least", low)
			p.Bytes("live_bytes", "most", high)
			p.Bytes("peak_bytes", "peak", peak)
			if nvmlLow != nil {
				p.Bytes("nvml_bytes", "NVML least", *nvmlLow)
				p.Bytes("nvml_bytes", "most", *nvmlHigh)
			}
			p.Count("", "polls", len(s.History))
		})
	}
}
