package fdtrack

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"os"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
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

// The fd view's bits in a tracked process's value (bpf/tracked.h): its
// children are tracked from fork; a child so marked, not taken yet.
const (
	trackFollow = uint8(fdTrackFlagTRACK_FOLLOW)
	trackForked = uint8(fdTrackFlagTRACK_FORKED)
)

// nFails is the number of errnos the BPF side counts failures by.
const nFails = len(fdFdCounts{}.Failed)

// Track starts tracking pid: counters first (the BPF side only updates
// existing entries), then the filter, then the table. A child the kernel
// tracks from its fork (Config.Follow) is taken once Forked has offered
// it; it keeps what the kernel counted since and starts from its parent's
// table (inherit). Another is seeded from
// /proc and, if the kernel saw fds go meanwhile, reconciled once more to
// drop anything closed while seeding.
func (t *Tracker) Track(pid int) error {
	tgid := uint32(pid)
	fork, forked, stale := t.forkOf(tgid)
	if forked && !t.offered[tgid] {
		return fmt.Errorf("tracking pid %d: %w", pid, errNotOffered)
	}
	live := t.liveOwners()
	if err := t.table.Claim(tgid, live); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if err := t.failSites.Claim(tgid, live); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if err := t.sites.Claim(tgid, live); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	t.view.Track(pid) // Python frames from its first open on
	if !forked {
		flags := ebpf.UpdateNoExist
		if stale {
			// A mark left for an earlier process of that pid: its
			// counts are not this one's.
			_ = t.maps.Forks.Delete(tgid)
			_ = t.maps.ForkFds.Delete(tgid)
			flags = ebpf.UpdateAny
		}
		zero := make([]fdFdCounts, ebpf.MustPossibleCPU())
		if err := t.maps.FdCounters.Update(tgid, zero, flags); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return fmt.Errorf("tracking pid %d: %w", pid, err)
		}
	}
	var follow uint8
	if t.follow {
		follow = trackFollow
	}
	if err := t.member.Track(tgid, follow, trackForked); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	t.started[tgid] = time.Now()
	t.extraClosed[tgid] = &[nKinds]uint64{}
	delete(t.offered, tgid)
	if forked {
		// The listing covers the resyncs asked for before it (an exec
		// since the fork, say).
		var err error
		if t.resyncs[tgid], err = t.resyncsOf(tgid); err != nil {
			return fmt.Errorf("tracking pid %d: %w", pid, err)
		}
		if t.atStart[tgid], err = t.inherit(tgid, fork); err != nil {
			return fmt.Errorf("tracking pid %d: %w", pid, err)
		}
		return nil
	}
	gone, err := t.fdsGone(tgid)
	if err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	// A process at its fd limit already ran out before we could see a
	// call fail: what it held then tells.
	if t.atStart[tgid], err = t.reconcile(tgid, false); err != nil {
		return err
	}
	if again, err := t.fdsGone(tgid); err != nil || again != gone {
		if _, err := t.reconcile(tgid, false); err != nil {
			return err
		}
	}
	return nil
}

// forkOf returns the mark the kernel made at tgid's fork (ok) if tgid is
// still the process it was made for; stale: a mark of an earlier process
// of that pid (its start time is not the fork's).
func (t *Tracker) forkOf(tgid uint32) (fi fdForkInfo, ok, stale bool) {
	if err := t.maps.Forks.Lookup(tgid, &fi); err != nil {
		return fi, false, false
	}
	id, err := t.proc.Identify(int(tgid))
	if err != nil || !startedAt(id.Start, fi.ForkNs) {
		return fi, false, true
	}
	return fi, true, false
}

// startedAt reports whether a process whose /proc start time is ticks
// (USER_HZ, on the boot-time clock) is one forked at forkNs (the
// monotonic clock of bpf_ktime_get_ns): the start is taken early in the
// fork, the mark at its end; ticks are truncated.
func startedAt(ticks, forkNs uint64) bool {
	const tick = uint64(time.Second / 100)
	var boot, mono unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &boot)
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono)
	forkBoot := forkNs + uint64(boot.Nano()-mono.Nano())
	start := ticks * tick
	return start <= forkBoot+tick && forkBoot < start+5*tick
}

// inherit starts the table of tgid, a child tracked since its fork, from
// its parent's as this tracker knows it: the parent's entries older than
// the fork, and what the parent inherited itself, are the child's where
// /proc still lists that number. /proc is listed once, by number; only
// what the parent's table cannot tell (fds the parent closed since, or
// opened after its last read) is described one by one. It returns how
// many fds /proc listed.
func (t *Tracker) inherit(tgid uint32, fork fdForkInfo) (int, error) {
	from := map[int32]uint8{}
	if _, ok := t.started[fork.Parent]; ok {
		for _, e := range t.table.Group(fork.Parent) {
			if e.Val.OpenNs < fork.ForkNs {
				from[e.Key.Fd] = e.Val.Kind
			}
		}
		for num, kind := range t.inherited[fork.Parent] {
			if _, ok := from[num]; !ok {
				from[num] = kind
			}
		}
	}
	t.inherited[tgid] = from
	// The other views need not read what the parent's table told.
	t.proc.SetKindHint(int(tgid), func(num int) (uint8, bool) {
		kind, ok := t.inherited[tgid][int32(num)]
		return kind, ok
	})
	// The kernel's copy of its open-fd bitmap (at its fork, or its exec)
	// says which fds it holds, unless it closed an inherited one since
	// (a resync asked): then /proc is listed.
	nums, at, copied := t.copiedFDs(tgid)
	if t.resyncs[tgid] != 0 {
		copied = false
	}
	var (
		n   int
		err error
	)
	if copied {
		t.reads.Copied++
		t.proc.ShareFDNums(int(tgid), nums)
		n, err = t.reconcileWith(tgid, false, nums, at)
	} else {
		n, err = t.reconcile(tgid, false)
	}
	if err != nil {
		return 0, err
	}
	t.reads.Inherited += uint64(len(t.inherited[tgid]))
	return n, nil
}

// copiedFDs returns the fds tgid held when the kernel last copied its
// open-fd bitmap (bpf/fd.bpf.c, fork_fds) and when (bpf_ktime_get_ns), and
// deletes the copy; ok is false where there is none whole (a table over
// 16 384 fds).
func (t *Tracker) copiedFDs(tgid uint32) (nums []int, at uint64, ok bool) {
	var v fdFdBitmap
	if err := t.maps.ForkFds.Lookup(tgid, &v); err != nil {
		return nil, 0, false
	}
	_ = t.maps.ForkFds.Delete(tgid)
	if v.Nbits == 0 {
		return nil, 0, false
	}
	for w, word := range v.Words {
		for ; word != 0; word &= word - 1 {
			n := w*64 + bits.TrailingZeros64(word)
			if n >= int(v.Nbits) {
				break
			}
			nums = append(nums, n)
		}
	}
	return nums, v.AtNs, true
}

// fdsGone sums what the kernel counted of tgid's fds going: closes and
// resyncs.
func (t *Tracker) fdsGone(tgid uint32) (uint64, error) {
	resyncs, closed, err := t.goneCounts(tgid)
	return resyncs + closed, err
}

// resyncsOf sums the reconciliations the kernel asked for tgid.
func (t *Tracker) resyncsOf(tgid uint32) (uint64, error) {
	resyncs, _, err := t.goneCounts(tgid)
	return resyncs, err
}

// goneCounts sums tgid's resync requests and traced closes over the CPUs.
func (t *Tracker) goneCounts(tgid uint32) (resyncs, closed uint64, err error) {
	var per []fdFdCounts
	if err := t.maps.FdCounters.Lookup(tgid, &per); err != nil {
		return 0, 0, err
	}
	for _, c := range per {
		resyncs += c.Resyncs
		for _, k := range c.Closed {
			closed += k
		}
	}
	return resyncs, closed, nil
}

// Untrack stops tracking pid and drops its kernel state, the fds opened
// since the last poll at the next (see bpfobj.Table). A child marked at
// fork that Track has not taken (refused, not offered yet) is left as it
// is: Forked offers it or lets it go.
func (t *Tracker) Untrack(pid int) {
	tgid := uint32(pid)
	if _, ok := t.started[tgid]; !ok {
		var fi fdForkInfo
		if t.maps.Forks.Lookup(tgid, &fi) == nil {
			return
		}
	}
	t.member.Untrack(tgid, trackFollow|trackForked)
	_ = t.maps.FdCounters.Delete(tgid)
	_ = t.maps.Forks.Delete(tgid)
	_ = t.maps.ForkFds.Delete(tgid)
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
	delete(t.inherited, tgid)
	t.proc.SetKindHint(pid, nil)
	delete(t.inhGen, tgid)
	delete(t.filling, tgid)
	delete(t.pending, tgid)
	delete(t.offered, tgid)
}

// Forked returns the children the kernel tracks from their fork
// (Config.Follow) that Track has not taken yet, for the caller to watch
// or leave; call it once a poll. A child is offered at the second poll
// that sees it, if it still runs: one that lived less than a poll is let
// go without being taken, counted as short-lived with the fds it opened,
// and costs no /proc read and no copy of its parent's table. The
// kernel counted its opens and closes from its fork, so taking the
// others a poll later loses only the stacks of what they opened in that
// poll. Those offered at the last call and not taken are let go now.
func (t *Tracker) Forked() []int {
	if !t.follow {
		return nil
	}
	var (
		child               uint32
		fi                  fdForkInfo
		out                 []int
		leave, ready, fresh []uint32
	)
	seen := map[uint32]bool{}
	it := t.maps.Forks.Iterate()
	for it.Next(&child, &fi) {
		if _, ok := t.started[child]; ok {
			continue
		}
		seen[child] = true
		switch {
		case t.offered[child]:
			leave = append(leave, child)
		case t.pending[child]:
			ready = append(ready, child)
		default:
			fresh = append(fresh, child)
		}
	}
	if err := it.Err(); err != nil {
		slog.Debug("reading the children marked at fork", "err", err)
	}
	for _, c := range leave {
		t.release(c)
	}
	for _, set := range []map[uint32]bool{t.pending, t.offered} {
		for c := range set {
			if !seen[c] {
				delete(set, c)
			}
		}
	}
	for _, c := range ready {
		delete(t.pending, c)
		if id, err := t.proc.Identify(int(c)); err != nil || !id.Running {
			t.release(c)
			continue
		}
		t.offered[c] = true
		out = append(out, int(c))
	}
	for _, c := range fresh {
		t.pending[c] = true
	}
	return out
}

// errNotOffered refuses a child marked at fork that Forked has not
// offered yet: it is taken at the poll after the one that first saw it,
// if it lives that long.
var errNotOffered = errors.New("forked less than a poll ago: taken at the next poll if it still runs")

// release lets go of a child marked at fork that was not taken: counted
// if it is gone, its kernel state deleted; the entries it made go at the
// next read of each table (their owner is no longer live).
func (t *Tracker) release(child uint32) {
	if id, err := t.proc.Identify(int(child)); err != nil || !id.Running {
		t.reads.ShortLived++
		var per []fdFdCounts
		if t.maps.FdCounters.Lookup(child, &per) == nil {
			for _, c := range per {
				for _, n := range c.Opened {
					t.reads.ShortLivedOpens += n
				}
			}
		}
	}
	t.member.Untrack(child, trackFollow|trackForked)
	_ = t.maps.FdCounters.Delete(child)
	_ = t.maps.Forks.Delete(child)
	_ = t.maps.ForkFds.Delete(child)
	delete(t.offered, child)
}

// Reads is what the tracker read from /proc to learn fd tables so far.
func (t *Tracker) Reads() model.FDReads { return t.reads }

// reconcile makes the table of tgid match /proc/PID/fd, listed by number:
// of the entries user space knows for tgid (the last poll's, those seeded
// since and those it inherited), those /proc no longer lists and that are
// older than the listing are dropped and counted as closed; numbers /proc
// lists that none of them has are described (a readlink each) and added
// without a stack, as many as the poll's budget allows, the rest at the
// next polls (filling). Other processes' entries are never read; Poll reads
// the table first, so that what the process opened since the last poll is
// known, and the read is kept up to date. thorough also checks that each
// listed number user space knows still has its entry: an fd closed where
// the kernel saw and given anew where it cannot see (SCM_RIGHTS) has none.
// It returns how many fds /proc listed.
func (t *Tracker) reconcile(tgid uint32, thorough bool) (int, error) {
	before := bpfobj.KtimeNow()
	nums, err := t.proc.FDNumsNow(int(tgid))
	if err != nil {
		return 0, err
	}
	t.reads.Listings++
	return t.reconcileWith(tgid, thorough, nums, before)
}

// reconcileWith is reconcile with the fds tgid held at before (on the
// clock of bpf_ktime_get_ns): a listing, or the kernel's copy of its
// bitmap.
func (t *Tracker) reconcileWith(tgid uint32, thorough bool, nums []int, before uint64) (int, error) {
	delete(t.last, tgid) // the table changes from here
	// A process exiting, or exited but not reaped yet, lists no fds (they
	// go early in its exit): its table stays as it was, the leak it shows
	// included. Checked after the listing, which the exit may have emptied.
	if t.proc.FDsGone(int(tgid)) {
		return 0, fmt.Errorf("pid %d is exiting: /proc no longer lists its fds", tgid)
	}
	listed := make(map[int32]bool, len(nums))
	for _, n := range nums {
		listed[int32(n)] = true
	}
	extra := t.extraClosed[tgid]
	closed := func(kind uint8) {
		if extra != nil && int(kind) < nKinds {
			extra[kind]++
		}
	}
	known := t.table.Keys(tgid)
	gone := map[fdFdKey]bool{}
	for key := range known {
		if listed[key.Fd] {
			continue
		}
		info, ok := t.table.Lookup(key)
		if ok && info.OpenNs >= before {
			continue // opened since the listing (or copy)
		}
		if ok && t.maps.FdTable.Delete(key) == nil {
			closed(info.Kind)
		}
		gone[key] = true
	}
	t.table.Drop(tgid, gone)
	inh := t.inherited[tgid]
	for num, kind := range inh {
		if !listed[num] {
			delete(inh, num)
			closed(kind)
			t.inhGen[tgid]++
		}
	}
	var unknown []int32
	for _, n := range nums {
		num := int32(n)
		if _, ok := inh[num]; ok {
			continue
		}
		key := fdFdKey{Tgid: tgid, Fd: num}
		if _, ok := known[key]; ok {
			if !thorough {
				continue
			}
			if _, ok := t.table.Lookup(key); ok {
				continue
			}
		}
		unknown = append(unknown, num)
	}
	n := min(len(unknown), max(t.budget, 0))
	for _, num := range unknown[:n] {
		kind, err := t.proc.FDKind(int(tgid), int(num))
		if errors.Is(err, os.ErrNotExist) {
			continue // closed since the listing
		}
		if err != nil {
			return 0, err
		}
		key := fdFdKey{Tgid: tgid, Fd: num}
		seed := fdFdInfo{StackId: -1, Kind: kind}
		// A number the kernel has an entry for (opened since the last
		// read) keeps it.
		err = t.maps.FdTable.Update(key, seed, ebpf.UpdateNoExist)
		if err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return 0, fmt.Errorf("seeding fd table for pid %d: %w", tgid, err)
		}
		if err == nil {
			t.table.Put(tgid, key, seed)
		}
	}
	t.budget -= n
	t.reads.Described += uint64(n)
	if rest := len(unknown) - n; rest > 0 {
		t.reads.Deferred += uint64(rest)
		t.filling[tgid] = true
	} else {
		delete(t.filling, tgid)
	}
	return len(nums), nil
}

// Poll reads the table once and returns a sample for each tracked pid in pids.
// A process whose fds vanished without close() since the last poll (exec,
// close_range) is reconciled with /proc first.
func (t *Tracker) Poll(pids []int) (map[int]*Sample, error) {
	nowWall, nowMono := time.Now(), bpfobj.KtimeNow()
	defer func() { t.budget = t.reads.PerPoll }() // for the next poll's Tracks and Poll
	live := t.liveOwners()
	// The suspects of drift: their counters before the table is read, so
	// that checkDrift knows whether their count is exact.
	pre := map[uint32]int64{}
	for tgid := range t.drift {
		if n, ok := t.netOpensNow(tgid); ok {
			pre[tgid] = n
		}
	}
	table, err := t.table.Read(live)
	if err != nil {
		return nil, fmt.Errorf("reading fd table: %w", err)
	}
	out := make(map[int]*Sample, len(pids))
	held := make(map[uint32]int64, len(pids)) // opens less closes when the table was read, by pid
	for _, pid := range pids {
		tgid := uint32(pid)
		var per []fdFdCounts
		if err := t.maps.FdCounters.Lookup(tgid, &per); err != nil {
			return nil, fmt.Errorf("reading fd counters of pid %d: %w", pid, err)
		}
		s := &Sample{AtStart: t.atStart[tgid]}
		held[tgid] = netOpens(per)
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
		if resyncs != t.resyncs[tgid] || t.filling[tgid] && t.budget > 0 {
			// A process that has just exited cannot be listed; that is not an error.
			if _, err := t.reconcile(tgid, false); err == nil {
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
	counts, err := t.sites.Read(live)
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
		inh := t.inherited[tgid]
		t.shadow(tgid, g, inh)
		sum := digest(g) + t.inhGen[tgid]*0x9e3779b97f4a7c15
		if l, ok := t.last[tgid]; ok && l.sum == sum && len(l.fds) == len(g)+len(inh) {
			s.FDs = l.fds
		} else {
			s.FDs = make([]FD, 0, len(g)+len(inh))
			settled := true
			for _, e := range byNum(g) {
				opened := t.started[e.Key.Tgid]
				if e.Val.OpenNs != 0 {
					opened = nowWall.Add(-time.Duration(nowMono - e.Val.OpenNs))
				}
				settled = settled && t.stacks.Settled(e.Val.StackId)
				s.FDs = append(s.FDs, FD{Num: e.Key.Fd, Kind: e.Val.Kind, StackID: t.stacks.Canonical(e.Val.StackId), Opened: opened, PyStack: e.Val.PyStack})
			}
			if len(inh) > 0 {
				// Inherited fds are described as seeded ones are: no
				// stack, open since tracking began.
				for num, kind := range inh {
					s.FDs = append(s.FDs, FD{Num: num, Kind: kind, StackID: -1, Opened: t.started[tgid]})
				}
				slices.SortFunc(s.FDs, func(a, b FD) int { return cmp.Compare(a.Num, b.Num) })
			}
			delete(t.last, tgid)
			if settled {
				t.last[tgid] = lastFDs{sum, s.FDs}
			}
		}
		p, ok := pre[tgid]
		t.checkDrift(tgid, len(s.FDs), held[tgid], p, ok)
	}
	if t.polls++; t.polls%bpfobj.StackGCEvery == 0 {
		t.keepStacks(table, live)
	}
	return out, nil
}

// shadow drops the inherited fds of tgid that its kernel entries g
// replaced (dup2 onto an inherited number, or one closed and given anew),
// each counted as closed.
func (t *Tracker) shadow(tgid uint32, g []bpfobj.Entry[fdFdKey, fdFdInfo], inh map[int32]uint8) {
	if len(inh) == 0 {
		return
	}
	extra := t.extraClosed[tgid]
	for _, e := range g {
		kind, ok := inh[e.Key.Fd]
		if !ok {
			continue
		}
		delete(inh, e.Key.Fd)
		if extra != nil && int(kind) < nKinds {
			extra[kind]++
		}
		t.inhGen[tgid]++
	}
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
func (t *Tracker) keepStacks(table map[uint32][]bpfobj.Entry[fdFdKey, fdFdInfo], live func(uint32) bool) {
	keep := map[uint32]bool{}
	for _, g := range table {
		for _, e := range g {
			keep[uint32(e.Val.StackId)] = true
			keep[uint32(t.stacks.Canonical(e.Val.StackId))] = true
		}
	}
	t.sites.Keep(keep, live)
	sites, err := t.failSites.Read(live)
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

// liveOwners returns whether a table entry's owner is tracked, for a read
// of a table, which drops the entries of the others: processes Track took,
// and children the kernel tracks from their fork that are not taken yet
// (asked of the kernel once per owner and read).
func (t *Tracker) liveOwners() func(tgid uint32) bool {
	marked := map[uint32]bool{}
	return func(tgid uint32) bool {
		if _, ok := t.started[tgid]; ok {
			return true
		}
		if !t.follow {
			return false
		}
		m, ok := marked[tgid]
		if !ok {
			var fi fdForkInfo
			m = t.maps.Forks.Lookup(tgid, &fi) == nil
			marked[tgid] = m
		}
		return m
	}
}

// checkDrift reconciles tgid with /proc when its table count n differs
// from /proc's: fds created where no tracepoint sees them (SCM_RIGHTS,
// io_uring, userfaultfd, perf_event_open, bpf) would otherwise stay
// missing until the next exec or close_range. /proc is read later in the
// poll than the table, so a process that opens or closes fds differs now
// and then by a race; a leaking one did so every few polls, the longer
// its table the more often, and each time its whole table was
// reconciled: a cost that grew with the leak. So a difference only makes
// tgid a suspect (what the kernel counted since the table was read, held
// then, is taken into account); it is reconciled at a later poll that
// finds the difference with the count exact: its counters the same from
// before the table was read (pre, read for suspects only) to after /proc
// was. A poll that cannot say leaves the suspicion as it is.
func (t *Tracker) checkDrift(tgid uint32, n int, held, pre int64, havePre bool) {
	if t.filling[tgid] {
		return // differs until filled
	}
	procN, err := t.proc.FDCount(int(tgid))
	if err != nil || procN == n || t.proc.FDsGone(int(tgid)) {
		delete(t.drift, tgid)
		return
	}
	// They differ: again, with what the kernel counted since n was read.
	before, okBefore := t.netOpensNow(tgid)
	procN, err = t.proc.FDCount(int(tgid))
	after, okAfter := t.netOpensNow(tgid)
	if err != nil || !okBefore || !okAfter || before != after {
		return // changed while /proc was read: says nothing
	}
	if procN == n+int(after-held) {
		delete(t.drift, tgid)
		return
	}
	if !t.drift[tgid] || !havePre || pre != held || held != after {
		t.drift[tgid] = true // a suspect, until a poll with an exact count
		return
	}
	delete(t.drift, tgid)
	if _, err := t.reconcile(tgid, true); err != nil {
		slog.Debug("reconciling fd table", "pid", tgid, "err", err)
	}
}

// netOpens is the fds opened less those closed, as counted in the
// kernel's per-CPU counters per.
func netOpens(per []fdFdCounts) int64 {
	var n int64
	for _, c := range per {
		for k := 0; k < nKinds; k++ {
			n += int64(c.Opened[k]) - int64(c.Closed[k])
		}
	}
	return n
}

// netOpensNow reads tgid's counters now (netOpens).
func (t *Tracker) netOpensNow(tgid uint32) (int64, bool) {
	var per []fdFdCounts
	if err := t.maps.FdCounters.Lookup(tgid, &per); err != nil {
		return 0, false
	}
	return netOpens(per), true
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
	fdErrKindERR_READ_KERNEL: "fd_read_kernel", // a child's open-fd bitmap
	// Children forked faster than polls take them (fork_fds, forks): read
	// from /proc at their first poll instead.
	fdErrKindERR_FORKS: "fd_forks",
}

// Memory is the kernel memory of the object's maps and programs now.
func (t *Tracker) Memory() uint64 { return t.obj.Memory() }

// Lost returns the BPF error counters (monotonic since load), by source name.
func (t *Tracker) Lost() (map[string]uint64, error) {
	out, err := bpfobj.Counters(t.maps.Errors, errorNames)
	if err != nil {
		return nil, fmt.Errorf("reading error counters: %w", err)
	}
	return out, t.stacks.AddLost(out)
}
