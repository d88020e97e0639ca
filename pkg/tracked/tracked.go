// Package tracked keeps the processes the views watch in one BPF map,
// tracked_pids (bpf/tracked.h), that every view's object is loaded with in
// place of its own: a process is one entry whatever the views watching it,
// its value a bit per view, so each object's programs pass only the
// processes of their view. The map and the objects' maps kept per process
// are sized from the processes the tool may watch.
package tracked

import (
	"errors"
	"fmt"
	"maps"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// DefaultProcesses is what the maps are sized for where no cap is given
// (run and attach: their targets and children).
const DefaultProcesses = 4096

// Capacity is the most processes the maps may be sized for. Most per-process
// maps are preallocated: at this size they hold some tens of MiB of kernel
// memory in all, where the daemon's default cap needs well under one.
const Capacity = 65536

// ForkHeadroom is the entries beyond the processes watched: children the
// fd view marks at fork before user space takes or lets them go (most
// live less than a poll), and processes gone since the last poll.
const ForkHeadroom = 1024

// viewBits are the value bits views may have; the higher ones are the fd
// view's fork marks (bpf/tracked.h).
const viewBits = 6

// MapName is the shared map's name in every object.
const MapName = "tracked_pids"

// ErrOverCapacity is returned for a cap over Capacity.
var ErrOverCapacity = errors.New("over what the kernel maps hold")

// Set is the shared map and the views' bits in it.
type Set struct {
	mu      sync.Mutex // each update reads the value that views share
	m       *ebpf.Map
	entries uint32
	views   int
}

// New creates the map for up to processes watched at once (0:
// DefaultProcesses). A number over Capacity is refused, naming both.
func New(processes int) (*Set, error) {
	if processes <= 0 {
		processes = DefaultProcesses
	}
	if processes > Capacity {
		return nil, fmt.Errorf("%d processes: %w (%d)", processes, ErrOverCapacity, Capacity)
	}
	entries := uint32(processes + ForkHeadroom)
	// Made before any object: before 5.11 maps are charged to
	// RLIMIT_MEMLOCK, raised here as bpfobj.Probe does (a no-op where
	// memcg charges them; where it cannot be raised the map's EPERM says so).
	_ = rlimit.RemoveMemlock()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Name: MapName, Type: ebpf.Hash, KeySize: 4, ValueSize: 1, MaxEntries: entries})
	if err != nil {
		return nil, fmt.Errorf("creating the map of tracked processes: %w", err)
	}
	return &Set{m: m, entries: entries}, nil
}

// Entries is the size of the map, and of every map kept per process.
func (s *Set) Entries() uint32 { return s.entries }

// Memory is the kernel memory the map takes (memlock); the objects that
// share it do not count it.
func (s *Set) Memory() uint64 {
	info, err := s.m.Info()
	if err != nil {
		return 0
	}
	n, _ := info.Memlock()
	return n
}

// Close frees the map once no object uses it.
func (s *Set) Close() error { return s.m.Close() }

// View is one view's part of the set: its bit.
type View struct {
	s   *Set
	bit uint8
	own bool // the set is the view's: Close closes it
}

// Join hands a view its bit in s, or where s is nil in a set of its own
// for DefaultProcesses, closed with the view: what a tracker loaded alone
// (tests, tools) does.
func Join(s *Set) (*View, error) {
	own := s == nil
	if own {
		var err error
		if s, err = New(0); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.views == viewBits {
		return nil, fmt.Errorf("more than %d views share the map of tracked processes", viewBits)
	}
	v := &View{s: s, bit: 1 << s.views, own: own}
	s.views++
	return v, nil
}

// Close closes the set if it is the view's own; the view's object must be
// closed first.
func (v *View) Close() error {
	if v == nil || !v.own {
		return nil
	}
	v.own = false
	return v.s.Close()
}

// Prepare fits an object's spec to the set before it is loaded: its bit
// (view_bit), and the set's size for tracked_pids and for perProcess, the
// object's maps holding one entry per process. Load it with Replacements.
func (v *View) Prepare(spec *ebpf.CollectionSpec, perProcess ...string) error {
	bit := spec.Variables["view_bit"]
	if bit == nil || spec.Maps[MapName] == nil {
		return fmt.Errorf("the object has no %s or view_bit (bpf/tracked.h)", MapName)
	}
	if err := bit.Set(v.bit); err != nil {
		return fmt.Errorf("setting view_bit: %w", err)
	}
	for _, name := range append([]string{MapName}, perProcess...) {
		m := spec.Maps[name]
		if m == nil {
			return fmt.Errorf("the object has no map %s", name)
		}
		m.MaxEntries = v.s.entries
	}
	return nil
}

// Replacements are the maps the object is loaded with in place of its own.
func (v *View) Replacements() map[string]*ebpf.Map { return map[string]*ebpf.Map{MapName: v.s.m} }

// With merges Replacements with others (the stack service's).
func (v *View) With(others map[string]*ebpf.Map) map[string]*ebpf.Map {
	out := maps.Clone(others)
	if out == nil {
		out = map[string]*ebpf.Map{}
	}
	maps.Copy(out, v.Replacements())
	return out
}

// Track sets the view's bit for tgid, and of its other bits sets set and
// clears clear (the fd view's fork marks).
func (v *View) Track(tgid uint32, set, clear uint8) error {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	var old uint8
	if err := v.s.m.Lookup(tgid, &old); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	if err := v.s.m.Update(tgid, old&^clear|v.bit|set, ebpf.UpdateAny); err != nil {
		if errors.Is(err, unix.E2BIG) {
			return fmt.Errorf("the map of tracked processes is full (%d entries): %w", v.s.entries, err)
		}
		return err
	}
	return nil
}

// Untrack clears the view's bit for tgid and the bits of clear; the entry
// goes with the last bit.
func (v *View) Untrack(tgid uint32, clear uint8) {
	v.s.mu.Lock()
	defer v.s.mu.Unlock()
	var old uint8
	if v.s.m.Lookup(tgid, &old) != nil {
		return
	}
	if left := old &^ (v.bit | clear); left != 0 {
		_ = v.s.m.Update(tgid, left, ebpf.UpdateExist)
	} else {
		_ = v.s.m.Delete(tgid)
	}
}

// Tracks says whether the view's bit is set for tgid.
func (v *View) Tracks(tgid uint32) bool {
	var val uint8
	return v.s.m.Lookup(tgid, &val) == nil && val&v.bit != 0
}
