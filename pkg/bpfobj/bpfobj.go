// Package bpfobj holds the steps every tracker takes with its BPF object:
// dropping optional tracepoint programs the kernel cannot attach, loading
// with errors a user can act on, attaching tracepoints, closing, and reading
// the per-CPU error counters. Each tracker keeps its own choice of what is
// required and how it probes the kernel.
package bpfobj

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/tracefs"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracked"
)

// Tracepoint returns the group and event of a tracepoint program, from its
// section name "tracepoint/GROUP/EVENT".
func Tracepoint(p *ebpf.ProgramSpec) (group, event string) {
	group, event, _ = strings.Cut(strings.TrimPrefix(p.SectionName, "tracepoint/"), "/")
	return group, event
}

// PruneTracepoints removes from spec the programs whose tracepoint is missing
// under the tracefs root, so that they are neither loaded nor fatal, and
// returns those tracepoints as group/event. A missing tracepoint for which
// required(group/event) is true fails instead: "tracepoint X is missing: this
// kernel cannot " + cannot.
func PruneTracepoints(spec *ebpf.CollectionSpec, root string, required func(prog, tp string) bool, cannot string) ([]string, error) {
	var skipped []string
	for name, p := range spec.Programs {
		group, event := Tracepoint(p)
		if tracefs.EventExists(root, group, event) {
			continue
		}
		tp := group + "/" + event
		if required(name, tp) {
			return nil, fmt.Errorf("tracepoint %s is missing: this kernel cannot %s", tp, cannot)
		}
		skipped = append(skipped, tp)
		delete(spec.Programs, name)
	}
	return skipped, nil
}

// LoadCollection fits spec to the running kernel (Kernel.Adapt) and loads
// it, with the maps of replace in place of its own of those names (maps
// shared between objects, pkg/stacks). Errors start with "loading " + what
// and say what the user can do: the verifier log in full, or the
// privileges needed.
func LoadCollection(spec *ebpf.CollectionSpec, what string, replace map[string]*ebpf.Map) (*ebpf.Collection, error) {
	if err := Probe().Adapt(spec); err != nil {
		return nil, fmt.Errorf("loading %s: %w", what, err)
	}
	cache := kernelTypes.acquire()
	defer kernelTypes.release()
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{MapReplacements: replace, Cache: cache})
	if err != nil {
		return nil, &LoadError{What: what, Err: err}
	}
	noteCosts(what, coll)
	return coll, nil
}

// kernelTypes is the kernel's BTF, decoded once for the loads in flight
// together: the views load side by side at start-up, and each decoding its
// own copy of the kernel's types was most of the tool's peak memory. The
// last load in flight lets it go: a long run keeps none of it.
var kernelTypes sharedBTF

type sharedBTF struct {
	mu       sync.Mutex
	cache    *btf.Cache
	inFlight int
}

func (s *sharedBTF) acquire() *btf.Cache {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight++; s.cache == nil {
		s.cache = btf.NewCache()
	}
	return s.cache
}

func (s *sharedBTF) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inFlight--; s.inFlight == 0 {
		s.cache = nil
	}
}

// LoadError is an object the kernel refused. Its message carries the
// verifier's log in full, for a bug report.
type LoadError struct {
	What string
	Err  error
}

func (e *LoadError) Error() string {
	var ve *ebpf.VerifierError
	if errors.As(e.Err, &ve) {
		return fmt.Sprintf("loading %s: %+v", e.What, ve)
	}
	if errors.Is(e.Err, unix.EPERM) {
		return fmt.Sprintf("loading %s: %v (%s)", e.What, e.Err, EPERMCause())
	}
	return fmt.Sprintf("loading %s: %v", e.What, e.Err)
}

// EPERMCause says what may refuse this process's bpf() or perf_event_open()
// with EPERM (epermCause).
func EPERMCause() string { return epermCause(procStatus()) }

// epermCause says what refuses a load with EPERM, given this process's
// /proc/self/status: missing capabilities, or a seccomp filter. The
// runtimes' default profiles before containerd 1.6.9 and containers/common
// 0.60 (CRI-O, Podman) admit bpf() and perf_event_open() only to a
// container with CAP_SYS_ADMIN, whatever CAP_BPF and CAP_PERFMON say.
func epermCause(status string) string {
	const caps = "needs root or CAP_BPF+CAP_PERFMON"
	for line := range strings.Lines(status) {
		if mode, ok := strings.CutPrefix(line, "Seccomp:"); ok && strings.TrimSpace(mode) == "2" {
			return caps + "; or this process's seccomp filter refused it: container runtimes' default profiles before containerd 1.6.9 and containers/common 0.60 admit bpf() and perf_event_open() only with CAP_SYS_ADMIN, so run it with seccompProfile Unconfined there"
		}
	}
	return caps
}

// procStatus is /proc/self/status ("" if unreadable: no seccomp filter is
// named then).
func procStatus() string {
	b, _ := os.ReadFile("/proc/self/status")
	return string(b)
}

func (e *LoadError) Unwrap() error { return e.Err }

// Summary says in one line why err happened: for a refused load, the
// verifier's own last words (the instruction and what it expected), which
// name the first thing the running kernel lacks.
func Summary(err error) string {
	var le *LoadError
	if errors.As(err, &le) {
		var ve *ebpf.VerifierError
		if errors.As(le.Err, &ve) {
			return fmt.Sprintf("loading %s: %v", le.What, ve)
		}
		return le.Error()
	}
	msg, _, _ := strings.Cut(err.Error(), "\n")
	return msg
}

// Close closes links, then maps (the bpf2go maps struct, or nil), then coll
// (or nil): programs are detached before what they use is released.
func Close(links []link.Link, maps io.Closer, coll *ebpf.Collection) error {
	var errs []error
	for _, l := range links {
		errs = append(errs, l.Close())
	}
	if maps != nil {
		errs = append(errs, maps.Close())
	}
	if coll != nil {
		coll.Close()
	}
	return errors.Join(errs...)
}

// Counters sums a per-CPU array of uint64 counters (the objects' errors map)
// at each key of names, by name.
func Counters[K ~uint32](m *ebpf.Map, names map[K]string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(names))
	for k, name := range names {
		var per []uint64
		if err := m.Lookup(uint32(k), &per); err != nil {
			return nil, err
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		out[name] = sum
	}
	return out, nil
}

// StackGCEvery is how many polls pass between two sweeps of a view's
// stacks (pkg/stacks): often enough that a busy node does not fill a stack
// map in between, rarely enough that walking the map's keys costs little.
const StackGCEvery = 10

// How an object's programs attach: typed BTF tracepoints (tp_btf: no tracefs,
// no trace record built per event) where the kernel allows, else the classic
// tracepoints. A program's section says which mode it belongs to.
const (
	ModeBTF        = "tp_btf"
	ModeTracepoint = "tracepoint"
)

func modeOf(p *ebpf.ProgramSpec) string {
	if strings.HasPrefix(p.SectionName, ModeBTF+"/") {
		return ModeBTF
	}
	return ModeTracepoint
}

// Options say how Open loads one object.
type Options struct {
	What string    // for errors: "loading " + What
	Maps io.Closer // the bpf2go maps struct to assign
	// Tracepoint uses the classic tracepoints even where tp_btf works, so
	// that tests and benchmarks cover the fallback on any kernel.
	Tracepoint bool
	// Required says which classic tracepoints may not be missing (see
	// PruneTracepoints); Cannot says what the tool then cannot do.
	Required func(prog, tp string) bool
	Cannot   string
	// Tune adjusts the spec before loading (map sizes, constants).
	Tune func(*ebpf.CollectionSpec) error
	// Replace are maps the object is loaded with in place of its own of
	// those names (LoadCollection).
	Replace map[string]*ebpf.Map
	// Tracked is the view's part of the shared map of tracked processes:
	// the object is loaded with it, its PerProcess maps sized as it is.
	Tracked    *tracked.View
	PerProcess []string
}

// Object is a loaded collection whose programs sit on tracepoints of one mode.
type Object struct {
	Mode     string   // ModeBTF or ModeTracepoint
	BTFError error    // why tp_btf is not used; nil when it is or the object has none
	Skipped  []string // optional classic tracepoints this kernel lacks
	coll     *ebpf.Collection
	links    []link.Link
	maps     io.Closer
	members  Members
}

// Open loads the programs of one mode from the spec load returns and
// attaches them: the tp_btf programs if the object has any and the kernel
// loads and attaches them, else the classic tracepoint programs (mounting
// tracefs if needed, dropping optional programs whose tracepoint is
// missing). On failure nothing stays loaded.
func Open(load func() (*ebpf.CollectionSpec, error), o Options) (*Object, error) {
	obj := &Object{}
	spec, err := load()
	if err != nil {
		return nil, err
	}
	hasBTF := false
	for _, p := range spec.Programs {
		hasBTF = hasBTF || modeOf(p) == ModeBTF
	}
	if hasBTF && !o.Tracepoint {
		if err := obj.open(spec, ModeBTF, "", o); err == nil {
			return obj, nil
		} else {
			obj.BTFError = err
			slog.Debug("tp_btf unavailable, using classic tracepoints", "object", o.What, "err", err)
		}
		if spec, err = load(); err != nil {
			return nil, err
		}
	}
	root, _, err := tracefs.Ensure()
	if err != nil {
		return nil, err
	}
	if err := obj.open(spec, ModeTracepoint, root, o); err != nil {
		if obj.BTFError != nil {
			err = fmt.Errorf("%w (tp_btf: %v)", err, obj.BTFError)
		}
		return nil, err
	}
	return obj, nil
}

func (obj *Object) open(spec *ebpf.CollectionSpec, mode, root string, o Options) error {
	for name, p := range spec.Programs {
		if modeOf(p) != mode {
			delete(spec.Programs, name)
		}
	}
	if mode == ModeTracepoint {
		required := o.Required
		if required == nil {
			required = func(string, string) bool { return true }
		}
		skipped, err := PruneTracepoints(spec, root, required, o.Cannot)
		if err != nil {
			return err
		}
		obj.Skipped = skipped
	}
	what := fmt.Sprintf("%s (%s)", o.What, mode)
	replace := o.Replace
	if o.Tracked != nil {
		if err := o.Tracked.Prepare(spec, o.PerProcess...); err != nil {
			return fmt.Errorf("loading %s: %w", what, err)
		}
		replace = o.Tracked.With(replace)
	}
	if o.Tune != nil {
		if err := o.Tune(spec); err != nil {
			return fmt.Errorf("loading %s: %w", what, err)
		}
	}
	coll, err := LoadCollection(spec, what, replace)
	if err != nil {
		return err
	}
	obj.coll = coll
	obj.members = MembersOf(coll, replace)
	if err := coll.Assign(o.Maps); err != nil {
		obj.Close()
		return err
	}
	obj.maps = o.Maps
	for _, name := range slices.Sorted(maps.Keys(spec.Programs)) {
		var l link.Link
		if mode == ModeBTF {
			l, err = link.AttachTracing(link.TracingOptions{Program: coll.Programs[name]})
		} else {
			group, event := Tracepoint(spec.Programs[name])
			l, err = link.Tracepoint(group, event, coll.Programs[name], nil)
		}
		if err != nil {
			obj.Close()
			return fmt.Errorf("attaching %s (%s): %w", name, spec.Programs[name].SectionName, err)
		}
		obj.links = append(obj.links, l)
	}
	obj.Mode = mode
	if len(obj.Skipped) > 0 {
		slog.Debug("tracepoints missing on this kernel", "object", o.What, "skipped", obj.Skipped)
	}
	return nil
}

// Close detaches and unloads everything; safe to call more than once.
func (obj *Object) Close() error {
	err := Close(obj.links, obj.maps, obj.coll)
	obj.links, obj.maps, obj.coll = nil, nil, nil
	return err
}

// Memory is the kernel memory the object's maps and programs take now.
func (obj *Object) Memory() uint64 { return obj.members.Memory() }

// Members are a collection's maps and programs, listed before Assign moves
// them out of it, for Memory.
type Members struct {
	Maps     []*ebpf.Map
	Programs []*ebpf.Program
}

// MembersOf lists what coll holds now, but for the maps of those names in
// replaced (another owner's, counted there).
func MembersOf(coll *ebpf.Collection, replaced map[string]*ebpf.Map) Members {
	m := Members{Programs: slices.Collect(maps.Values(coll.Programs))}
	for name, mp := range coll.Maps {
		if _, ok := replaced[name]; !ok {
			m.Maps = append(m.Maps, mp)
		}
	}
	return m
}

// Memory sums what the kernel charges for each map and program (memlock in
// their fdinfo: for a hash map without preallocation, what its entries use
// now; for a per-CPU map, its size times the possible CPUs). A closed one
// counts 0.
func (m Members) Memory() uint64 {
	var sum uint64
	for _, mp := range m.Maps {
		if info, err := mp.Info(); err == nil {
			n, _ := info.Memlock()
			sum += n
		}
	}
	for _, p := range m.Programs {
		if info, err := p.Info(); err == nil {
			n, _ := info.Memlock()
			sum += n
		}
	}
	return sum
}

// Programs returns the loaded programs by name (nil after Close).
func (obj *Object) Programs() map[string]*ebpf.Program {
	if obj.coll == nil {
		return nil
	}
	return obj.coll.Programs
}
