// Package nccltrack hooks libnccl.so.2 in tracked processes with uprobes
// (bpf/nccl.bpf.c) and reads what the kernel keeps: per communicator and
// rank, the calls and bytes of each collective and point-to-point
// operation, and the time, operation and call site of the last one. The
// library is found in /proc/PID/maps and hooked when it appears, so one
// loaded late with dlopen (as PyTorch does) is picked up at the next poll.
package nccltrack

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/prometheus/procfs"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracked"
)

// Config sizes the kernel side.
type Config struct {
	ProcRoot string // normally /proc
	// Cache, when set, shares reads of /proc/PID/maps with the other
	// concerns within a poll.
	Cache *procinfo.PollCache
	// Symbolizer and Stacks: as in cudatrack.Config (nil: the tracker's
	// own).
	Symbolizer *symbolize.Symbolizer
	Stacks     *stacks.Service
	// Tracked is the map of tracked processes shared with the other
	// objects; nil: one of the tracker's own, closed with it.
	Tracked *tracked.Set
}

// IsLibrary tells whether a mapped file is NCCL by its base name:
// libnccl.so.2 as NVIDIA and the nvidia-nccl wheels ship it, or another
// version. NCCL's plugins (libnccl-net.so, libnccl-tuner.so) are not.
func IsLibrary(path string) bool {
	base := filepath.Base(path)
	return base == "libnccl.so" || strings.HasPrefix(base, "libnccl.so.")
}

// MapsLibrary tells whether pid maps a libnccl executable: a process the
// daemon watches.
func MapsLibrary(fs procinfo.FS, pid int) (bool, error) {
	ms, err := fs.Maps(pid)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(ms, func(m *procfs.ProcMap) bool {
		return m.Perms != nil && m.Perms.Execute && IsLibrary(m.Pathname)
	}), nil
}

// Tracker owns the loaded NCCL object and the uprobe links of the
// libraries tracked processes map.
type Tracker struct {
	procRoot string
	proc     procinfo.FS
	coll     *ebpf.Collection
	maps     ncclMaps
	// Entry programs: one for every function where the kernel has
	// cookies, else one per function (by Ops index).
	enter  *ebpf.Program
	byOp   []*ebpf.Program
	ret    *ebpf.Program
	procs  map[int]*procState
	hooks  map[inodeKey]*attached // shared by the processes mapping a file, as in cudatrack
	frames map[int]map[stacks.Site][]model.Frame
	polls  int

	members bpfobj.Members
	stacks  stacks.Handle
	view    *stacks.View
	member  *tracked.View
}

type inodeKey struct{ dev, inode uint64 }

type procState struct {
	libs map[inodeKey]string // hooked libnccl files it maps, by path
	// counted: its tracked_pids bit is set; made when it first maps a
	// libnccl, as most tracked processes never do.
	counted bool
}

type attached struct {
	links []link.Link
	refs  int
}

// NewTracker loads the NCCL object. Nothing is attached until Track.
func NewTracker(cfg Config) (*Tracker, error) {
	spec, err := loadNccl()
	if err != nil {
		return nil, err
	}
	cookies := bpfobj.Probe().Cookies
	for name := range spec.Programs {
		if perOp := strings.HasPrefix(name, "enter_"); (cookies && perOp) || (!cookies && name == "nccl_enter") {
			delete(spec.Programs, name)
		}
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	proc, err := procinfo.New(cfg.ProcRoot)
	if err != nil {
		return nil, err
	}
	t := &Tracker{procRoot: cfg.ProcRoot, proc: proc.WithPollCache(cfg.Cache), procs: map[int]*procState{}, hooks: map[inodeKey]*attached{}, frames: map[int]map[stacks.Site][]model.Frame{}}
	if t.member, err = tracked.Join(cfg.Tracked); err != nil {
		return nil, err
	}
	if t.stacks, err = stacks.Hold(cfg.Stacks, t.proc, cfg.Symbolizer, cfg.ProcRoot); err != nil {
		_ = t.member.Close()
		return nil, err
	}
	replace := t.member.With(t.stacks.Replacements())
	if err = t.member.Prepare(spec); err == nil {
		err = t.stacks.Prepare(spec)
	}
	if err == nil {
		t.coll, err = bpfobj.LoadCollection(spec, "nccl BPF programs", replace)
	}
	if err != nil {
		t.Close()
		return nil, err
	}
	t.members = bpfobj.MembersOf(t.coll, replace)
	if err := t.coll.Assign(&t.maps); err != nil {
		t.Close()
		return nil, err
	}
	t.view = t.stacks.Join("nccl")
	t.ret = t.coll.Programs["nccl_setup_return"]
	if cookies {
		t.enter = t.coll.Programs["nccl_enter"]
	} else {
		for _, op := range Ops {
			p := t.coll.Programs["enter_"+op.Func]
			if p == nil {
				t.Close()
				return nil, fmt.Errorf("the nccl object has no entry program for %s", op.Func)
			}
			t.byOp = append(t.byOp, p)
		}
	}
	return t, nil
}

// Track starts watching pid and hooks the libnccl it has mapped.
func (t *Tracker) Track(pid int) error {
	if t.procs[pid] == nil {
		t.procs[pid] = &procState{libs: map[inodeKey]string{}}
	}
	t.view.Track(pid) // Python frames of its call sites
	_, err := t.Refresh(pid)
	return err
}

// Refresh hooks the libnccl files pid has mapped since the last call and
// lets go of those it has unmapped; it reports whether one was newly
// hooked.
func (t *Tracker) Refresh(pid int) (bool, error) {
	ps := t.procs[pid]
	if ps == nil {
		return false, fmt.Errorf("pid %d is not tracked", pid)
	}
	ms, err := t.proc.Maps(pid)
	if err != nil {
		return false, fmt.Errorf("reading the mappings of pid %d: %w", pid, err)
	}
	present := map[inodeKey]bool{}
	added := false
	for _, m := range ms {
		if m.Perms == nil || !m.Perms.Execute || m.Inode == 0 || !IsLibrary(m.Pathname) || strings.HasSuffix(m.Pathname, " (deleted)") {
			continue
		}
		k := inodeKey{m.Dev, m.Inode}
		present[k] = true
		if _, ok := ps.libs[k]; ok {
			continue
		}
		if !ps.counted {
			if err := t.member.Track(uint32(pid), 0, 0); err != nil {
				return added, fmt.Errorf("tracking pid %d: %w", pid, err)
			}
			ps.counted = true
		}
		at := t.hooks[k]
		if at == nil {
			links := t.attach(pid, m.Pathname)
			if len(links) == 0 {
				continue // retried at the next poll
			}
			at = &attached{links: links}
			t.hooks[k] = at
		}
		at.refs++
		ps.libs[k] = m.Pathname
		added = true
	}
	for k := range ps.libs {
		if !present[k] {
			t.release(k)
			delete(ps.libs, k)
		}
	}
	return added, nil
}

func (t *Tracker) release(k inodeKey) {
	at := t.hooks[k]
	if at == nil {
		return
	}
	if at.refs--; at.refs > 0 {
		return
	}
	_ = bpfobj.CloseLinks(at.links)
	delete(t.hooks, k)
}

// attach hooks each function of Ops that the library (as pid sees it)
// defines, for every process: the programs return at once for one not in
// tracked_pids. An older library lacking a function is hooked without it.
func (t *Tracker) attach(pid int, path string) []link.Link {
	ex, err := link.OpenExecutable(filepath.Join(t.procRoot, strconv.Itoa(pid), "root", path))
	if err != nil {
		slog.Warn("hooking libnccl", "pid", pid, "path", path, "err", err)
		return nil
	}
	var links, setups []link.Link
	var missing []string
	for i, op := range Ops {
		prog, opts := t.enter, &link.UprobeOptions{Cookie: uint64(i)}
		if t.byOp != nil {
			prog, opts = t.byOp[i], nil
		}
		if op.Setup {
			// The return first: an entry without it would leave state
			// in flight.
			out, err := ex.Uretprobe(op.Func, t.ret, nil)
			if err != nil {
				missing = append(missing, op.Func)
				continue
			}
			setups = append(setups, out)
		}
		in, err := ex.Uprobe(op.Func, prog, opts)
		if err != nil {
			missing = append(missing, op.Func)
			continue
		}
		links = append(links, in)
	}
	if len(links) == 0 {
		// Retried at each poll: said once at warning level would need a
		// record per file; the next process to map it tries again.
		slog.Debug("libnccl defines none of the hooked functions", "pid", pid, "path", path)
		_ = bpfobj.CloseLinks(setups)
		return nil
	}
	if len(missing) > 0 {
		slog.Info("libnccl lacks some hooked functions (older version?)", "pid", pid, "path", path, "missing", missing)
	}
	slog.Debug("hooked libnccl", "pid", pid, "path", path, "functions", len(links))
	return append(links, setups...)
}

// Untrack stops tracking pid: the hooks no other process needs are
// detached, and its kernel entries deleted.
func (t *Tracker) Untrack(pid int) {
	ps := t.procs[pid]
	if ps == nil {
		return
	}
	for k := range ps.libs {
		t.release(k)
	}
	delete(t.procs, pid)
	delete(t.frames, pid)
	if ps.counted {
		t.member.Untrack(uint32(pid), 0)
	}
	t.forget(uint32(pid))
	t.view.Untrack(pid)
}

// forget deletes the table entries of tgid (the filter is off by now).
func (t *Tracker) forget(tgid uint32) {
	for _, m := range []*ebpf.Map{t.maps.Comms, t.maps.NcclCounters} {
		var (
			keys []ncclNcclKey
			k    ncclNcclKey
			v    []byte // either table's value, unread
		)
		it := m.Iterate()
		for it.Next(&k, &v) {
			if k.Tgid == tgid {
				keys = append(keys, k)
			}
		}
		for _, k := range keys {
			_ = m.Delete(k)
		}
	}
}

// Libraries returns the paths of the libnccl files hooked in pid.
func (t *Tracker) Libraries(pid int) []string {
	ps := t.procs[pid]
	if ps == nil {
		return nil
	}
	out := slices.Collect(maps.Values(ps.libs))
	slices.Sort(out)
	return slices.Compact(out)
}

// comm is one handle of one process as the kernel has it.
type comm struct {
	info   *ncclNcclComm // nil: set up before tracking began
	counts *ncclNcclCounts
}

// read returns the tables' entries of tracked processes, by process and
// handle.
func (t *Tracker) read() (map[uint32]map[uint64]*comm, error) {
	out := map[uint32]map[uint64]*comm{}
	get := func(k ncclNcclKey) *comm {
		if t.procs[int(k.Tgid)] == nil {
			return nil
		}
		if out[k.Tgid] == nil {
			out[k.Tgid] = map[uint64]*comm{}
		}
		c := out[k.Tgid][k.Comm]
		if c == nil {
			c = &comm{}
			out[k.Tgid][k.Comm] = c
		}
		return c
	}
	var (
		k  ncclNcclKey
		ci ncclNcclComm
		cc ncclNcclCounts
	)
	it := t.maps.Comms.Iterate()
	for it.Next(&k, &ci) {
		if c := get(k); c != nil {
			v := ci
			c.info = &v
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the communicator table: %w", err)
	}
	it = t.maps.NcclCounters.Iterate()
	for it.Next(&k, &cc) {
		if c := get(k); c != nil {
			v := cc
			c.counts = &v
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the collective counters: %w", err)
	}
	return out, nil
}

// Poll returns the communicators of each pid, by ID then rank; a handle
// set up before tracking began has ID "" and rank and size -1.
func (t *Tracker) Poll(pids []int) (map[int][]model.NCCLComm, error) {
	tables, err := t.read()
	if err != nil {
		return nil, err
	}
	toWall := bpfobj.WallClock()
	out := make(map[int][]model.NCCLComm, len(pids))
	keep := map[uint32]bool{}
	for _, pid := range pids {
		var cs []model.NCCLComm
		for _, c := range tables[uint32(pid)] {
			m := model.NCCLComm{Rank: -1, NRanks: -1, Calls: map[string]uint64{}, Bytes: map[string]uint64{}}
			if c.info != nil {
				m.ID = fmt.Sprintf("%016x", c.info.Id)
				m.Rank, m.NRanks = int(c.info.Rank), int(c.info.Nranks)
				m.Destroyed = c.info.Destroyed != 0
			}
			if n := c.counts; n != nil {
				for i := range counted {
					if n.Calls[i] > 0 {
						m.Calls[Ops[i].Name] += n.Calls[i]
						m.Bytes[Ops[i].Name] += n.Bytes[i]
					}
				}
				if n.LastNs > 0 && int(n.LastOp) < counted {
					m.LastTime = toWall(n.LastNs)
					m.LastOp = Ops[n.LastOp].Name
				}
				if n.StackId >= 0 {
					site := stacks.Site{Stack: t.stacks.Canonical(n.StackId), Py: n.PyStack}
					m.LastStack = t.stack(pid, site)
					keep[uint32(n.StackId)], keep[uint32(site.Stack)] = true, true
				}
			}
			cs = append(cs, m)
		}
		slices.SortFunc(cs, func(a, b model.NCCLComm) int {
			return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.Rank, b.Rank), a.LastTime.Compare(b.LastTime))
		})
		out[pid] = cs
	}
	// The stack service drops the stacks no view refers to: this view's
	// are the last call sites of its processes.
	if t.polls++; t.polls%bpfobj.StackGCEvery == 0 {
		t.view.Sweep(keep)
	}
	return out, nil
}

// stack symbolizes a call site of pid once; a process's last site changes
// rarely (a rank's collectives come from a few lines).
func (t *Tracker) stack(pid int, site stacks.Site) []model.Frame {
	if fr, ok := t.frames[pid][site]; ok {
		return fr
	}
	fr := t.stacks.Frames(pid, site)
	if fr == nil {
		return nil // gone, or not finished yet: looked at again next time
	}
	if t.frames[pid] == nil {
		t.frames[pid] = map[stacks.Site][]model.Frame{}
	}
	t.frames[pid][site] = fr
	return fr
}

// errorNames follows enum err_kind in bpf/common.h: the kinds this object
// can count.
var errorNames = map[ncclErrKind]string{
	ncclErrKindERR_TABLE_FULL:  "nccl_comms",
	ncclErrKindERR_STACK:       "nccl_stack",
	ncclErrKindERR_ENTRY_STATE: "nccl_entry_state",
	ncclErrKindERR_COUNTERS:    "nccl_counters",
	ncclErrKindERR_READ_USER:   "nccl_read_user",
}

// Lost returns the BPF error counters (monotonic since load), by source name.
func (t *Tracker) Lost() (map[string]uint64, error) {
	out, err := bpfobj.Counters(t.maps.Errors, errorNames)
	if err != nil {
		return nil, fmt.Errorf("reading error counters: %w", err)
	}
	return out, t.stacks.AddLost(out)
}

// Memory is the kernel memory of the object's maps and programs now.
func (t *Tracker) Memory() uint64 { return t.members.Memory() }

// Close detaches and unloads everything; safe to call more than once.
func (t *Tracker) Close() error {
	var errs []error
	for k, at := range t.hooks {
		errs = append(errs, bpfobj.CloseLinks(at.links))
		delete(t.hooks, k)
	}
	clear(t.procs)
	if t.view != nil {
		t.view.Leave()
		t.view = nil
	}
	errs = append(errs, t.maps.Close())
	if t.coll != nil {
		t.coll.Close()
		t.coll = nil
	}
	errs = append(errs, t.stacks.Release())
	return errors.Join(append(errs, t.member.Close())...)
}
