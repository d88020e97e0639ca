// Package gpuxid turns the driver faults a GPU reports (XID errors and
// double-bit ECC errors, from NVML's events) into findings on the
// processes using that GPU: a job that dies of a GPU that fell off the
// bus, an uncorrectable ECC error or a kernel's illegal memory access
// should say so in its report, not only in the node's kernel log. The
// other events NVML reports (corrected ECC errors, pstate and clock
// changes) are counted by the sampler and make no finding.
//
// An XID is judged by its class in NVIDIA's catalogue (Catalogue): a
// fault of the device (memory, driver, firmware, NVLink, bus) is
// critical for every process on it, which its evidence lists; a fault of
// an application is a warning (the cleanup after one, XID 45, info) and
// one not classified a warning too. NVML's event names the device, not
// the process: an application's XID is a warning for each process on the
// device (on MIG, on its GPU instance), and says whether the process was
// alone there.
package gpuxid

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/episode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Config holds the detector's one threshold.
type Config struct {
	// Quiet is how long a device goes without the same XID before its
	// finding ends.
	Quiet time.Duration
}

// DefaultConfig returns the settings used when none are given.
func DefaultConfig() Config { return Config{Quiet: 5 * time.Minute} }

// XID is what NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors)
// says of one XID: its class (model.XIDApplication, model.XIDDevice, or
// model.XIDUnknown where the catalogue blames several causes, the
// application among them, or none) and what it means and what to do.
type XID struct {
	Class   string
	Meaning string
}

// Catalogue holds the common XIDs. Application: those the catalogue and
// NVIDIA's device plugin count as the application's (13, 31, 43), and 45,
// the cleanup of the channels after an earlier fault or a killed process.
// Device: those the catalogue blames on the hardware, the driver or its
// firmware, memory, NVLink or the bus, never on the application. The
// others are named but not classified.
var Catalogue = map[uint64]XID{
	13:  {model.XIDApplication, "graphics engine exception: a kernel faulted (out-of-range access, illegal instruction); usually the application's bug"},
	31:  {model.XIDApplication, "GPU memory page fault: a kernel accessed memory it may not; usually the application's bug (illegal address)"},
	32:  {model.XIDDevice, "invalid or corrupted push buffer stream (driver, PCIe or memory corruption)"},
	38:  {model.XIDDevice, "driver firmware error"},
	43:  {model.XIDApplication, "GPU stopped processing: the application's channel was stopped after a fault"},
	45:  {model.XIDApplication, "preemptive cleanup: the channel was torn down after an earlier error or the process was killed"},
	48:  {model.XIDDevice, "double-bit ECC error: uncorrectable device memory error; the GPU needs a reset"},
	61:  {model.XIDUnknown, "internal micro-controller breakpoint or warning"},
	62:  {model.XIDDevice, "internal micro-controller halt: reset the GPU"},
	63:  {model.XIDDevice, "ECC page retirement or row remapping recorded"},
	64:  {model.XIDDevice, "ECC page retirement or row remapping failed: reset the GPU, then check its health"},
	68:  {model.XIDUnknown, "video processor exception"},
	69:  {model.XIDUnknown, "graphics engine class error"},
	74:  {model.XIDDevice, "NVLink error: check the links and the fabric manager"},
	79:  {model.XIDDevice, "GPU has fallen off the bus: it no longer answers; node-level fault (power, PCIe, thermal)"},
	92:  {model.XIDDevice, "high single-bit ECC error rate"},
	94:  {model.XIDDevice, "contained ECC error: the applications using the affected memory were stopped"},
	95:  {model.XIDDevice, "uncontained ECC error: every application on the GPU is affected; reset the GPU"},
	109: {model.XIDUnknown, "context switch timeout"},
	119: {model.XIDDevice, "GSP RPC timeout: the GPU's firmware stopped answering; reset the GPU"},
	120: {model.XIDDevice, "GSP error: the GPU's firmware reported an error"},
	121: {model.XIDDevice, "C2C link error"},
	140: {model.XIDDevice, "unrecovered ECC error"},
}

// Meaning returns what an XID means, or a pointer to the catalogue.
func Meaning(xid uint64) string {
	if x, ok := Catalogue[xid]; ok {
		return x.Meaning
	}
	return "see NVIDIA's XID catalogue"
}

// Class returns an XID's class: model.XIDUnknown for one not in Catalogue.
func Class(xid uint64) string {
	if x, ok := Catalogue[xid]; ok {
		return x.Class
	}
	return model.XIDUnknown
}

// Cleanup is the XID of the preemptive cleanup that follows an earlier
// fault or a process killed on the device: an application XID of no
// consequence of its own.
const Cleanup = 45

// Severity is how grave an XID is for a process on the device: critical
// for a fault of the device; a warning for one of an application (info
// for Cleanup) and for one not classified.
func Severity(xid uint64) string {
	switch {
	case Class(xid) == model.XIDDevice:
		return model.SeverityCritical
	case xid == Cleanup:
		return model.SeverityInfo
	default:
		return model.SeverityWarning
	}
}

// Detector groups each process's faults by device and kind, XID errors
// also by XID. It is safe for concurrent use.
type Detector struct {
	cfg   Config
	procs episode.Procs[groups]
}

// groups are one process's faults.
type groups map[key]*group

type key struct {
	device int
	kind   string // of the finding: model.KindGPUXID or model.KindGPUECCError
	xid    uint64 // of a gpu_xid
}

type group struct {
	first, last time.Time
	uuid        string
	count       int
	instances   map[[2]uint32]bool // MIG GPU and compute instances named
	procs       map[int]string     // the processes on the device, by pid: their comms ("" not watched)
}

// New returns a detector; zero fields of cfg take DefaultConfig's values.
func New(cfg Config) *Detector {
	if cfg.Quiet <= 0 {
		cfg.Quiet = DefaultConfig().Quiet
	}
	return &Detector{cfg: cfg}
}

// Observe takes in p.CUDA.GPUEvents and returns a finding per device and
// XID seen, and per device with double-bit ECC errors: active while they
// keep coming, ended after Quiet without.
func (d *Detector) Observe(now time.Time, p *model.Process) []model.Finding {
	done := false // every group ended: nothing kept of p
	out := d.procs.With(p.PID, func() *groups {
		if len(p.CUDA.GPUEvents) == 0 {
			return nil
		}
		return &groups{}
	}, func(st *groups) []model.Finding {
		gs := *st
		for _, e := range p.CUDA.GPUEvents {
			var k key
			switch e.Kind {
			case model.GPUEventXID:
				k = key{e.Device, model.KindGPUXID, e.XID}
			case model.GPUEventDoubleBitECC:
				k = key{e.Device, model.KindGPUECCError, 0}
			default:
				continue
			}
			g := gs[k]
			if g == nil {
				// A finding is known by kind, pid and first sighting: two
				// faults in the same instant get apart.
				first := e.Time
				for slices.ContainsFunc(slices.Collect(maps.Values(gs)), func(o *group) bool { return o.first.Equal(first) }) {
					first = first.Add(time.Nanosecond)
				}
				g = &group{first: first, uuid: e.UUID, instances: map[[2]uint32]bool{}, procs: map[int]string{p.PID: p.Comm}}
				gs[k] = g
			}
			for _, o := range e.Processes {
				if g.procs[o.PID] == "" {
					g.procs[o.PID] = o.Comm
				}
			}
			g.count++
			g.last = e.Time
			if e.GPUInstance != model.NoInstance {
				g.instances[[2]uint32{e.GPUInstance, e.ComputeInstance}] = true
			}
		}
		var out []model.Finding
		for _, k := range slices.SortedFunc(maps.Keys(gs), func(a, b key) int {
			return cmp.Or(cmp.Compare(a.device, b.device), cmp.Compare(a.kind, b.kind), cmp.Compare(a.xid, b.xid))
		}) {
			g := gs[k]
			active := now.Sub(g.last) < d.cfg.Quiet
			out = append(out, finding(p, k, g, active))
			if !active {
				delete(gs, k)
			}
		}
		done = len(gs) == 0
		return out
	})
	if done {
		d.procs.Forget(p.PID)
	}
	return out
}

func finding(p *model.Process, k key, g *group, active bool) model.Finding {
	times := "once"
	if g.count > 1 {
		times = fmt.Sprintf("%d times", g.count)
	}
	var mig []model.MIGInstance
	for _, in := range slices.SortedFunc(maps.Keys(g.instances), func(a, b [2]uint32) int {
		return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
	}) {
		mig = append(mig, model.MIGInstance{GPUInstance: in[0], ComputeInstance: in[1]})
	}
	f := model.Finding{
		Kind: k.kind, PID: p.PID, Comm: p.Comm, Severity: model.SeverityCritical,
		FirstSeen: g.first, LastSeen: g.last, Active: active,
	}
	if k.kind == model.KindGPUECCError {
		f.Evidence = model.GPUECCEvidence{Device: k.device, UUID: g.uuid, Count: g.count, FirstAt: g.first, LastAt: g.last, MIGInstances: mig}
		f.Summary = fmt.Sprintf("GPU %d (%s) reported a double-bit ECC error %s while %s used it: %s", k.device, g.uuid, times, p.Comm, eccMeaning)
		return f
	}
	var procs []model.DeviceProcess
	for _, pid := range slices.Sorted(maps.Keys(g.procs)) {
		procs = append(procs, model.DeviceProcess{PID: pid, Comm: g.procs[pid]})
	}
	class := Class(k.xid)
	f.Severity = Severity(k.xid)
	f.Evidence = model.GPUXIDEvidence{Device: k.device, UUID: g.uuid, Count: g.count, FirstAt: g.first, LastAt: g.last, MIGInstances: mig,
		XID: k.xid, Class: class, Meaning: Meaning(k.xid), Processes: procs}
	f.Summary = fmt.Sprintf("GPU %d (%s) reported XID %d %s while %s used it: %s; %s", k.device, g.uuid, k.xid, times, p.Comm, Meaning(k.xid),
		verdict(p, k.xid, class, len(procs)))
	return f
}

// verdict says whose an XID is, of class class, reported by a device with
// n processes on it, p among them.
func verdict(p *model.Process, xid uint64, class string, n int) string {
	switch {
	case class == model.XIDDevice:
		if n == 1 {
			return fmt.Sprintf("a fault of the device, not of %s", p.Comm)
		}
		return fmt.Sprintf("a fault of the device, not of %s: it affects all %d processes on it", p.Comm, n)
	case xid == Cleanup:
		return "informational: it follows an earlier fault or a process killed on the device"
	case class == model.XIDApplication && n == 1:
		return fmt.Sprintf("a fault of the application: %s, alone on the device, caused it", p.Comm)
	case class == model.XIDApplication:
		return fmt.Sprintf("a fault of the application: one of the %d processes on the device caused it "+
			"(NVML does not say which; the kernel log's NVRM: Xid line names its pid)", n)
	default:
		return fmt.Sprintf("XID %d is not classified here: see NVIDIA's XID catalogue", xid)
	}
}

// eccMeaning is what a double-bit ECC error means and what to do.
const eccMeaning = "uncorrectable device memory error: what its kernels read may be corrupt, so its results are suspect; " +
	"reset the GPU (a pending page retirement or row remapping takes effect then) and see nvidia-smi -q -d ECC,ROW_REMAPPER"

// Forget drops what is kept of pid.
func (d *Detector) Forget(pid int) { d.procs.Forget(pid) }
