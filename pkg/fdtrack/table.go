package fdtrack

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
)

// nKinds is the number of fd kinds the BPF side distinguishes.
const nKinds = len(fdFdCounts{}.Opened)

// FD is one live fd of a tracked process as the kernel table has it.
type FD struct {
	Num     int32
	Kind    uint8
	StackID int32     // opening stack (Stack); -1 when unknown (seeded from /proc, stack lost)
	Opened  time.Time // wall-clock open time; tracking start for seeded fds
	PyStack uint32    // Python frames (pkg/pyframes); 0: none
}

// Known reports whether the fd's opening site was recorded.
func (fd FD) Known() bool { return fd.StackID >= 0 }

// Sample is what the tracker knows about one process at one poll.
type Sample struct {
	FDs    []FD
	Opened [nKinds]uint64 // since tracking began, by kind
	Closed [nKinds]uint64
	// Failed counts fd-creating calls that failed with EMFILE or ENFILE
	// since tracking began, in the order of model.FDErrnos.
	Failed [nFails]uint64
	// LastFailure is the latest of them: Opened is when it failed, Kind
	// what it tried to create, and the site fields where it was called;
	// Num is -1. nil when none failed.
	LastFailure *FD
	AtStart     int // open fds when tracking began, from /proc
	// Sites is what each call site opened (Made) and closed (Released)
	// since tracking began; a close counts for the site that opened the fd.
	Sites map[stacks.Site]stacks.Counts
}

// nFails is the number of errnos the BPF side counts failures by.
const nFails = len(fdFdCounts{}.Failed)

// Track starts tracking pid: counters first (the BPF side only updates
// existing entries), then the filter, then the table seeded from /proc and,
// if the kernel saw fds go meanwhile, reconciled once more to drop anything
// closed while seeding.
func (t *Tracker) Track(pid int) error {
	tgid := uint32(pid)
	if err := t.table.Claim(tgid, t.tracked); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if err := t.failSites.Claim(tgid, t.tracked); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if err := t.sites.Claim(tgid, t.tracked); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	t.view.Track(pid) // Python frames from its first open on
	zero := make([]fdFdCounts, ebpf.MustPossibleCPU())
	if err := t.maps.FdCounters.Update(tgid, zero, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if err := t.maps.TrackedPids.Update(tgid, uint8(1), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	t.started[tgid] = time.Now()
	t.extraClosed[tgid] = &[nKinds]uint64{}
	gone, err := t.fdsGone(tgid)
	if err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	// A process at its fd limit already ran out before we could see a
	// call fail: what it held then tells.
	if t.atStart[tgid], err = t.reconcile(tgid); err != nil {
		return err
	}
	if again, err := t.fdsGone(tgid); err != nil || again != gone {
		if _, err := t.reconcile(tgid); err != nil {
			return err
		}
	}
	return nil
}

// fdsGone sums what the kernel counted of tgid's fds going: closes and
// resyncs.
func (t *Tracker) fdsGone(tgid uint32) (uint64, error) {
	var per []fdFdCounts
	if err := t.maps.FdCounters.Lookup(tgid, &per); err != nil {
		return 0, err
	}
	var n uint64
	for _, c := range per {
		n += c.Resyncs
		for _, k := range c.Closed {
			n += k
		}
	}
	return n, nil
}

// Untrack stops tracking pid and drops its kernel state, the fds opened
// since the last poll at the next (see bpfobj.Table).
func (t *Tracker) Untrack(pid int) {
	tgid := uint32(pid)
	_ = t.maps.TrackedPids.Delete(tgid)
	_ = t.maps.FdCounters.Delete(tgid)
	// A failure site exists only once a call failed: the one read may
	// know it, else the next read sweeps it.
	t.failSites.Forget(tgid)
	t.table.Forget(tgid)
	t.sites.Forget(tgid)
	t.view.Untrack(pid)
	delete(t.started, tgid)
	delete(t.atStart, tgid)
	delete(t.drift, tgid)
	delete(t.extraClosed, tgid)
	delete(t.resyncs, tgid)
	delete(t.last, tgid)
}

// reconcile makes the table of tgid match /proc/PID/fd, key by key: of the
// entries user space knows for tgid (the last poll's and those seeded
// since), those /proc no longer lists and that are older than the listing
// are dropped and counted as closed; fds that /proc lists and the table
// lacks are added without a stack. Other processes' entries are never read,
// whatever they hold; Poll reads the table first, so that what the process
// opened since the last poll is known, and the read is kept up to date.
// It returns how many fds /proc listed.
func (t *Tracker) reconcile(tgid uint32) (int, error) {
	delete(t.last, tgid) // the table changes from here
	before := monoNow()
	fds, err := t.proc.FDsNow(int(tgid))
	if err != nil {
		return 0, err
	}
	// A process exiting, or exited but not reaped yet, lists no fds (they
	// go early in its exit): its table stays as it was, the leak it shows
	// included. Checked after the listing, which the exit may have emptied.
	if t.proc.FDsGone(int(tgid)) {
		return 0, fmt.Errorf("pid %d is exiting: /proc no longer lists its fds", tgid)
	}
	live := make(map[int32]uint8, len(fds))
	for _, fd := range fds {
		live[int32(fd.Num)] = fd.Kind
	}
	extra := t.extraClosed[tgid]
	gone := map[fdFdKey]bool{}
	for key := range t.table.Keys(tgid) {
		if _, ok := live[key.Fd]; ok {
			continue
		}
		info, ok := t.table.Lookup(key)
		if ok && info.OpenNs >= before {
			continue // opened since the listing
		}
		if ok && t.maps.FdTable.Delete(key) == nil && extra != nil && int(info.Kind) < nKinds {
			extra[info.Kind]++
		}
		gone[key] = true
	}
	t.table.Drop(tgid, gone)
	// Known or not, each listed fd is inserted unless there: one it holds
	// may have come where no tracepoint sees (SCM_RIGHTS) after a close.
	for num, kind := range live {
		key := fdFdKey{Tgid: tgid, Fd: num}
		seed := fdFdInfo{StackId: -1, Kind: kind}
		err := t.maps.FdTable.Update(key, seed, ebpf.UpdateNoExist)
		if err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return 0, fmt.Errorf("seeding fd table for pid %d: %w", tgid, err)
		}
		if err == nil {
			t.table.Put(tgid, key, seed)
		}
	}
	return len(fds), nil
}

// Poll reads the table once and returns a sample for each tracked pid in pids.
// A process whose fds vanished without close() since the last poll (exec,
// close_range) is reconciled with /proc first.
func (t *Tracker) Poll(pids []int) (map[int]*Sample, error) {
	nowWall, nowMono := time.Now(), monoNow()
	table, err := t.table.Read(t.tracked)
	if err != nil {
		return nil, fmt.Errorf("reading fd table: %w", err)
	}
	out := make(map[int]*Sample, len(pids))
	for _, pid := range pids {
		tgid := uint32(pid)
		var per []fdFdCounts
		if err := t.maps.FdCounters.Lookup(tgid, &per); err != nil {
			return nil, fmt.Errorf("reading fd counters of pid %d: %w", pid, err)
		}
		s := &Sample{AtStart: t.atStart[tgid]}
		var resyncs uint64
		for _, c := range per {
			for k := 0; k < nKinds; k++ {
				s.Opened[k] += c.Opened[k]
				s.Closed[k] += c.Closed[k]
			}
			for e := range nFails {
				s.Failed[e] += c.Failed[e]
			}
			resyncs += c.Resyncs
		}
		if resyncs != t.resyncs[tgid] {
			// A process that has just exited cannot be listed; that is not an error.
			if _, err := t.reconcile(tgid); err == nil {
				t.resyncs[tgid] = resyncs
			}
		}
		if extra := t.extraClosed[tgid]; extra != nil {
			for k := range extra {
				s.Closed[k] += extra[k]
			}
		}
		out[pid] = s
	}
	counts, err := t.sites.Read(t.tracked)
	if err != nil {
		return nil, fmt.Errorf("reading the fd call site table: %w", err)
	}
	for pid, s := range out {
		s.Sites = counts[uint32(pid)]
	}
	for pid, s := range out {
		// The kernel keeps a failure site only once a call has failed.
		var info fdFdInfo
		if s.Failed != [nFails]uint64{} && t.maps.FailSites.Lookup(uint32(pid), &info) == nil {
			s.LastFailure = &FD{Num: -1, Kind: info.Kind, StackID: t.stacks.Canonical(info.StackId),
				Opened: nowWall.Add(-time.Duration(nowMono - info.OpenNs)), PyStack: info.PyStack}
		}
	}
	for pid, s := range out {
		tgid := uint32(pid)
		g := table[tgid]
		sum := digest(g)
		if l, ok := t.last[tgid]; ok && l.sum == sum && len(l.fds) == len(g) {
			s.FDs = l.fds
		} else {
			s.FDs = make([]FD, 0, len(g))
			settled := true
			for _, e := range byNum(g) {
				opened := t.started[e.Key.Tgid]
				if e.Val.OpenNs != 0 {
					opened = nowWall.Add(-time.Duration(nowMono - e.Val.OpenNs))
				}
				settled = settled && t.stacks.Settled(e.Val.StackId)
				s.FDs = append(s.FDs, FD{Num: e.Key.Fd, Kind: e.Val.Kind, StackID: t.stacks.Canonical(e.Val.StackId), Opened: opened, PyStack: e.Val.PyStack})
			}
			delete(t.last, tgid)
			if settled {
				t.last[tgid] = lastFDs{sum, s.FDs}
			}
		}
		t.checkDrift(tgid, len(s.FDs))
	}
	if t.polls++; t.polls%bpfobj.StackGCEvery == 0 {
		t.keepStacks(table)
	}
	return out, nil
}

// lastFDs is a process's fds from one poll and the digest of the table
// entries they came from. Shared by the samples of later polls: not to be
// changed.
type lastFDs struct {
	sum uint64
	fds []FD
}

// digest sums a mix of each entry's fd number, open time, stack and kind,
// in any order: an fd closed, opened or replaced changes it. A pass over
// the entries costs far less than turning them into FDs.
func digest(g []bpfobj.Entry[fdFdKey, fdFdInfo]) uint64 {
	var sum uint64
	for _, e := range g {
		x := uint64(uint32(e.Key.Fd))<<32 | uint64(uint32(e.Val.StackId))
		x ^= e.Val.OpenNs*0x9e3779b97f4a7c15 ^ uint64(e.Val.PyStack)<<8 ^ uint64(e.Val.Kind)
		// splitmix64's finalizer: nearby inputs give unrelated outputs.
		x ^= x >> 30
		x *= 0xbf58476d1ce4e5b9
		x ^= x >> 27
		x *= 0x94d049bb133111eb
		x ^= x >> 31
		sum += x
	}
	return sum
}

// byNum returns one process's entries in fd order. The kernel hands out
// the lowest free number, so numbers are dense and placing each entry at
// its number is linear; sorting 15 000 fds each poll was a sixth of what a
// big process cost. Sparse numbers (dup2 to high fds) are sorted.
func byNum(g []bpfobj.Entry[fdFdKey, fdFdInfo]) []bpfobj.Entry[fdFdKey, fdFdInfo] {
	lo, hi := int32(0), int32(-1)
	for _, e := range g {
		lo, hi = min(lo, e.Key.Fd), max(hi, e.Key.Fd)
	}
	out := make([]bpfobj.Entry[fdFdKey, fdFdInfo], 0, len(g))
	if lo < 0 || int(hi) >= 4*len(g)+1024 {
		out = append(out, g...)
		slices.SortFunc(out, func(a, b bpfobj.Entry[fdFdKey, fdFdInfo]) int { return cmp.Compare(a.Key.Fd, b.Key.Fd) })
		return out
	}
	at := make([]int32, hi+1) // index in g + 1; 0: no such fd
	for i, e := range g {
		at[e.Key.Fd] = int32(i + 1)
	}
	for _, i := range at {
		if i > 0 {
			out = append(out, g[i-1])
		}
	}
	return out
}

// keepStacks gives the stack service the stacks this view refers to: of
// live fds, call site counts and failure sites, of any process.
func (t *Tracker) keepStacks(table map[uint32][]bpfobj.Entry[fdFdKey, fdFdInfo]) {
	keep := map[uint32]bool{}
	for _, g := range table {
		for _, e := range g {
			keep[uint32(e.Val.StackId)] = true
			keep[uint32(t.stacks.Canonical(e.Val.StackId))] = true
		}
	}
	t.sites.Keep(keep, t.tracked)
	sites, err := t.failSites.Read(t.tracked)
	if err != nil {
		slog.Warn("reading fd failure sites", "err", err)
		return
	}
	for _, g := range sites {
		for _, e := range g {
			keep[uint32(e.Val.StackId)] = true
			keep[uint32(t.stacks.Canonical(e.Val.StackId))] = true
		}
	}
	t.view.Sweep(keep)
}

// tracked reports whether tgid is tracked: a read of a table drops the
// entries of the others.
func (t *Tracker) tracked(tgid uint32) bool {
	_, ok := t.started[tgid]
	return ok
}

// checkDrift reconciles tgid with /proc when its table count has differed
// from /proc's for two polls in a row: fds created where no tracepoint sees
// them (SCM_RIGHTS, io_uring, userfaultfd, perf_event_open, bpf) would
// otherwise stay missing until the next exec or close_range. One differing
// poll is usually a race with the running process and is let pass.
func (t *Tracker) checkDrift(tgid uint32, n int) {
	procN, err := t.proc.FDCount(int(tgid))
	if err != nil || procN == n || t.proc.FDsGone(int(tgid)) {
		delete(t.drift, tgid)
		return
	}
	if t.drift[tgid]++; t.drift[tgid] < 2 {
		return
	}
	delete(t.drift, tgid)
	if _, err := t.reconcile(tgid); err != nil {
		slog.Debug("reconciling fd table", "pid", tgid, "err", err)
	}
}

// errorNames follows enum err_kind in bpf/common.h.
var errorNames = map[fdErrKind]string{
	fdErrKindERR_TABLE_FULL:  "fd_table_full",
	fdErrKindERR_STACK:       "fd_stack",
	fdErrKindERR_ENTRY_STATE: "fd_entry_state",
	fdErrKindERR_COUNTERS:    "fd_counters",
	fdErrKindERR_READ_USER:   "fd_read_user",
	fdErrKindERR_RINGBUF:     "fd_ringbuf", // unwind requests (bpf/unwind.h)
	fdErrKindERR_SITES:       "fd_sites",
}

// Memory is the kernel memory of the object's maps and programs now.
func (t *Tracker) Memory() uint64 { return t.obj.Memory() }

// Lost returns the BPF error counters (monotonic since load), by source name.
func (t *Tracker) Lost() (map[string]uint64, error) {
	out, err := bpfobj.Counters(t.maps.Errors, errorNames)
	if err != nil {
		return nil, fmt.Errorf("reading error counters: %w", err)
	}
	if t.ownStacks {
		// Else the owner of the shared service counts its losses.
		shared, err := t.stacks.Lost()
		if err != nil {
			return nil, err
		}
		maps.Copy(out, shared)
	}
	return out, nil
}

// monoNow reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
func monoNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}
