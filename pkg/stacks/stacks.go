// Package stacks is the one stack service of the BPF objects that capture
// call stacks (fd, cuda): the maps of bpf/unwind.h and bpf/pyframes.h are
// created here once and every object is loaded with them in place of its
// own copies (bpf/stacks.bpf.c), so that a stack id, a Python stack id and
// therefore a call site (Site) mean the same in every view. One
// unwind.Server answers the kernel's unwind requests of all objects, one
// pyframes.Tracker follows the interpreters of the processes any view
// tracks, and the stacks no view refers to any more are swept in rounds
// that every view takes part in.
//
// Each object keeps its own per-site counters (bpf/sites.h: fds opened and
// device bytes allocated do not mix), read through Sites.
package stacks

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/pyframes"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/unwind"
)

// shared are the maps every object that captures stacks is given: the
// stacks, their rules and requests (with the per-CPU request numbering, so
// that ids do not collide), and the Python maps. Scratch space stays each
// object's own: programs of two objects may run nested on one CPU.
var shared = []string{
	stacksMapUnwindRules, stacksMapUnwindMappings, stacksMapUnwoundStacks, stacksMapUnwindRequests, stacksMapUnwindPending, stacksMapUnwindSeq,
	stacksMapPyProcs, stacksMapPyStacks, stacksMapPyThreads, stacksMapPyThreadsTid, stacksMapPyErrors,
}

// DefaultMaxSitesPerProc is how many call sites a process may hold in an
// object's site table at once.
const DefaultMaxSitesPerProc = 1024

// MappingBlocksPerProcess sizes the trie of code mappings (bpf/unwind.h,
// unwind_mappings) for the processes tracked: a Python process takes about
// 50 blocks (10 to 16 executable mappings), a PyTorch one far more. What
// does not fit is counted ("stacks_unwind_mappings") and has rules of its
// process's own, as anonymous code does. Not preallocated: the kernel
// charges the blocks entered.
const MappingBlocksPerProcess = 64

// Config says how the service reads processes.
type Config struct {
	Proc       procinfo.FS // /proc, with the poll's cache where there is one
	Symbolizer *symbolize.Symbolizer
	// MaxSitesPerProc caps the site entries of one process in each
	// object (0: DefaultMaxSitesPerProc).
	MaxSitesPerProc uint32
	// Processes sizes the maps kept per process (py_procs, the trie of
	// code mappings) as the views' tracked processes are (0: as built).
	Processes uint32
}

// Service owns the shared maps and what serves them.
type Service struct {
	maps     map[string]*ebpf.Map
	um       unwind.Maps
	reader   *ringbuf.Reader
	unwinder *unwind.Server
	py       *pyframes.Tracker
	sym      *symbolize.Symbolizer
	maxSites uint32

	mu        sync.Mutex
	views     map[*View]bool
	tracked   map[int]int       // how many views track each pid
	refreshed map[int]time.Time // the poll each pid's interpreter was last looked at
	round     *round
}

// New creates the shared maps and starts serving unwind requests. Close
// must be called once every object using them is closed.
func New(cfg Config) (*Service, error) {
	spec, err := loadStacks()
	if err != nil {
		return nil, err
	}
	if err := bpfobj.Probe().Adapt(spec); err != nil {
		return nil, fmt.Errorf("creating the stack maps: %w", err)
	}
	if cfg.Processes > 0 {
		spec.Maps[stacksMapPyProcs].MaxEntries = cfg.Processes
		spec.Maps[stacksMapUnwindMappings].MaxEntries = max(spec.Maps[stacksMapUnwindMappings].MaxEntries, cfg.Processes*MappingBlocksPerProcess)
	}
	s := &Service{maps: map[string]*ebpf.Map{}, sym: cfg.Symbolizer, maxSites: cfg.MaxSitesPerProc,
		views: map[*View]bool{}, tracked: map[int]int{}, refreshed: map[int]time.Time{}}
	if s.maxSites == 0 {
		s.maxSites = DefaultMaxSitesPerProc
	}
	for _, name := range shared {
		m, err := ebpf.NewMap(spec.Maps[name])
		if err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("creating the stack map %s: %w", name, err)
		}
		s.maps[name] = m
	}
	s.um = unwind.Maps{Rules: s.maps[stacksMapUnwindRules], Mappings: s.maps[stacksMapUnwindMappings],
		Stacks: s.maps[stacksMapUnwoundStacks], Pending: s.maps[stacksMapUnwindPending]}
	if s.reader, err = ringbuf.NewReader(s.maps[stacksMapUnwindRequests]); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("opening the unwind request ring buffer: %w", err)
	}
	s.unwinder = unwind.Serve(s.reader, s.um, cfg.Symbolizer, cfg.Proc)
	s.py = pyframes.New(pyframes.Maps{Procs: s.maps[stacksMapPyProcs], Stacks: s.maps[stacksMapPyStacks], Errors: s.maps[stacksMapPyErrors]}, cfg.Proc)
	return s, nil
}

// Handle is a tracker's hold on a stack service: the pipeline's, shared,
// or one of its own, whose losses it alone counts and which it closes.
type Handle struct {
	*Service
	own bool
}

// Hold returns a hold on svc, or where it is nil on a service of the
// caller's own, symbolizing with sym or, if nil, a symbolizer of its own
// over procRoot: what a tracker loaded alone (tests, tools) does.
func Hold(svc *Service, proc procinfo.FS, sym *symbolize.Symbolizer, procRoot string) (Handle, error) {
	if svc != nil {
		return Handle{Service: svc}, nil
	}
	if sym == nil {
		sym = symbolize.New(procRoot)
	}
	svc, err := New(Config{Proc: proc, Symbolizer: sym})
	return Handle{Service: svc, own: err == nil}, err
}

// AddLost adds the service's losses to out where it is the holder's own:
// the owner of a shared one counts them once.
func (h *Handle) AddLost(out map[string]uint64) error {
	if !h.own {
		return nil
	}
	lost, err := h.Lost()
	if err != nil {
		return err
	}
	maps.Copy(out, lost)
	return nil
}

// Release closes the service if it is the holder's own; safe to call more
// than once.
func (h *Handle) Release() error {
	if !h.own {
		return nil
	}
	h.own = false
	return h.Close()
}

// Prepare fits an object's spec to the service before it is loaded: its
// sites cap, the return addresses' mask (unwind.RAMask), and the size of
// the shared maps it declares (py_procs and unwind_mappings are sized for
// the processes tracked). Load it with Replacements.
func (s *Service) Prepare(spec *ebpf.CollectionSpec) error {
	if v := spec.Variables["max_sites_per_proc"]; v != nil {
		if err := v.Set(s.maxSites); err != nil {
			return fmt.Errorf("setting max_sites_per_proc: %w", err)
		}
	}
	if v := spec.Variables["unwind_ra_mask"]; v != nil {
		if err := v.Set(unwind.RAMask()); err != nil {
			return fmt.Errorf("setting unwind_ra_mask: %w", err)
		}
	}
	for name, m := range s.maps {
		if ms := spec.Maps[name]; ms != nil {
			ms.MaxEntries = m.MaxEntries()
		}
	}
	return nil
}

// Replacements are the maps an object is loaded with in place of its own
// (ebpf.CollectionOptions.MapReplacements).
func (s *Service) Replacements() map[string]*ebpf.Map { return maps.Clone(s.maps) }

// Close stops serving and closes the service's handles of the maps.
func (s *Service) Close() error {
	var errs []error
	if s.reader != nil {
		errs = append(errs, s.reader.Close())
		s.unwinder.Wait()
		s.reader = nil
	}
	for name, m := range s.maps {
		errs = append(errs, m.Close())
		delete(s.maps, name)
	}
	return errors.Join(errs...)
}

// Memory is what the kernel charges for the shared maps now.
func (s *Service) Memory() uint64 {
	return bpfobj.Members{Maps: slices.Collect(maps.Values(s.maps))}.Memory()
}

// Lost returns what the service could not keep, by source: rules and
// stacks user space could not store, the Python frame walker's
// counters ("stacks_py_*"), and the files whose reading panicked
// ("stacks_symbolize_panics": their frames left unsymbolized). Files whose
// debugging information is over the bound for lines are not losses: an
// interpreter built with full debug information is one, on every node.
func (s *Service) Lost() (map[string]uint64, error) {
	out, err := s.py.Lost("stacks")
	if err != nil {
		return nil, err
	}
	s.unwinder.Lost("stacks", out)
	out["stacks_symbolize_panics"] = s.sym.Panics()
	return out, nil
}

// Refused returns what was not read for being over a bound, by parser:
// "symbolize" (ELF symbol tables, names, CFI programs and line tables of
// mapped files) and "python" (code objects' strings and line tables).
func (s *Service) Refused() map[string]uint64 {
	return map[string]uint64{"symbolize": s.sym.Refused(), "python": s.py.Refused()}
}

// Canonical returns the id under which a stack is first known
// (unwind.Server.Canonical).
func (s *Service) Canonical(id int32) int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unwinder.Canonical(id)
}

// Settled reports whether Canonical(id) will not change.
func (s *Service) Settled(id int32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unwinder.Settled(id)
}

// Stack returns the addresses of a stack id, innermost first.
func (s *Service) Stack(id int32) ([]uint64, error) { return s.um.Stack(id) }

// Frames symbolizes the call site of pid: its native frames, with the
// Python frames merged in. nil when the stack is gone.
func (s *Service) Frames(pid int, site Site) []model.Frame {
	if site.Stack < 0 {
		return nil
	}
	pcs, err := s.um.Stack(site.Stack)
	if err != nil {
		return nil
	}
	return pyframes.Merge(s.sym.Frames(pid, pcs), s.py.Frames(pid, site.Py))
}

// PyVersion is the CPython version found in pid ("" when none).
func (s *Service) PyVersion(pid int) string { return s.py.Version(pid) }

// Refresh looks again at pid's interpreter, once per poll whatever the
// number of views asking (pyframes.Tracker.Refresh).
func (s *Service) Refresh(pid int, poll time.Time) {
	s.mu.Lock()
	if s.refreshed[pid].Equal(poll) {
		s.mu.Unlock()
		return
	}
	s.refreshed[pid] = poll
	s.mu.Unlock()
	s.py.Refresh(pid, poll)
}

// View is one object's part in the service: the processes it tracks and
// the stacks it refers to.
type View struct {
	s    *Service
	name string
	pids map[int]bool
}

// Join adds a view; it takes part in every sweep until Leave.
func (s *Service) Join(name string) *View {
	v := &View{s: s, name: name, pids: map[int]bool{}}
	s.mu.Lock()
	s.views[v] = true
	s.mu.Unlock()
	return v
}

// Leave takes the view out of the sweeps and untracks its processes.
func (v *View) Leave() {
	for pid := range v.pids {
		v.Untrack(pid)
	}
	v.s.mu.Lock()
	delete(v.s.views, v)
	v.s.mu.Unlock()
}

// Track follows pid's interpreter while any view tracks it, and enters
// its code mappings for the kernel's unwinder (unwind.Server.Learn).
func (v *View) Track(pid int) {
	v.s.mu.Lock()
	first := !v.pids[pid] && v.s.tracked[pid] == 0
	if !v.pids[pid] {
		v.pids[pid] = true
		v.s.tracked[pid]++
	}
	v.s.mu.Unlock()
	if first {
		v.s.py.Track(pid)
		v.s.unwinder.Learn(pid)
	}
}

// Untrack stops following pid for this view; the last view drops its
// interpreter, and its code mappings (with the unwind rules of code no
// process left maps) go at the next sweep.
func (v *View) Untrack(pid int) {
	v.s.mu.Lock()
	last := false
	if v.pids[pid] {
		delete(v.pids, pid)
		if v.s.tracked[pid]--; v.s.tracked[pid] == 0 {
			delete(v.s.tracked, pid)
			delete(v.s.refreshed, pid)
			last = true
		}
	}
	v.s.mu.Unlock()
	if last {
		v.s.py.Untrack(pid)
	}
}

// A round of the sweep: the stack ids in the map when it began, and the
// ids the views refer to, each view's as read after the round began. Once
// every view has had its say the ids of the round that none refers to are
// deleted: a stack made after the round began is not in it, so a view
// that has not read it yet cannot lose it.
type round struct {
	ids      []uint32
	keep     map[uint32]bool
	reported map[*View]bool
}

// Sweep gives the stack ids the view refers to, read at this poll (its
// tables' entries, their canonical ids, stacks kept for later), every
// bpfobj.StackGCEvery polls. The round this completes deletes what no view
// refers to, with the code mappings of processes no view tracks and the
// unwind rules of code no process left maps.
func (v *View) Sweep(keep map[uint32]bool) {
	s := v.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.round; r != nil && !r.reported[v] {
		r.reported[v] = true
		for id := range keep {
			r.keep[id] = true
		}
	}
	if r := s.round; r != nil {
		for w := range s.views {
			if !r.reported[w] {
				return
			}
		}
		s.drop(r)
	}
	s.round = s.begin()
}

// begin lists the stacks there are now.
func (s *Service) begin() *round {
	r := &round{keep: map[uint32]bool{}, reported: map[*View]bool{}}
	var id uint32
	m := s.maps[stacksMapUnwoundStacks]
	err := m.NextKey(nil, &id)
	for err == nil {
		r.ids = append(r.ids, id)
		err = m.NextKey(id, &id)
	}
	if !errors.Is(err, ebpf.ErrKeyNotExist) {
		slog.Warn("listing stacks", "err", err)
		r.ids = nil
	}
	return r
}

// drop deletes the stacks of r no view kept. Called with s.mu held.
func (s *Service) drop(r *round) {
	deleted := map[uint32]bool{}
	m := s.maps[stacksMapUnwoundStacks]
	for _, id := range r.ids {
		if !r.keep[id] && m.Delete(id) == nil {
			deleted[id] = true
		}
	}
	s.unwinder.Forget(func(id uint32) bool { return !deleted[id] }, func(id uint32) bool { return r.keep[id] })
	err := s.unwinder.Drop(func(tgid uint32) bool { return s.tracked[int(tgid)] > 0 })
	if err != nil {
		slog.Warn("listing unwind rules", "err", err)
	}
}
