// Package gpuxid turns the driver faults a GPU reports (XID errors and
// double-bit ECC errors, from NVML's events) into findings on the
// processes using that GPU: a job that dies of a GPU that fell off the
// bus, an uncorrectable ECC error or a kernel's illegal memory access
// should say so in its report, not only in the node's kernel log. The
// other events NVML reports (corrected ECC errors, pstate and clock
// changes) are counted by the sampler and make no finding.
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

// Meanings are what the common XIDs mean and what to do, from NVIDIA's
// XID catalogue (docs.nvidia.com/deploy/xid-errors).
var Meanings = map[uint64]string{
	13:  "graphics engine exception: a kernel faulted (out-of-range access, illegal instruction); usually the application's bug",
	31:  "GPU memory page fault: a kernel accessed memory it may not; usually the application's bug (illegal address)",
	32:  "invalid or corrupted push buffer stream (PCIe or driver trouble)",
	38:  "driver firmware error",
	43:  "GPU stopped processing: the application's channel was stopped after a fault",
	45:  "preemptive cleanup: the channel was torn down after an earlier error or the process was killed",
	48:  "double-bit ECC error: uncorrectable device memory error; the GPU needs a reset",
	61:  "internal micro-controller breakpoint or warning",
	62:  "internal micro-controller halt: reset the GPU",
	63:  "ECC page retirement or row remapping recorded",
	64:  "ECC page retirement or row remapping failed: reset the GPU, then check its health",
	68:  "video processor exception",
	69:  "graphics engine class error",
	74:  "NVLink error: check the links and the fabric manager",
	79:  "GPU has fallen off the bus: it no longer answers; node-level fault (power, PCIe, thermal)",
	92:  "high single-bit ECC error rate",
	94:  "contained ECC error: the applications using the affected memory were stopped",
	95:  "uncontained ECC error: every application on the GPU is affected; reset the GPU",
	109: "context switch timeout",
	119: "GSP RPC timeout: the GPU's firmware stopped answering; reset the GPU",
	120: "GSP error: the GPU's firmware reported an error",
	121: "C2C link error",
	140: "unrecovered ECC error",
}

// Meaning returns what an XID means, or a pointer to the catalogue.
func Meaning(xid uint64) string {
	if m, ok := Meanings[xid]; ok {
		return m
	}
	return "see NVIDIA's XID catalogue"
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
				g = &group{first: first, uuid: e.UUID, instances: map[[2]uint32]bool{}}
				gs[k] = g
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
	f.Evidence = model.GPUXIDEvidence{Device: k.device, UUID: g.uuid, Count: g.count, FirstAt: g.first, LastAt: g.last, MIGInstances: mig,
		XID: k.xid, Meaning: Meaning(k.xid)}
	f.Summary = fmt.Sprintf("GPU %d (%s) reported XID %d %s while %s used it: %s", k.device, g.uuid, k.xid, times, p.Comm, Meaning(k.xid))
	return f
}

// eccMeaning is what a double-bit ECC error means and what to do.
const eccMeaning = "uncorrectable device memory error: what its kernels read may be corrupt, so its results are suspect; " +
	"reset the GPU (a pending page retirement or row remapping takes effect then) and see nvidia-smi -q -d ECC,ROW_REMAPPER"

// Forget drops what is kept of pid.
func (d *Detector) Forget(pid int) { d.procs.Forget(pid) }
