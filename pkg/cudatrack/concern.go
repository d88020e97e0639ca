package cudatrack

import (
	"cmp"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/topk"
)

// maxFailures bounds the failures kept per process: the most recent ones.
const maxFailures = 1000

// Concern is the CUDA concern as the pipeline sees it: the tracker and the
// symbolization of allocation stacks.
type Concern struct {
	*Tracker
	sym      *symbolize.Symbolizer
	topSites int
	failures map[int][]model.CUDAFailure
	failed   map[int]map[model.CUDAFailureKind]uint64 // every failure, counted
	frames   map[int]map[stacks.Site][]model.Frame    // by pid: a process forgotten drops its own
	counts   map[int]map[stacks.Site]stacks.Counts    // by pid: as of the previous poll
	waits    map[int]*waitPoll                        // by pid: as of the previous poll
	// snapshots: the memory snapshots at failures kept, newest
	// model.MaxSnapshots by pid, oldest first.
	snapshots  map[int][]*model.GPUMemorySnapshot
	deviceFull func(pid int, at time.Time) bool // Config.DeviceFull
	every      time.Duration                    // Config.SnapshotEvery
}

// New loads the CUDA BPF object.
func New(cfg Config, sym *symbolize.Symbolizer) (*Concern, error) {
	if cfg.Symbolizer == nil {
		cfg.Symbolizer = sym
	}
	t, err := NewTracker(cfg)
	if err != nil {
		return nil, err
	}
	top := cfg.TopSites
	if top <= 0 {
		top = 64
	}
	return &Concern{Tracker: t, sym: sym, topSites: top, failures: map[int][]model.CUDAFailure{}, failed: map[int]map[model.CUDAFailureKind]uint64{}, frames: map[int]map[stacks.Site][]model.Frame{}, counts: map[int]map[stacks.Site]stacks.Counts{}, waits: map[int]*waitPoll{}, snapshots: map[int][]*model.GPUMemorySnapshot{}, deviceFull: cfg.DeviceFull, every: cmp.Or(cfg.SnapshotEvery, model.SnapshotEvery)}, nil
}

// Name is the concern's name in logs and `check`.
func (c *Concern) Name() string { return "cuda" }

// Track starts watching pid and remembers its mappings for symbolization,
// as Observe does for libraries hooked later.
func (c *Concern) Track(pid int) error {
	if err := c.Tracker.Track(pid); err != nil {
		return err
	}
	c.sym.Refresh(pid)
	return nil
}

// Untrack drops the kernel state of an exited process and what was kept of it.
func (c *Concern) Untrack(pid int) {
	c.Tracker.Untrack(pid)
	delete(c.failures, pid)
	delete(c.failed, pid)
	delete(c.frames, pid)
	delete(c.counts, pid)
	delete(c.waits, pid)
	delete(c.snapshots, pid)
}

// Fill hooks newly loaded CUDA libraries and fills the CUDA part of each
// process; it returns them all.
func (c *Concern) Fill(now time.Time, procs []*model.Process) ([]*model.Process, error) {
	pids := make([]int, len(procs))
	for i, p := range procs {
		pids[i] = p.PID
		c.stacks.Refresh(p.PID, now)
		if ps := c.procs[p.PID]; ps != nil && ps.tracked.After(now) {
			continue // Track looked at its libraries during this poll
		}
		// The process may exit at any point; its next liveness check ends it.
		hooked, err := c.Refresh(p.PID)
		if err != nil {
			slog.Debug("rescanning CUDA libraries", "pid", p.PID, "err", err)
		}
		if hooked {
			// Remember where the new library lies while it can be read: a
			// failed allocation often comes right before the process dies.
			c.sym.Refresh(p.PID)
		}
	}
	fails, err := c.Failures()
	if err != nil {
		return nil, err
	}
	// The failure that opened each process's snapshot, taken once the
	// live table is read.
	var opened []Failure
	openedAt := map[int]model.CUDAFailure{}
	for _, f := range fails {
		if c.procs[f.PID] == nil {
			continue
		}
		layer := APIs[f.API].Layer
		kind := model.CUDAFailureKind{API: APIs[f.API].Name, Error: ErrorName(layer, f.Code)}
		if c.failed[f.PID] == nil {
			c.failed[f.PID] = map[model.CUDAFailureKind]uint64{}
		}
		c.failed[f.PID][kind]++
		fail := model.CUDAFailure{
			Time:  f.Time,
			API:   kind.API,
			Size:  f.Size,
			Code:  f.Code,
			Error: kind.Error,
			// Symbolized now: the library may be unloaded by the next poll.
			Stack: c.stack(f.PID, stacks.Site{Stack: f.StackID, Py: f.PyStack}),
		}
		// Two threads failing at once may both open it: the first is
		// taken, the kernel's state being one.
		if _, ok := openedAt[f.PID]; f.SnapNs != 0 && !ok {
			opened = append(opened, f)
			openedAt[f.PID] = fail
		}
		kept := append(c.failures[f.PID], fail)
		if len(kept) > maxFailures {
			kept = kept[len(kept)-maxFailures:]
		}
		c.failures[f.PID] = kept
	}
	samples, err := c.Poll(pids)
	if err != nil {
		return nil, err
	}
	for _, f := range opened {
		if err := c.snapshot(f, openedAt[f.PID]); err != nil {
			return nil, err
		}
	}
	for _, p := range procs {
		c.fill(p, samples[p.PID])
		c.fillWaits(now, p, samples[p.PID])
	}
	return procs, nil
}

// fill turns a kernel sample into the model view. Everything is built anew:
// earlier snapshots share the previous maps and slices.
func (c *Concern) fill(p *model.Process, s *Sample) {
	cs := &p.CUDA
	before := cs.LiveBytes // at the previous poll
	cs.LiveBytes, cs.LiveAllocs, cs.HostLiveBytes, cs.HostAllocBytes = 0, 0, 0, 0
	cs.AllocBytes, cs.FreeBytes = map[string]uint64{}, map[string]uint64{}
	cs.AllocCalls, cs.Calls = map[string]uint64{}, map[string]uint64{}
	for i, a := range APIs {
		if s.Calls[i] > 0 {
			cs.Calls[a.Name] = s.Calls[i]
			if a.Alloc() {
				cs.AllocCalls[a.Name] = s.Calls[i]
			}
		}
		if s.AllocBytes[i] > 0 {
			cs.AllocBytes[a.Name] = s.AllocBytes[i]
			if a.Host {
				cs.HostAllocBytes += s.AllocBytes[i]
			}
		}
		if s.FreeBytes[i] > 0 {
			cs.FreeBytes[a.Name] = s.FreeBytes[i]
		}
	}
	bySite := map[int64]*model.CUDASite{}
	for _, a := range s.Allocs {
		// Pinned host memory is not on the GPU: apart, so that live bytes
		// compare with the GPU's own figure.
		if APIs[a.API].Host {
			cs.HostLiveBytes += a.Size
			continue
		}
		cs.LiveBytes += a.Size
		cs.LiveAllocs++
		if a.StackID < 0 {
			continue
		}
		id := stacks.Site{Stack: a.StackID, Py: a.PyStack}.ID()
		site := bySite[id]
		if site == nil {
			site = &model.CUDASite{StackID: id}
			bySite[id] = site
		}
		site.Bytes += a.Size
		site.Allocs = append(site.Allocs, a.Time)
	}
	// Live bytes since the previous poll were at least what they were then
	// and are now; the kernel's mark adds what came and went in between.
	cs.LivePeakBytes = max(s.PeakBytes, before, cs.LiveBytes)
	last := c.counts[p.PID]
	for key, n := range s.Sites {
		id := key.ID()
		site := bySite[id]
		if site == nil {
			site = &model.CUDASite{StackID: id}
			bySite[id] = site
		}
		site.AllocBytes, site.AllocCalls, site.FreeBytes, site.FreeCalls = n.MadeBytes, n.Made, n.ReleasedBytes, n.Released
		was := last[key]
		site.RecentBytes, site.RecentCalls = n.MadeBytes-min(was.MadeBytes, n.MadeBytes), n.Made-min(was.Made, n.Made)
	}
	if len(s.Sites) > 0 {
		c.counts[p.PID] = s.Sites
	}
	sites := make([]model.CUDASite, 0, len(bySite))
	for _, site := range bySite {
		slices.SortFunc(site.Allocs, func(a, b time.Time) int { return a.Compare(b) })
		sites = append(sites, *site)
	}
	c.symbolizeTop(p.PID, sites)
	cs.Sites = sites
	cs.Failures = slices.Clone(c.failures[p.PID])
	cs.FailedCalls = maps.Clone(c.failed[p.PID])
	cs.Snapshots = slices.Clone(c.snapshots[p.PID])
	cs.Libraries = nil
	for _, lib := range c.Libraries(p.PID) {
		cs.Libraries = append(cs.Libraries, lib.Path)
	}
}

// symbolizeTop orders sites, most live bytes first, then most allocated
// since the previous poll, and symbolizes the first topSites by either
// measure: a burst's sites may hold nothing by the time of the poll.
func (c *Concern) symbolizeTop(pid int, sites []model.CUDASite) {
	slices.SortFunc(sites, func(a, b model.CUDASite) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(b.RecentBytes, a.RecentBytes), cmp.Compare(a.StackID, b.StackID))
	})
	for i := range sites[:min(len(sites), c.topSites)] {
		sites[i].Stack = c.stack(pid, stacks.SiteOf(sites[i].StackID))
	}
	// The most allocated since the previous poll, picked without a second
	// sort; those among the first are symbolized already.
	at := make([]int, len(sites))
	for i := range at {
		at[i] = i
	}
	recent := topk.Of(at, c.topSites, func(a, b int) int {
		return cmp.Or(cmp.Compare(sites[b].RecentBytes, sites[a].RecentBytes), cmp.Compare(sites[a].StackID, sites[b].StackID))
	})
	for _, i := range recent {
		if sites[i].RecentBytes > 0 && sites[i].Stack == nil {
			sites[i].Stack = c.stack(pid, stacks.SiteOf(sites[i].StackID))
		}
	}
}

// stack symbolizes a call site of pid once, its Python frames merged in.
// It starts at the caller of the CUDA function (unwind.go).
func (c *Concern) stack(pid int, site stacks.Site) []model.Frame {
	if fr, ok := c.frames[pid][site]; ok {
		return fr
	}
	fr := c.stacks.Frames(pid, site)
	if fr == nil {
		return nil // gone, or not finished yet: looked at again next time
	}
	if c.frames[pid] == nil {
		c.frames[pid] = map[stacks.Site][]model.Frame{}
	}
	c.frames[pid][site] = fr
	return fr
}
