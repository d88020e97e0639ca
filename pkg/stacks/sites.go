package stacks

import (
	"errors"
	"log/slog"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
)

// Site is a call site: a native stack (its canonical id) and a Python
// stack (0: none). The same in every view.
type Site struct {
	Stack int32
	Py    uint32
}

// ID numbers a site for the model (model.CUDASite.StackID,
// model.FDSite.StackID): the native id alone without Python frames, both
// otherwise, positive. A negative native id (no stack) stays what it was.
func (s Site) ID() int64 {
	if s.Stack < 0 || s.Py == 0 {
		return int64(s.Stack)
	}
	return int64(s.Py)<<31 | int64(s.Stack)
}

// SiteOf undoes Site.ID.
func SiteOf(id int64) Site {
	if id < 0 {
		return Site{Stack: int32(id)}
	}
	return Site{Stack: int32(id & (1<<31 - 1)), Py: uint32(id >> 31)}
}

// Counts is what went through a site since tracking began: things made
// (fds opened, blocks allocated) and released, a release counted for the
// site that made what it releases.
type Counts struct {
	Made, MadeBytes, Released, ReleasedBytes uint64
}

// Sites reads one object's site table (bpf/sites.h) each poll, per process
// and canonical site, and keeps it small: an entry with nothing held and
// nothing new since the last poll is taken away (lookup-and-delete, so no
// count that came in between is lost) and its totals kept here, so a
// process's many short-lived sites do not hold its cap or the table. A
// kernel without lookup-and-delete on hash maps (before 5.14) keeps every
// entry until its process goes: the cap bounds them.
//
// A Sites belongs to the poll goroutine of its view.
type Sites struct {
	svc     *Service
	table   *bpfobj.Table[stacksSiteKey, stacksSiteCounts]
	owners  *bpfobj.Table[stacksSiteOwnerKey, uint64]
	last    map[stacksSiteKey]stacksSiteCounts // the previous read, to find idle entries
	next    map[stacksSiteKey]stacksSiteCounts // this read's, swapped with last
	retired map[uint32]map[Site]Counts         // totals of the entries taken away, by process
	swept   map[uint32]uint64                  // entries taken away, by process (SITES_SWEPT)
	noSweep bool
	total   uint64 // entries taken away since the start
}

// Swept is how many entries have been taken away since the start.
func (t *Sites) Swept() uint64 { return t.total }

// Sites reads an object's sites and site_owners maps.
func (s *Service) Sites(sites, owners *ebpf.Map) *Sites {
	return &Sites{
		svc:     s,
		table:   bpfobj.NewTable(sites, func(k stacksSiteKey, _ stacksSiteCounts) uint32 { return k.Tgid }),
		owners:  bpfobj.NewTable(owners, func(k stacksSiteOwnerKey, _ uint64) uint32 { return k.Tgid }),
		last:    map[stacksSiteKey]stacksSiteCounts{},
		next:    map[stacksSiteKey]stacksSiteCounts{},
		retired: map[uint32]map[Site]Counts{},
		swept:   map[uint32]uint64{},
	}
}

// Claim readies the tables for a new process (bpfobj.Table.Claim).
func (t *Sites) Claim(tgid uint32, live func(uint32) bool) error {
	if err := t.table.Claim(tgid, live); err != nil {
		return err
	}
	return t.owners.Claim(tgid, live)
}

// Forget drops what a process left.
func (t *Sites) Forget(tgid uint32) {
	t.table.Forget(tgid)
	for _, which := range []stacksSiteOwnerCount{stacksSiteOwnerCountSITES_MADE, stacksSiteOwnerCountSITES_SWEPT} {
		t.owners.Put(tgid, stacksSiteOwnerKey{Tgid: tgid, Which: uint32(which)}, 0)
	}
	t.owners.Forget(tgid)
	delete(t.retired, tgid)
	delete(t.swept, tgid)
}

// Read returns the totals of every site of the live processes, by process
// and site, and deletes the entries of the others.
func (t *Sites) Read(live func(uint32) bool) (map[uint32]map[Site]Counts, error) {
	groups, err := t.table.Read(live)
	if err != nil {
		return nil, err
	}
	out := make(map[uint32]map[Site]Counts, len(groups))
	clear(t.next)
	defer func() { t.last, t.next = t.next, t.last }()
	for tgid, g := range groups {
		m := make(map[Site]Counts, len(g)+len(t.retired[tgid]))
		for site, c := range t.retired[tgid] {
			m[site] = c
		}
		var gone map[stacksSiteKey]bool
		for _, e := range g {
			// A stack first finished in user space has an id of its own
			// until known: one site may sit under two.
			site := Site{t.svc.Canonical(e.Key.StackId), e.Key.PyStack}
			v := e.Val
			if fin, ok := t.sweep(e.Key, v); ok {
				if gone == nil {
					gone = map[stacksSiteKey]bool{}
				}
				gone[e.Key] = true
				t.retire(tgid, site, fin)
				m[site] = add(m[site], fin)
				continue
			}
			t.next[e.Key] = v
			m[site] = add(m[site], v)
		}
		if len(gone) > 0 {
			t.table.Drop(tgid, gone)
			key := stacksSiteOwnerKey{Tgid: tgid, Which: uint32(stacksSiteOwnerCountSITES_SWEPT)}
			if err := t.owners.Map.Put(key, t.swept[tgid]); err != nil {
				// The kernel counts the entries as held: the cap comes early.
				slog.Debug("writing the sites taken away", "pid", tgid, "err", err)
			} else {
				t.owners.Put(tgid, key, t.swept[tgid])
			}
		}
		out[tgid] = m
	}
	return out, nil
}

// sweep takes away the entry k, whose value this read is v, if nothing it
// made is held and nothing moved since the last read. It returns the
// entry's final counts.
func (t *Sites) sweep(k stacksSiteKey, v stacksSiteCounts) (stacksSiteCounts, bool) {
	prev, seen := t.last[k]
	if t.noSweep || !seen || prev != v || v.Made != v.Released {
		return v, false
	}
	var fin stacksSiteCounts
	switch err := t.table.Map.LookupAndDelete(k, &fin); {
	case err == nil:
		t.swept[k.Tgid]++
		t.total++
		return fin, true
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return v, false
	default:
		slog.Debug("idle call sites stay in the kernel (no lookup-and-delete on hash maps)", "err", err)
		t.noSweep = true
		return v, false
	}
}

// maxRetired bounds the sites taken away whose totals are kept per
// process, each with its stack; the counts of more go to a site without a
// stack.
const maxRetired = 4 * DefaultMaxSitesPerProc

func (t *Sites) retire(tgid uint32, site Site, c stacksSiteCounts) {
	r := t.retired[tgid]
	if r == nil {
		r = map[Site]Counts{}
		t.retired[tgid] = r
	}
	if _, ok := r[site]; !ok && len(r) >= maxRetired {
		site = Site{Stack: -1}
	}
	r[site] = add(r[site], c)
}

func add(a Counts, c stacksSiteCounts) Counts {
	a.Made += c.Made
	a.MadeBytes += c.MadeBytes
	a.Released += c.Released
	a.ReleasedBytes += c.ReleasedBytes
	return a
}

// Keep adds the stack ids the last read refers to, those of the sites
// taken away included (their frames name them in profiles), and drops the
// owner entries of processes gone (made by an event after their last
// read).
func (t *Sites) Keep(keep map[uint32]bool, live func(uint32) bool) {
	for k := range t.last {
		keep[uint32(k.StackId)] = true
		keep[uint32(t.svc.Canonical(k.StackId))] = true
	}
	for _, r := range t.retired {
		for site := range r {
			keep[uint32(site.Stack)] = true
		}
	}
	if _, err := t.owners.Read(live); err != nil {
		slog.Warn("reading site owners", "err", err)
	}
}
