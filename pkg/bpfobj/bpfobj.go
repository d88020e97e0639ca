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
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/tracefs"
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

// LoadCollection loads spec. Errors start with "loading " + what and say
// what the user can do: the verifier log in full, or the privileges needed.
func LoadCollection(spec *ebpf.CollectionSpec, what string) (*ebpf.Collection, error) {
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading %s: %+v", what, ve)
		}
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("loading %s: %w (needs root or CAP_BPF+CAP_PERFMON)", what, err)
		}
		return nil, fmt.Errorf("loading %s: %w", what, err)
	}
	return coll, nil
}

// AttachTracepoints attaches each program of spec, loaded in coll, to the
// tracepoint its section names. On failure it closes what it attached.
func AttachTracepoints(spec *ebpf.CollectionSpec, coll *ebpf.Collection) ([]link.Link, error) {
	var links []link.Link
	for name, p := range spec.Programs {
		group, event := Tracepoint(p)
		l, err := link.Tracepoint(group, event, coll.Programs[name], nil)
		if err != nil {
			_ = Close(links, nil, nil)
			return nil, fmt.Errorf("attaching %s to %s/%s: %w", name, group, event, err)
		}
		links = append(links, l)
	}
	return links, nil
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

// ReadAll reads every entry of a hash map that BPF programs update while we
// read it. A walk whose current key is deleted restarts from the first
// bucket, so keys can come twice (kept once here) and the walk can abort
// (tried again, three times in all).
func ReadAll[K comparable, V any](m *ebpf.Map) (map[K]V, error) {
	var err error
	for try := 0; try < 3; try++ {
		out := map[K]V{}
		var (
			k K
			v V
		)
		it := m.Iterate()
		for it.Next(&k, &v) {
			out[k] = v
		}
		if err = it.Err(); err == nil {
			return out, nil
		}
		if !errors.Is(err, ebpf.ErrIterationAborted) {
			break
		}
	}
	return nil, err
}

// Tracepoints is a loaded object whose programs all sit on tracepoints.
type Tracepoints struct {
	Skipped []string // optional tracepoints this kernel lacks
	coll    *ebpf.Collection
	links   []link.Link
	maps    io.Closer
}

// OpenTracepoints drops the optional programs whose tracepoint is missing
// (PruneTracepoints), loads the rest (LoadCollection), assigns the maps to
// maps (a pointer to the bpf2go maps struct) and attaches every program.
// On failure nothing stays loaded.
func OpenTracepoints(spec *ebpf.CollectionSpec, root string, required func(prog, tp string) bool, cannot, what string, maps io.Closer) (*Tracepoints, error) {
	skipped, err := PruneTracepoints(spec, root, required, cannot)
	if err != nil {
		return nil, err
	}
	coll, err := LoadCollection(spec, what)
	if err != nil {
		return nil, err
	}
	o := &Tracepoints{Skipped: skipped, coll: coll}
	if err := coll.Assign(maps); err != nil {
		o.Close()
		return nil, err
	}
	o.maps = maps
	if o.links, err = AttachTracepoints(spec, coll); err != nil {
		o.Close()
		return nil, err
	}
	if len(skipped) > 0 {
		slog.Debug("tracepoints missing on this kernel", "object", what, "skipped", skipped)
	}
	return o, nil
}

// Close detaches and unloads everything; safe to call more than once.
func (o *Tracepoints) Close() error {
	err := Close(o.links, o.maps, o.coll)
	o.links, o.maps, o.coll = nil, nil, nil
	return err
}

// Programs returns the loaded programs by name (nil after Close).
func (o *Tracepoints) Programs() map[string]*ebpf.Program {
	if o.coll == nil {
		return nil
	}
	return o.coll.Programs
}
