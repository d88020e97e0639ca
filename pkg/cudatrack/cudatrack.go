// Package cudatrack hooks the CUDA allocation functions of tracked processes
// with uprobes (bpf/cuda.bpf.c) and reads what the kernel side keeps: the
// live allocations, per-API totals and failed allocations, with their stacks.
// Libraries are found in /proc/PID/maps and hooked when they appear, so a
// runtime loaded late with dlopen (as PyTorch does) is picked up at the next
// poll.
package cudatrack

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracked"
)

// Config sizes the kernel side.
type Config struct {
	MaxAllocs uint32 // live allocation table capacity, all processes together
	ProcRoot  string // normally /proc
	TopSites  int    // allocation stacks symbolized per process (0: 64)
	// Cache, when set, shares reads of /proc/PID/maps with the other
	// concerns within a poll.
	Cache *procinfo.PollCache
	// Symbolizer reads the call-frame information that stacks are unwound
	// with; nil: one of the tracker's own.
	Symbolizer *symbolize.Symbolizer
	// Stacks is the stack service shared with the other objects; nil: one
	// of the tracker's own (with Symbolizer), closed with it.
	Stacks *stacks.Service
	// Tracked is the map of tracked processes shared with the other
	// objects; nil: one of the tracker's own, closed with it.
	Tracked *tracked.Set
	// Launches hooks the kernel launches (cudaLaunchKernel,
	// cuLaunchKernel, cudaGraphLaunch) too: off by default, as PyTorch
	// eager issues tens of thousands a second and each pays for its hooks.
	Launches bool
	// Classic attaches uprobe and uretprobe pairs even where the kernel
	// has session uprobes: tests and benchmarks take both paths on one
	// kernel.
	Classic bool
	// DeviceFull says whether a device pid ran on was at least
	// model.SnapshotFullShare used at the instant at, per NVML: a failed
	// allocation whose error is not out of memory is then snapshotted
	// all the same. Nil: only out-of-memory failures are.
	DeviceFull func(pid int, at time.Time) bool
	// SnapshotEvery is the least time between two memory snapshots of a
	// process after its first (0: model.SnapshotEvery); tests shorten it.
	SnapshotEvery time.Duration
}

// Tracker owns the loaded CUDA BPF object and the uprobe links of the
// libraries that tracked processes map.
type Tracker struct {
	procRoot string
	proc     procinfo.FS
	coll     *ebpf.Collection
	maps     cudaMaps
	// Entry programs: by API where the kernel has no cookies, else by
	// shape (the cookie says the API); return programs by layer. With
	// session uprobes, sessions holds the session program of each shape
	// that has one, which serves its returns too; byShape the classic
	// entry programs of the others.
	byAPI    []*ebpf.Program
	byShape  [shapeLaunch + 1]*ebpf.Program
	sessions map[int]*ebpf.Program
	ret      map[string]*ebpf.Program // by API.retKey
	// launches: the launch functions are hooked (Config.Launches).
	launches bool
	reader   *ringbuf.Reader

	// peakWindow is the window of the kernel's high-water marks that
	// allocations raise now (struct cuda_peak).
	peakWindow uint64

	// multi: hooks are attached as uprobe_multi links (Linux 6.6+), a few per
	// library, instead of one perf event per function and direction.
	// Removing a uprobe waits for an RCU grace period (about 100 ms), and a
	// multi link waits once for all of its functions: detaching 48 perf
	// events takes seconds.
	multi bool
	// session: hooks are session uprobes (Linux 6.13+), one link per
	// argument shape and library, whose entries decline the returns no one
	// needs (see bpf/cuda.bpf.c); a shape without a session program keeps
	// its uprobe_multi pair.
	session bool

	procs map[int]*procState
	// hooks: the links of each library file a tracked process maps,
	// attached for every process and filtered in the kernel by
	// tracked_pids. Attaching and detaching take milliseconds (detaching
	// waits for an RCU grace period): processes that come and go, such as
	// DataLoader workers, would pay both each time with per-process links.
	hooks map[inodeKey]*attached
	live  *bpfobj.Table[cudaCudaAllocKey, cudaCudaAlloc] // each allocation a process's
	// freed: the allocations live at a failure and freed since, kept by
	// the kernel while the process's snapshot is open (snapshot.go).
	freed *bpfobj.Table[cudaCudaAllocKey, cudaCudaFreed]
	// Host waits on the GPU by (process, API, site) and by thread.
	waitSites   *bpfobj.Table[cudaWaitKey, cudaWaitCounts]
	waitThreads *bpfobj.Table[cudaWaitThreadKey, cudaWaitThread]
	sites       *stacks.Sites // what went through each call site
	// Parsed libraries, shared by every process mapping the same file; a nil
	// value records an executable without CUDA.
	files map[fileKey]*Library

	members bpfobj.Members // every map and program, for Memory

	polls      int             // for the stack map's garbage collection
	failStacks map[uint32]bool // stacks of failures drained, not yet symbolized

	stacks stacks.Handle // closed by Close where it is the tracker's own
	view   *stacks.View
	member *tracked.View
}

// procState is what one tracked process has attached.
type procState struct {
	libs map[fileKey]*hooked
	// counted: its kernel entries (counters, live bytes, peaks, the
	// tracked_pids filter) exist. They are made when it first maps a
	// hooked library: in --all most processes never do, and each entry
	// costs a syscall to make and one to delete.
	counted bool
	tracked time.Time // when Track looked at its libraries
}

// hooked is one library of one process; a file without hooks is kept
// (without links) so that it is not inspected again.
type hooked struct {
	lib *Library
	at  *attached
}

// inodeKey names a file as the kernel places uprobes: by inode. The same
// library seen at other paths (another mount namespace, a link) shares its
// hooks; two links on one inode would count each call twice.
type inodeKey struct{ dev, inode uint64 }

// attached is one library file's links and how many tracked processes map
// it; the last one gone detaches them.
type attached struct {
	links []link.Link
	refs  int
}

// NewTracker loads the CUDA object. Nothing is attached until Track.
func NewTracker(cfg Config) (*Tracker, error) {
	spec, err := loadSpec()
	if err != nil {
		return nil, err
	}
	if cfg.MaxAllocs > 0 {
		spec.Maps[cudaMapLiveAllocs].MaxEntries = cfg.MaxAllocs
	}
	if !bpfobj.Probe().RuntimeAlloc {
		// Preallocated before 6.1 (bpfobj.Kernel): the table, empty but
		// after a failure, is cut to a quarter there (2 MB instead of 8),
		// a burst freed after the failure that does not fit being
		// counted in the snapshot's MissedFrees.
		spec.Maps[cudaMapFreedAllocs].MaxEntries /= 4
	}
	cookies := bpfobj.Probe().Cookies
	multi := cookies && haveUprobeMulti()
	session := multi && !cfg.Classic && bpfobj.Probe().UprobeSession
	// Only the programs of the attach path taken are loaded: with session
	// uprobes a shape's session program (cuda_<shape>_session) replaces
	// its classic entry program (cuda_<shape>_enter), and the return
	// programs go with the last classic entry; without them, the session
	// programs go.
	classicLeft := false
	for name := range spec.Programs {
		perAPI, perShape, perSession := strings.HasPrefix(name, "enter_"), strings.HasSuffix(name, "_enter"), strings.HasSuffix(name, "_session")
		twin := spec.Programs[strings.TrimSuffix(name, "_enter")+"_session"] != nil
		if (cookies && perAPI) || (!cookies && perShape) || (session && perShape && twin) || (!session && perSession) {
			delete(spec.Programs, name)
		} else if perAPI || perShape {
			classicLeft = true
		}
	}
	for name, p := range spec.Programs {
		if p.SectionName == "uretprobe" && !classicLeft {
			delete(spec.Programs, name)
		} else if multi && !strings.HasSuffix(name, "_session") {
			p.AttachType = ebpf.AttachTraceUprobeMulti
		}
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	proc, err := procinfo.New(cfg.ProcRoot)
	if err != nil {
		return nil, err
	}
	t := &Tracker{procRoot: cfg.ProcRoot, proc: proc.WithPollCache(cfg.Cache), multi: multi, session: session, launches: cfg.Launches, procs: map[int]*procState{}, hooks: map[inodeKey]*attached{}, files: map[fileKey]*Library{}, failStacks: map[uint32]bool{}}
	if t.member, err = tracked.Join(cfg.Tracked); err != nil {
		return nil, err
	}
	if t.stacks, err = stacks.Hold(cfg.Stacks, t.proc, cfg.Symbolizer, cfg.ProcRoot); err != nil {
		_ = t.member.Close()
		return nil, err
	}
	replace := t.member.With(t.stacks.Replacements())
	if err = t.member.Prepare(spec, cudaMapCudaCounters, cudaMapLiveBytes, cudaMapPeakBytes, cudaMapOomSnaps); err == nil {
		err = t.stacks.Prepare(spec)
	}
	if err == nil {
		t.coll, err = bpfobj.LoadCollection(spec, "cuda BPF programs", replace)
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
	coll := t.coll
	t.live = bpfobj.NewTable(t.maps.LiveAllocs, func(k cudaCudaAllocKey, _ cudaCudaAlloc) uint32 { return k.Tgid })
	t.freed = bpfobj.NewTable(t.maps.FreedAllocs, func(k cudaCudaAllocKey, _ cudaCudaFreed) uint32 { return k.Tgid })
	t.sites = t.stacks.Sites(t.maps.Sites, t.maps.SiteOwners)
	t.waitSites = bpfobj.NewTable(t.maps.WaitSites, func(k cudaWaitKey, _ cudaWaitCounts) uint32 { return k.Tgid })
	t.waitThreads = bpfobj.NewTable(t.maps.WaitThreads, func(k cudaWaitThreadKey, _ cudaWaitThread) uint32 { return k.Tgid })
	t.view = t.stacks.Join("cuda")
	if cookies {
		t.sessions = map[int]*ebpf.Program{}
		for shape, name := range shapePrograms {
			t.byShape[shape] = coll.Programs["cuda_"+name+"_enter"]
			if p := coll.Programs["cuda_"+name+"_session"]; p != nil {
				t.sessions[shape] = p
			}
		}
	} else {
		for _, a := range APIs {
			p := coll.Programs["enter_"+a.Name]
			if p == nil {
				t.Close()
				return nil, fmt.Errorf("the cuda object has no entry program for %s", a.Name)
			}
			t.byAPI = append(t.byAPI, p)
		}
	}
	t.ret = map[string]*ebpf.Program{LayerRuntime: coll.Programs["cuda_return_runtime"], LayerDriver: coll.Programs["cuda_return_driver"]}
	for _, layer := range []string{LayerRuntime, LayerDriver} {
		t.ret[API{Layer: layer, Shape: shapeSync}.retKey()] = coll.Programs["cuda_timed_return_"+layer]
	}
	t.reader, err = ringbuf.NewReader(t.maps.Failures)
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("opening the cuda failure ring buffer: %w", err)
	}
	return t, nil
}

// Track starts watching pid and hooks the CUDA libraries it has mapped.
func (t *Tracker) Track(pid int) error {
	if err := t.live.Claim(uint32(pid), t.tracked); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if err := t.freed.Claim(uint32(pid), t.tracked); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if err := t.sites.Claim(uint32(pid), t.tracked); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if err := t.waitSites.Claim(uint32(pid), t.tracked); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if err := t.waitThreads.Claim(uint32(pid), t.tracked); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if t.procs[pid] == nil {
		t.procs[pid] = &procState{libs: map[fileKey]*hooked{}}
	}
	t.procs[pid].tracked = time.Now()
	t.view.Track(pid) // Python frames from its first allocation on
	_, err := t.Refresh(pid)
	return err
}

// count makes pid's kernel entries: counters first (the BPF side only
// updates existing entries), then the filter.
func (t *Tracker) count(pid int) error {
	tgid := uint32(pid)
	zero := make([]cudaCudaCounts, ebpf.MustPossibleCPU())
	if err := t.maps.CudaCounters.Update(tgid, zero, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if err := t.maps.LiveBytes.Update(tgid, int64(0), ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if err := t.maps.OomSnaps.Update(tgid, cudaCudaSnap{}, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	peaks := make([]cudaCudaPeak, ebpf.MustPossibleCPU())
	if err := t.maps.PeakBytes.Update(tgid, peaks, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if t.launches {
		launches := make([]cudaLaunchCounts, ebpf.MustPossibleCPU())
		if err := t.maps.Launches.Update(tgid, launches, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			return fmt.Errorf("tracking pid %d: %w", pid, err)
		}
	}
	if err := t.member.Track(tgid, 0, 0); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	return nil
}

// Refresh attaches to the CUDA libraries pid has mapped since the last call
// and detaches from those it has unmapped. Each file is parsed once. It
// reports whether a library was newly hooked.
func (t *Tracker) Refresh(pid int) (bool, error) {
	ps := t.procs[pid]
	if ps == nil {
		return false, fmt.Errorf("pid %d is not tracked", pid)
	}
	files, err := candidates(t.proc, pid)
	if err != nil {
		return false, fmt.Errorf("reading the mappings of pid %d: %w", pid, err)
	}
	// Runtimes before drivers: while only the driver is hooked, a runtime
	// call's inner driver calls would count on their own.
	slices.SortStableFunc(files, func(a, b mappedFile) int {
		return cmp.Compare(btoi(a.kind == kindDriver), btoi(b.kind == kindDriver))
	})
	added := false
	present := make(map[fileKey]bool, len(files))
	for _, mf := range files {
		present[mf.key] = true
		if _, ok := ps.libs[mf.key]; ok {
			continue
		}
		lib, err := t.library(pid, mf)
		if err != nil {
			// The process may have unmapped it already; retried next time.
			slog.Debug("inspecting CUDA library", "pid", pid, "path", mf.path, "err", err)
			continue
		}
		// Counters before hooks: the BPF side only updates existing
		// entries. A file without hooked functions counts nothing.
		if lib != nil && len(lib.Hooks) > 0 && !ps.counted {
			if err := t.count(pid); err != nil {
				t.uncount(uint32(pid))
				return added, err
			}
			ps.counted = true
		}
		ps.libs[mf.key] = &hooked{lib: lib, at: t.hold(pid, mf.key, lib)}
		added = true
	}
	for k, h := range ps.libs {
		if !present[k] {
			t.release(k, h)
			delete(ps.libs, k)
		}
	}
	return added, nil
}

// hold returns the links of the file behind key, attaching them for the
// first process that maps it; nil for a file without hooks or that could
// not be hooked.
func (t *Tracker) hold(pid int, key fileKey, lib *Library) *attached {
	if lib == nil {
		return nil
	}
	ik := inodeKey{key.dev, key.inode}
	at := t.hooks[ik]
	if at == nil {
		at = &attached{links: t.attach(pid, lib)}
		if len(at.links) == 0 && len(lib.Hooks) > 0 {
			// Failed (the process may have exited meanwhile): the next
			// process mapping the file tries again.
			return nil
		}
		t.hooks[ik] = at
	}
	at.refs++
	return at
}

// release drops one process's hold on a file; the last one detaches it.
func (t *Tracker) release(key fileKey, h *hooked) {
	if h.at == nil {
		return
	}
	if h.at.refs--; h.at.refs > 0 {
		return
	}
	_ = bpfobj.CloseLinks(h.at.links)
	delete(t.hooks, inodeKey{key.dev, key.inode})
}

// library returns the parsed hooks of a mapped file, from the cache when
// another process (or an earlier poll) has read it.
func (t *Tracker) library(pid int, mf mappedFile) (*Library, error) {
	if lib, ok := t.files[mf.key]; ok {
		return lib, nil
	}
	lib, err := Inspect(t.rootPath(pid, mf.path), mf.path, mf.kind)
	if err != nil {
		return nil, err
	}
	t.files[mf.key] = lib
	return lib, nil
}

// attach puts a uprobe and a uretprobe on each hooked function of lib (as
// pid sees it), for every process: the programs return at once for a
// process not in tracked_pids. A function that cannot be hooked is logged
// and skipped.
func (t *Tracker) attach(pid int, lib *Library) []link.Link {
	if lib == nil || len(lib.Hooks) == 0 {
		if lib != nil {
			slog.Warn("CUDA library defines none of the hooked functions", "pid", pid, "path", lib.Path)
		}
		return nil
	}
	if len(lib.Missing) > 0 {
		slog.Info("CUDA library lacks some hooked functions (older version?)", "pid", pid, "path", lib.Path, "missing", lib.Missing)
	}
	ex, err := link.OpenExecutable(t.rootPath(pid, lib.Path))
	if err != nil {
		slog.Warn("hooking CUDA library", "pid", pid, "path", lib.Path, "err", err)
		return nil
	}
	if t.session {
		return t.attachSession(ex, pid, lib)
	}
	if t.multi {
		return t.attachMulti(ex, pid, lib)
	}
	var links []link.Link
	for _, hk := range t.hooked(lib) {
		a := APIs[hk.API]
		opts := &link.UprobeOptions{Address: hk.Offset}
		prog := t.byShape[a.Shape]
		if t.byAPI != nil {
			prog = t.byAPI[hk.API]
		} else {
			opts.Cookie = uint64(hk.API)
		}
		// The return first, as in attachMulti; without it the entry would
		// leave state behind.
		out, err := ex.Uretprobe(a.Name, t.ret[a.retKey()], &link.UprobeOptions{Address: hk.Offset})
		if err != nil {
			slog.Warn("hooking CUDA function return", "pid", pid, "path", lib.Path, "func", a.Name, "err", err)
			continue
		}
		in, err := ex.Uprobe(a.Name, prog, opts)
		if err != nil {
			slog.Warn("hooking CUDA function", "pid", pid, "path", lib.Path, "func", a.Name, "err", err)
			_ = out.Close()
			continue
		}
		links = append(links, in, out)
	}
	slog.Debug("hooked CUDA library", "pid", pid, "path", lib.Path, "kind", lib.Kind, "functions", len(links)/2)
	return links
}

// hooked is what of lib's hooks are attached: the launches only when asked
// for.
func (t *Tracker) hooked(lib *Library) []Hook {
	if t.launches {
		return lib.Hooks
	}
	return slices.DeleteFunc(slices.Clone(lib.Hooks), func(h Hook) bool { return APIs[h.API].Shape == shapeLaunch })
}

// attachMulti hooks lib with one uprobe_multi link per entry program (one
// per argument shape) and one per layer for the returns.
func (t *Tracker) attachMulti(ex *link.Executable, pid int, lib *Library) []link.Link {
	byShape := map[int]*link.UprobeMultiOptions{}
	byLayer := map[string]*link.UprobeMultiOptions{} // by API.retKey
	for _, hk := range t.hooked(lib) {
		a := APIs[hk.API]
		o := byShape[a.Shape]
		if o == nil {
			o = &link.UprobeMultiOptions{}
			byShape[a.Shape] = o
		}
		o.Addresses = append(o.Addresses, hk.Offset)
		o.Cookies = append(o.Cookies, uint64(hk.API))
		r := byLayer[a.retKey()]
		if r == nil {
			r = &link.UprobeMultiOptions{}
			byLayer[a.retKey()] = r
		}
		r.Addresses = append(r.Addresses, hk.Offset)
	}
	// Returns first: an entry hooked while its return is not yet leaves
	// state in flight that makes the thread's later calls look nested
	// (and a runtime call's driver calls count on their own). A return
	// without its entry is ignored.
	var links []link.Link
	for layer, r := range byLayer {
		l, err := ex.UretprobeMulti(nil, t.ret[layer], r)
		if err != nil {
			slog.Warn("hooking CUDA library returns", "pid", pid, "path", lib.Path, "err", err)
			_ = bpfobj.CloseLinks(links)
			return nil
		}
		links = append(links, l)
	}
	for shape, o := range byShape {
		l, err := ex.UprobeMulti(nil, t.byShape[shape], o)
		if err != nil {
			slog.Warn("hooking CUDA library", "pid", pid, "path", lib.Path, "err", err)
			_ = bpfobj.CloseLinks(links)
			return nil
		}
		links = append(links, l)
	}
	slog.Debug("hooked CUDA library", "pid", pid, "path", lib.Path, "kind", lib.Kind, "functions", len(lib.Hooks))
	return links
}

// attachSession hooks lib with one session link per argument shape: its
// program runs at each function's entry and, where the entry asks for it,
// at its return. The functions of a shape without a session program get
// uprobe_multi pairs.
func (t *Tracker) attachSession(ex *link.Executable, pid int, lib *Library) []link.Link {
	type offsets struct{ at, cookies []uint64 }
	byShape := map[int]*offsets{}
	classic := *lib
	classic.Hooks = nil
	hooks := t.hooked(lib)
	for _, hk := range hooks {
		shape := APIs[hk.API].Shape
		if t.sessions[shape] == nil {
			classic.Hooks = append(classic.Hooks, hk)
			continue
		}
		o := byShape[shape]
		if o == nil {
			o = &offsets{}
			byShape[shape] = o
		}
		o.at = append(o.at, hk.Offset)
		o.cookies = append(o.cookies, uint64(hk.API))
	}
	var links []link.Link
	if len(classic.Hooks) > 0 {
		if links = t.attachMulti(ex, pid, &classic); links == nil {
			return nil
		}
	}
	for shape, o := range byShape {
		l, err := bpfobj.UprobeSession(t.rootPath(pid, lib.Path), t.sessions[shape], o.at, o.cookies, 0)
		if err != nil {
			slog.Warn("hooking CUDA library", "pid", pid, "path", lib.Path, "err", err)
			_ = bpfobj.CloseLinks(links)
			return nil
		}
		links = append(links, l)
	}
	slog.Debug("hooked CUDA library", "pid", pid, "path", lib.Path, "kind", lib.Kind, "functions", len(hooks), "session", len(hooks)-len(classic.Hooks))
	return links
}

// AttachPath says how the hooks are attached: "session uprobes",
// "uprobe_multi pairs" or "perf-event pairs", or session uprobes for some
// shapes and uprobe_multi pairs for the others.
func (t *Tracker) AttachPath() string {
	switch {
	case t.session && slices.ContainsFunc(t.byShape[:], func(p *ebpf.Program) bool { return p != nil }):
		return "session uprobes, uprobe_multi pairs for shapes without a session program"
	case t.session:
		return "session uprobes"
	case t.multi:
		return "uprobe_multi pairs"
	}
	return "perf-event pairs"
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// shapePrograms names each argument shape's programs in bpf/cuda.bpf.c:
// cuda_<name>_enter (classic) and cuda_<name>_session.
var shapePrograms = [...]string{shapeAlloc: "alloc", shapePitch: "pitch", shapeFree: "free", shapeCount: "count", shapeSync: "sync", shapeLaunch: "launch"}

// loadSpec reads the cuda object; a variable so that tests can load it
// without a session program.
var loadSpec = loadCuda

// haveUprobeMulti tells whether this kernel has uprobe_multi links; a
// variable so that tests can take the per-function path too.
var haveUprobeMulti = func() bool { return features.HaveBPFLinkUprobeMulti() == nil }

// Libraries returns the hooked libraries of pid.
func (t *Tracker) Libraries(pid int) []*Library {
	ps := t.procs[pid]
	if ps == nil {
		return nil
	}
	var out []*Library
	for _, h := range ps.libs {
		if h.at != nil && len(h.at.links) > 0 {
			out = append(out, h.lib)
		}
	}
	slices.SortFunc(out, func(a, b *Library) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// tracked reports whether tgid is tracked: a read of the live table drops
// the allocations of the others.
func (t *Tracker) tracked(tgid uint32) bool { return t.procs[int(tgid)] != nil }

// Untrack stops tracking pid: the links of libraries no other tracked
// process maps are closed and its kernel state dropped, the allocations
// made since the last poll at the next (see bpfobj.Table). Per-thread entry
// state is task storage: it goes with the threads.
func (t *Tracker) Untrack(pid int) {
	tgid := uint32(pid)
	ps := t.procs[pid]
	if ps == nil {
		return
	}
	for k, h := range ps.libs {
		t.release(k, h)
	}
	delete(t.procs, pid)
	if ps.counted {
		t.uncount(tgid)
	}
	t.live.Forget(tgid)
	t.freed.Forget(tgid)
	t.sites.Forget(tgid)
	t.waitSites.Forget(tgid)
	t.waitThreads.Forget(tgid)
	t.view.Untrack(pid)
}

// uncount deletes what count made, the filter first.
func (t *Tracker) uncount(tgid uint32) {
	t.member.Untrack(tgid, 0)
	_ = t.maps.CudaCounters.Delete(tgid)
	_ = t.maps.LiveBytes.Delete(tgid)
	_ = t.maps.PeakBytes.Delete(tgid)
	_ = t.maps.OomSnaps.Delete(tgid)
	_ = t.maps.Launches.Delete(tgid)
}

// Alloc is one live allocation.
type Alloc struct {
	Addr    uint64
	Size    uint64
	API     int
	StackID int32 // negative: unknown
	Time    time.Time
	PyStack uint32 // Python frames (pkg/pyframes); 0: none
}

// Sample is what the kernel holds about one process at one poll.
type Sample struct {
	Allocs     []Alloc
	AllocBytes [len(cudaCudaCounts{}.AllocBytes)]uint64 // by API, since tracking began
	FreeBytes  [len(cudaCudaCounts{}.FreeBytes)]uint64
	Calls      [len(cudaCudaCounts{}.Calls)]uint64
	// PeakBytes is the most device bytes live at once since the previous
	// Poll, as the kernel saw at each allocation; 0 when nothing was
	// allocated since.
	PeakBytes uint64
	// Sites is what went through each call site since tracking began:
	// allocations made and freed, a free counted for the site of the
	// block it frees.
	Sites map[stacks.Site]stacks.Counts
	// Waits are the host's waits on the GPU since tracking began, by API
	// and canonical call site.
	Waits map[WaitSite]WaitCounts
	// Threads are the waits of each thread (by thread id) since tracking
	// began.
	Threads map[int]ThreadCounts
	// Launches are the kernel launches since tracking began; nil when
	// they are not hooked.
	Launches *LaunchCounts
}

// WaitSite is where a process waited: an API (an index in APIs) at a call
// site.
type WaitSite struct {
	API  int
	Site stacks.Site
}

// WaitCounts is the waits of one WaitSite; Slots as the kernel's (slot i:
// durations of [2^i, 2^(i+1)) units of 2^-30 s, the last one longer).
type WaitCounts struct {
	Calls, TotalNs, MaxNs uint64
	Slots                 [waitSlots]uint64
}

// ThreadCounts is one thread's waits.
type ThreadCounts struct {
	Calls, TotalNs uint64
}

// LaunchCounts is one process's launches, by API (an index in APIs), with
// their latency.
type LaunchCounts struct {
	Calls   map[int]uint64
	TotalNs uint64
	Slots   [waitSlots]uint64
}

const waitSlots = len(cudaWaitCounts{}.Slots)

// Poll reads the counters of each pid and the live table once.
func (t *Tracker) Poll(pids []int) (map[int]*Sample, error) {
	// A new window first: the one just closed is read below, while
	// allocations raise the next.
	closed := t.peakWindow
	t.peakWindow++
	if err := t.maps.PeakWindow.Update(uint32(0), t.peakWindow, ebpf.UpdateAny); err != nil {
		return nil, fmt.Errorf("starting a peak window: %w", err)
	}
	out := make(map[int]*Sample, len(pids))
	for _, pid := range pids {
		if ps := t.procs[pid]; ps == nil || !ps.counted {
			out[pid] = &Sample{} // no CUDA library mapped yet
			continue
		}
		var per []cudaCudaCounts
		if err := t.maps.CudaCounters.Lookup(uint32(pid), &per); err != nil {
			return nil, fmt.Errorf("reading cuda counters of pid %d: %w", pid, err)
		}
		s := &Sample{}
		for _, c := range per {
			for i := range s.Calls {
				s.AllocBytes[i] += c.AllocBytes[i]
				s.FreeBytes[i] += c.FreeBytes[i]
				s.Calls[i] += c.Calls[i]
			}
		}
		var peaks []cudaCudaPeak
		if err := t.maps.PeakBytes.Lookup(uint32(pid), &peaks); err != nil {
			return nil, fmt.Errorf("reading the peak live bytes of pid %d: %w", pid, err)
		}
		for _, p := range peaks {
			if p.Window == closed {
				s.PeakBytes = max(s.PeakBytes, p.Bytes)
			}
		}
		out[pid] = s
	}
	toWall := bpfobj.WallClock()
	live, err := t.live.Read(t.tracked)
	if err != nil {
		return nil, fmt.Errorf("reading the live allocation table: %w", err)
	}
	sites, err := t.sites.Read(t.tracked)
	if err != nil {
		return nil, fmt.Errorf("reading the call site table: %w", err)
	}
	for pid, s := range out {
		for _, e := range live[uint32(pid)] {
			key, val := e.Key, e.Val
			s.Allocs = append(s.Allocs, Alloc{Addr: key.Addr, Size: val.Size, API: int(val.Api), StackID: t.stacks.Canonical(val.StackId), Time: toWall(val.TimeNs), PyStack: val.PyStack})
		}
		s.Sites = sites[uint32(pid)]
	}
	if err := t.readWaits(out); err != nil {
		return nil, err
	}
	if t.polls++; t.polls%bpfobj.StackGCEvery == 0 {
		// Blocks kept for a snapshot not yet taken (snapshot.go) may be
		// the last of their stacks: it is taken after this poll.
		freed, err := t.freed.Read(t.tracked)
		if err != nil {
			return nil, fmt.Errorf("reading the allocations freed after a failure: %w", err)
		}
		t.keepStacks(live, freed)
	}
	return out, nil
}

// keepStacks gives the stack service the stacks this view refers to: of
// live allocations and those kept for snapshots, call sites and wait sites
// (of any process), and of failures drained since the last time,
// symbolized after Poll.
func (t *Tracker) keepStacks(live map[uint32][]bpfobj.Entry[cudaCudaAllocKey, cudaCudaAlloc], freed map[uint32][]bpfobj.Entry[cudaCudaAllocKey, cudaCudaFreed]) {
	keep := t.failStacks
	for _, g := range live {
		for _, e := range g {
			keep[uint32(e.Val.StackId)] = true
			keep[uint32(t.stacks.Canonical(e.Val.StackId))] = true
		}
	}
	for _, g := range freed {
		for _, e := range g {
			keep[uint32(e.Val.Alloc.StackId)] = true
			keep[uint32(t.stacks.Canonical(e.Val.Alloc.StackId))] = true
		}
	}
	for pid := range t.procs {
		for _, e := range t.waitSites.Group(uint32(pid)) {
			keep[uint32(e.Key.StackId)] = true
			keep[uint32(t.stacks.Canonical(e.Key.StackId))] = true
		}
	}
	t.sites.Keep(keep, t.tracked)
	t.view.Sweep(keep)
	t.failStacks = map[uint32]bool{}
}

// readWaits adds the waits and launches of each process in out (those
// with CUDA libraries hooked).
func (t *Tracker) readWaits(out map[int]*Sample) error {
	sites, err := t.waitSites.Read(t.tracked)
	if err != nil {
		return fmt.Errorf("reading the wait site table: %w", err)
	}
	threads, err := t.waitThreads.Read(t.tracked)
	if err != nil {
		return fmt.Errorf("reading the wait thread table: %w", err)
	}
	for pid, s := range out {
		if g := sites[uint32(pid)]; len(g) > 0 {
			s.Waits = make(map[WaitSite]WaitCounts, len(g))
			for _, e := range g {
				// A stack first finished in user space has an id of its own
				// until known: one site may sit under two.
				k := WaitSite{API: int(e.Key.Api), Site: stacks.Site{Stack: t.stacks.Canonical(e.Key.StackId), Py: e.Key.PyStack}}
				w := s.Waits[k]
				w.Calls += e.Val.Calls
				w.TotalNs += e.Val.TotalNs
				w.MaxNs = max(w.MaxNs, e.Val.MaxNs)
				for i, n := range e.Val.Slots {
					w.Slots[i] += n
				}
				s.Waits[k] = w
			}
		}
		if g := threads[uint32(pid)]; len(g) > 0 {
			s.Threads = make(map[int]ThreadCounts, len(g))
			for _, e := range g {
				s.Threads[int(e.Key.Tid)] = ThreadCounts{Calls: e.Val.Calls, TotalNs: e.Val.TotalNs}
			}
		}
		if !t.launches {
			continue
		}
		if ps := t.procs[pid]; ps == nil || !ps.counted {
			continue
		}
		var per []cudaLaunchCounts
		if err := t.maps.Launches.Lookup(uint32(pid), &per); err != nil {
			return fmt.Errorf("reading the launches of pid %d: %w", pid, err)
		}
		l := &LaunchCounts{Calls: map[int]uint64{}}
		for _, c := range per {
			for i, n := range c.Calls {
				if n > 0 {
					l.Calls[int(cudaCudaApiAPI_CUDA_LAUNCH_KERNEL)+i] += n
				}
			}
			l.TotalNs += c.TotalNs
			for i, n := range c.Slots {
				l.Slots[i] += n
			}
		}
		s.Launches = l
	}
	return nil
}

// Failure is one failed allocation call.
type Failure struct {
	PID, TID int
	API      int
	Code     int
	Size     uint64
	StackID  int32
	Time     time.Time
	PyStack  uint32
	// SnapNs is the kernel clock of the failure where it opened its
	// process's memory snapshot (snapshot.go), 0 where it did not (one
	// open already, or too soon after the last one kept).
	SnapNs uint64
	// LiveBytes is the process's live device bytes at the failure, as the
	// kernel's running sum had them.
	LiveBytes int64
}

// Failures drains the failure ring buffer without blocking.
func (t *Tracker) Failures() ([]Failure, error) {
	toWall := bpfobj.WallClock()
	t.reader.SetDeadline(time.Now())
	var (
		out []Failure
		rec ringbuf.Record
		f   cudaCudaFailure
	)
	for {
		if err := t.reader.ReadInto(&rec); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return out, nil
			}
			return out, fmt.Errorf("reading cuda failures: %w", err)
		}
		if _, err := binary.Decode(rec.RawSample, binary.NativeEndian, &f); err != nil {
			return out, fmt.Errorf("decoding a cuda failure: %w", err)
		}
		out = append(out, Failure{
			PID: int(f.Tgid), TID: int(f.Tid), API: int(f.Api), Code: int(f.Code),
			Size: f.Size, StackID: t.stacks.Canonical(f.StackId), Time: toWall(f.TimeNs), PyStack: f.PyStack,
			SnapNs: f.SnapNs, LiveBytes: f.LiveBytes,
		})
		t.failStacks[uint32(f.StackId)] = true
		t.failStacks[uint32(t.stacks.Canonical(f.StackId))] = true
	}
}

// errorNames follows enum err_kind in bpf/common.h: the kinds this object
// can count.
var errorNames = map[cudaErrKind]string{
	cudaErrKindERR_TABLE_FULL:   "cuda_evictions",
	cudaErrKindERR_STACK:        "cuda_stack",
	cudaErrKindERR_ENTRY_STATE:  "cuda_entry_state",
	cudaErrKindERR_COUNTERS:     "cuda_counters",
	cudaErrKindERR_READ_USER:    "cuda_read_user",
	cudaErrKindERR_RINGBUF:      "cuda_ringbuf",
	cudaErrKindERR_SITES:        "cuda_sites",
	cudaErrKindERR_OOM_SNAPSHOT: "cuda_oom_snapshot",
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
	if t.reader != nil {
		errs = append(errs, t.reader.Close())
		t.reader = nil
	}
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

func (t *Tracker) rootPath(pid int, path string) string {
	return filepath.Join(t.procRoot, strconv.Itoa(pid), "root", path)
}
