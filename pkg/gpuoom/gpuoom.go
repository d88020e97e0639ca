// Package gpuoom completes the memory snapshots that pkg/cudatrack takes
// at failed GPU allocations (model.GPUMemorySnapshot): cudatrack fills
// what the kernel held at the failure (the call, the live bytes and their
// sites); this stage, run by the pipeline each poll right after NVML's
// figures are joined and before the detectors, adds what only the agent
// across processes knows: the process's memory over the minute before,
// who else was on the device at that instant (from the NVML sample
// nearest it), NVML's figure for the process and the gap to the hooked
// bytes, and where the snapshot's profile is.
//
// A snapshot is completed in place, once, in the poll it first appears in
// CUDAStats.Snapshots: then it is new, held by the live process alone (no
// sink or finding has it yet). Later model snapshots share it, so it is
// never written again.
package gpuoom

import (
	"cmp"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/nvml"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// topSites is how many of a watched process's sites a snapshot's device
// list names (model.SnapshotProcess.TopSites).
const topSites = 3

// Config says where a snapshot's figures come from.
type Config struct {
	// NVML is the sampler whose recent samples say what each device held
	// at a failure; one that did not start leaves a snapshot's Devices
	// and NVML figures nil.
	NVML *nvml.Sampler
	// Proc reads the comm of the processes on a device that the agent
	// does not watch.
	Proc procinfo.FS
	// Pod, if set, says where a process the agent does not watch runs
	// (pipeline.Config.Pod); a watched one's is its model.Process.Pod.
	Pod func(pid int, known model.Pod) model.Pod
	// Profile, if set, names where a snapshot's pprof profile is
	// (pipeline.Config.OOMProfile).
	Profile func(pid int, at time.Time) string
}

// Stage completes the snapshots of the watched processes, poll by poll.
// It is not safe for concurrent use: the pipeline's poll runs it.
type Stage struct {
	cfg   Config
	procs map[int]*state
}

// state is what the stage keeps of one process.
type state struct {
	// history is its memory at each poll over the last
	// model.SnapshotHistory, oldest first; kept while it shows CUDA
	// activity.
	history []model.MemoryPoint
	// done are its snapshots already completed: those of
	// CUDAStats.Snapshots at the last poll (cudatrack keeps the newest
	// model.MaxSnapshots).
	done []*model.GPUMemorySnapshot
}

// New returns a stage that completes snapshots from cfg's sources.
func New(cfg Config) *Stage {
	return &Stage{cfg: cfg, procs: map[int]*state{}}
}

// Observe completes the snapshots new in procs (the poll's live watched
// processes, NVML's figures joined) and adds each process's point of this
// poll to its history.
func (s *Stage) Observe(now time.Time, procs []*model.Process) {
	var watched map[int]*model.Process // made at the first new snapshot
	for _, p := range procs {
		st := s.procs[p.PID]
		if st == nil {
			if !p.CUDA.Active() && len(p.CUDA.Snapshots) == 0 {
				continue
			}
			st = &state{}
			s.procs[p.PID] = st
		}
		for _, snap := range p.CUDA.Snapshots {
			if slices.Contains(st.done, snap) {
				continue
			}
			if watched == nil {
				watched = make(map[int]*model.Process, len(procs))
				for _, q := range procs {
					watched[q.PID] = q
				}
			}
			s.complete(now, snap, p, st.history, watched)
		}
		st.done = append(st.done[:0], p.CUDA.Snapshots...)
		if p.CUDA.Active() {
			st.add(now, p)
		}
	}
}

// Forget drops what the stage keeps of pid, once it has exited.
func (s *Stage) Forget(pid int) { delete(s.procs, pid) }

// add appends p's point of the poll at now and drops those past
// model.SnapshotHistory: the failures completed at the next poll came
// after now, and look no further back from their own instant.
func (st *state) add(now time.Time, p *model.Process) {
	pt := model.MemoryPoint{Time: now, LiveBytes: p.CUDA.LiveBytes, PeakBytes: max(p.CUDA.LivePeakBytes, p.CUDA.LiveBytes)}
	if p.CUDA.HasNVML {
		pt.NVMLBytes = ptr(p.CUDA.NVMLUsedBytes)
	}
	st.history = append(st.history, pt)
	from := now.Add(-model.SnapshotHistory)
	old := 0
	for old < len(st.history) && st.history[old].Time.Before(from) {
		old++
	}
	st.history = slices.Delete(st.history, 0, old)
}

// complete fills the parts of snap that cudatrack leaves to the pipeline.
// p is its process, history p's points so far, watched the poll's
// processes by pid.
func (s *Stage) complete(now time.Time, snap *model.GPUMemorySnapshot, p *model.Process, history []model.MemoryPoint, watched map[int]*model.Process) {
	sample, sampled := s.cfg.NVML.At(snap.Time)
	var own *uint64 // NVML's figure for the process at the failure
	if sampled {
		var sum uint64
		var listed bool
		for _, g := range sample.GPUs {
			if b, on := g.Processes[p.PID]; on {
				sum += b
				listed = true
			}
		}
		if listed {
			own = &sum
		}
	}

	// The points of the minute before the failure, then the failure's:
	// its live bytes, which are also the most it held at that instant.
	from := snap.Time.Add(-model.SnapshotHistory)
	for _, pt := range history {
		if !pt.Time.Before(from) && pt.Time.Before(snap.Time) {
			snap.History = append(snap.History, pt)
		}
	}
	last := model.MemoryPoint{Time: snap.Time, LiveBytes: snap.LiveBytes, PeakBytes: snap.LiveBytes}
	if own != nil {
		last.NVMLBytes = ptr(*own)
	}
	snap.History = append(snap.History, last)

	if sampled {
		snap.Devices = s.devices(now, snap, p, sample, watched)
	}
	if own != nil {
		snap.NVMLUsedBytes = ptr(*own)
		snap.GapBytes = ptr(int64(*own) - int64(snap.LiveBytes))
	}
	if s.cfg.Profile != nil {
		snap.Profile = s.cfg.Profile(p.PID, snap.Time)
	}
}

// devices are the devices of sample that list p, each with every process
// on it; where none lists p (NVML gives no figure per process), every
// device, MIG instances in place of their GPU.
func (s *Stage) devices(now time.Time, snap *model.GPUMemorySnapshot, p *model.Process, sample nvml.Sample, watched map[int]*model.Process) []model.SnapshotDevice {
	on := slices.DeleteFunc(slices.Clone(sample.GPUs), func(g model.GPU) bool {
		_, listed := g.Processes[p.PID]
		return !listed
	})
	if len(on) == 0 {
		// A GPU in MIG mode lists no process (its instances do), and its
		// memory is theirs: the instances stand for it.
		split := map[int]bool{}
		for _, g := range sample.GPUs {
			if g.MIG != nil {
				split[g.Index] = true
			}
		}
		on = slices.DeleteFunc(slices.Clone(sample.GPUs), func(g model.GPU) bool { return g.MIG == nil && split[g.Index] })
	}
	unwatched := map[int]model.SnapshotProcess{} // looked up once for all devices
	out := make([]model.SnapshotDevice, 0, len(on))
	for _, g := range on {
		d := model.SnapshotDevice{Index: g.Index, MIG: g.MIG, UUID: g.UUID, Name: g.Name, MemoryUsedBytes: g.MemoryUsed,
			MemoryTotalBytes: g.MemoryTotal, SampledAt: sample.Time}
		for pid, used := range g.Processes {
			var sp model.SnapshotProcess
			switch q := watched[pid]; {
			case pid == p.PID:
				sp = model.SnapshotProcess{Comm: p.Comm, Pod: p.Pod, Self: true, Watched: true, LiveBytes: ptr(snap.LiveBytes),
					TopSites: slices.Clone(snap.Sites[:min(topSites, len(snap.Sites))])}
			case q != nil:
				sp = neighbour(now, q)
			default:
				var ok bool
				if sp, ok = unwatched[pid]; !ok {
					sp = s.stranger(pid)
					unwatched[pid] = sp
				}
			}
			sp.PID, sp.UsedBytes = pid, used
			d.Processes = append(d.Processes, sp)
		}
		slices.SortFunc(d.Processes, func(a, b model.SnapshotProcess) int {
			return cmp.Or(cmp.Compare(b.UsedBytes, a.UsedBytes), cmp.Compare(a.PID, b.PID))
		})
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b model.SnapshotDevice) int {
		return cmp.Or(cmp.Compare(a.Index, b.Index), cmp.Compare(migOf(a.MIG), migOf(b.MIG)))
	})
	return out
}

// neighbour describes q, a watched process on the failing one's device,
// as of the poll at now: its hooked bytes and top sites where the CUDA
// view sees it, nil where it does not (not hooked, or the view down):
// no figure rather than a zero.
func neighbour(now time.Time, q *model.Process) model.SnapshotProcess {
	sp := model.SnapshotProcess{Comm: q.Comm, Pod: q.Pod, Watched: true}
	if !q.CUDA.Active() {
		return sp
	}
	sp.LiveBytes = ptr(q.CUDA.LiveBytes)
	for _, site := range q.CUDA.Sites {
		// Most live bytes first; those that hold none come last.
		if len(sp.TopSites) == topSites || site.Bytes == 0 {
			break
		}
		top := model.SnapshotSite{Bytes: site.Bytes, Allocations: len(site.Allocs), Stack: site.Stack}
		if len(site.Allocs) > 0 {
			top.OldestAgeSeconds = now.Sub(slices.MinFunc(site.Allocs, time.Time.Compare)).Seconds()
		}
		sp.TopSites = append(sp.TopSites, top)
	}
	return sp
}

// stranger describes a process on the device that the agent does not
// watch: its comm from /proc ("" once it is gone) and its pod where
// Config.Pod says.
func (s *Stage) stranger(pid int) model.SnapshotProcess {
	var sp model.SnapshotProcess
	if comm, err := s.cfg.Proc.Comm(pid); err == nil {
		sp.Comm = comm
	}
	if s.cfg.Pod != nil {
		sp.Pod = s.cfg.Pod(pid, model.Pod{})
	}
	return sp
}

// migOf orders a whole GPU before its MIG instances.
func migOf(mig *int) int {
	if mig == nil {
		return -1
	}
	return *mig
}

func ptr[T any](v T) *T { return &v }
