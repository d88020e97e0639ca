package cudatrack

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
)

// Memory snapshots at failed allocations (model.GPUMemorySnapshot). The
// kernel opens a process's snapshot at the return of a failed allocation
// (bpf/cuda.bpf.c, oom_snaps) and, while it is open, keeps in freed_allocs
// every allocation made at or before the failure that a free removes from
// the live table. At its next poll user space puts together what was live
// at the failure from both tables, then closes the snapshot and empties
// freed_allocs of the process.

// heldAlloc is one device allocation live at a failure.
type heldAlloc struct {
	site   stacks.Site
	size   uint64
	timeNs uint64 // when it was made, kernel clock
	// freedAfter: freed between the failure and the read of the live
	// table, kept by the kernel for the snapshot.
	freedAfter bool
}

// gatherAt returns the device allocations live at atNs (the failure that
// opened a snapshot, kernel clock): the live table's entries made at or
// before it and those freed since (freed), each once. A block both in the
// live table and in freed was freed after the live table was read: the
// kernel keeps it before deleting it. Pinned host memory is left out, as
// in the process's live bytes. canon maps a stack id to its canonical one.
func gatherAt(atNs uint64, live []bpfobj.Entry[cudaCudaAllocKey, cudaCudaAlloc], freed []bpfobj.Entry[cudaCudaAllocKey, cudaCudaFreed], canon func(int32) int32) []heldAlloc {
	type id struct {
		key    cudaCudaAllocKey
		timeNs uint64
	}
	seen := make(map[id]bool, len(live))
	var out []heldAlloc
	add := func(k cudaCudaAllocKey, a cudaCudaAlloc, freedAfter bool) {
		if a.TimeNs > atNs || int(a.Api) >= len(APIs) || APIs[a.Api].Host || seen[id{k, a.TimeNs}] {
			return
		}
		seen[id{k, a.TimeNs}] = true
		out = append(out, heldAlloc{site: stacks.Site{Stack: canon(a.StackId), Py: a.PyStack}, size: a.Size, timeNs: a.TimeNs, freedAfter: freedAfter})
	}
	for _, e := range live {
		add(e.Key, e.Val, false)
	}
	for _, e := range freed {
		// Freed before the failure: left by an earlier snapshot's close.
		if e.Val.FreedNs >= atNs {
			add(e.Key, e.Val.Alloc, true)
		}
	}
	return out
}

// fillSnapshot sets the live memory of s from held, allocations live at
// atNs: totals, and by call site, most bytes first, cut at
// model.MaxSnapshotSites. stack symbolizes a site (nil: unknown); only the
// sites kept are.
func fillSnapshot(s *model.GPUMemorySnapshot, held []heldAlloc, atNs uint64, stack func(stacks.Site) []model.Frame) {
	type acc struct {
		site   stacks.Site
		oldest uint64
		model.SnapshotSite
	}
	bySite := map[stacks.Site]*acc{}
	s.LiveBytes, s.LiveAllocations, s.FreedAfterBytes = 0, 0, 0
	for _, h := range held {
		s.LiveBytes += h.size
		s.LiveAllocations++
		a := bySite[h.site]
		if a == nil {
			a = &acc{site: h.site, oldest: h.timeNs}
			bySite[h.site] = a
		}
		a.Bytes += h.size
		a.Allocations++
		a.oldest = min(a.oldest, h.timeNs)
		if h.freedAfter {
			a.FreedAfterBytes += h.size
			s.FreedAfterBytes += h.size
		}
	}
	sites := make([]*acc, 0, len(bySite))
	for _, a := range bySite {
		sites = append(sites, a)
	}
	slices.SortFunc(sites, func(a, b *acc) int {
		return cmp.Or(cmp.Compare(b.Bytes, a.Bytes), cmp.Compare(a.site.ID(), b.site.ID()))
	})
	s.Sites, s.OtherSitesBytes = nil, 0
	for i, a := range sites {
		if i >= model.MaxSnapshotSites {
			s.OtherSitesBytes += a.Bytes
			continue
		}
		a.OldestAgeSeconds = time.Duration(atNs - min(a.oldest, atNs)).Seconds()
		a.Stack = stack(a.site)
		s.Sites = append(s.Sites, a.SnapshotSite)
	}
}

// heldAt reads what pid held at the failure that opened its snapshot at
// atNs: the live table as the last Poll read it, and the allocations freed
// since the failure. It also returns the frees the kernel could not keep.
// The freed table is read after the live table: a block freed in between
// is in one or the other.
func (t *Tracker) heldAt(pid int, atNs uint64) ([]heldAlloc, uint64, error) {
	tgid := uint32(pid)
	freed, err := t.freed.Read(t.tracked)
	if err != nil {
		return nil, 0, fmt.Errorf("reading the allocations freed after a failure: %w", err)
	}
	var st cudaCudaSnap
	if err := t.maps.OomSnaps.Lookup(tgid, &st); err != nil {
		return nil, 0, fmt.Errorf("reading the snapshot state of pid %d: %w", pid, err)
	}
	return gatherAt(atNs, t.live.Group(tgid), freed[tgid], t.stacks.Canonical), st.Missed, nil
}

// closeSnapshot closes pid's snapshot, the next not to open before
// notBefore (kernel clock; 0: at the next failure), and empties
// freed_allocs of pid as heldAt read it. Blocks freed between that read
// and the close stay until the next snapshot's read, which leaves them out
// (freed before its failure) and deletes them.
func (t *Tracker) closeSnapshot(pid int, notBefore uint64) error {
	tgid := uint32(pid)
	err := t.maps.OomSnaps.Update(tgid, cudaCudaSnap{NotBeforeNs: notBefore}, ebpf.UpdateExist)
	t.freed.Forget(tgid)
	if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("closing the snapshot of pid %d: %w", pid, err)
	}
	return nil
}

// snapshot takes the snapshot that failure f (fail, as the model has it)
// opened, keeps it when the failure was out of memory or the device full,
// and closes it in the kernel.
func (c *Concern) snapshot(f Failure, fail model.CUDAFailure) error {
	held, missed, err := c.heldAt(f.PID, f.SnapNs)
	if err != nil {
		return err
	}
	why := ""
	switch {
	case model.OutOfMemory(fail.Error, f.Code):
		why = model.SnapshotOutOfMemory
	case c.deviceFull != nil && c.deviceFull(f.PID, f.Time):
		why = model.SnapshotDeviceFull
	}
	var notBefore uint64
	if why != "" {
		s := &model.GPUMemorySnapshot{
			Time: f.Time, API: fail.API, Error: fail.Error, Code: f.Code, SizeBytes: f.Size, Stack: fail.Stack,
			Why: why, MissedFrees: missed,
		}
		fillSnapshot(s, held, f.SnapNs, func(site stacks.Site) []model.Frame { return c.stack(f.PID, site) })
		if f.LiveBytes != int64(s.LiveBytes) {
			// The tables lost what the running sum has: a full live table
			// or freed_allocs (MissedFrees).
			slog.Debug("memory snapshot short of the kernel's live bytes", "pid", f.PID, "snapshot", s.LiveBytes, "kernel", f.LiveBytes, "missed_frees", missed)
		}
		kept := append(c.snapshots[f.PID], s)
		if len(kept) > model.MaxSnapshots {
			kept = kept[len(kept)-model.MaxSnapshots:]
		}
		c.snapshots[f.PID] = kept
		notBefore = f.SnapNs + uint64(c.every)
	}
	return c.closeSnapshot(f.PID, notBefore)
}
