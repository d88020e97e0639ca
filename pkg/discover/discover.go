// Package discover tells the node-wide daemon which processes appeared or
// went, from kernel events rather than a walk of /proc every interval: a
// process that maps a CUDA library executable (PyTorch dlopens it seconds
// after start) and a process that execs. See bpf/discover.bpf.c.
package discover

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
)

// Why an event was sent.
type Why uint32

// Event kinds, as enum discover_why in bpf/discover.bpf.c.
const (
	CUDAMapped = Why(discoverDiscoverWhyWHY_CUDA_MAPPED)
	Exec       = Why(discoverDiscoverWhyWHY_EXEC)
)

func (w Why) String() string {
	switch w {
	case CUDAMapped:
		return "cuda-mapped"
	case Exec:
		return "exec"
	}
	return fmt.Sprintf("why(%d)", uint32(w))
}

// Event is one process event.
type Event struct {
	PID int
	Why Why
}

// Watcher owns the discovery BPF object and its ring buffer, which the
// daemon drains at each poll: the events wait there (16 384 of them fit),
// and nothing wakes for each exec of a busy node.
type Watcher struct {
	obj    *bpfobj.Object
	maps   discoverMaps
	reader *ringbuf.Reader
	rec    ringbuf.Record
}

// New loads and attaches the discovery programs (tp_btf where the kernel
// allows, else classic tracepoints, or those when tracepoint is set).
func New(tracepoint bool) (*Watcher, error) {
	w := &Watcher{}
	var err error
	w.obj, err = bpfobj.Open(loadDiscover, bpfobj.Options{What: "discovery BPF programs", Maps: &w.maps, Tracepoint: tracepoint})
	if err != nil {
		return nil, err
	}
	if w.reader, err = ringbuf.NewReader(w.maps.Events); err != nil {
		w.obj.Close()
		return nil, fmt.Errorf("opening the discovery ring buffer: %w", err)
	}
	return w, nil
}

// Drain returns the events the kernel sent since the last call, in order,
// without waiting. A ring buffer that filled up in between counted what it
// dropped (Lost).
func (w *Watcher) Drain() ([]Event, error) {
	w.reader.SetDeadline(time.Now())
	var (
		out []Event
		e   discoverDiscoverEvent
	)
	for {
		if err := w.reader.ReadInto(&w.rec); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return out, nil
			}
			return out, fmt.Errorf("reading discovery events: %w", err)
		}
		if _, err := binary.Decode(w.rec.RawSample, binary.NativeEndian, &e); err != nil {
			return out, fmt.Errorf("decoding a discovery event: %w", err)
		}
		out = append(out, Event{PID: int(e.Pid), Why: Why(e.Why)})
	}
}

// Mode says how the programs are attached: bpfobj.ModeBTF or ModeTracepoint.
func (w *Watcher) Mode() string { return w.obj.Mode }

// errorNames follows enum err_kind in bpf/common.h: the kinds this object
// can count.
var errorNames = map[discoverErrKind]string{
	discoverErrKindERR_RINGBUF:     "discover_ringbuf",
	discoverErrKindERR_READ_KERNEL: "discover_read_kernel",
}

// Lost returns the BPF error counters (monotonic since load), by source:
// events the ring buffer had no room for, and files whose name could not be
// read.
func (w *Watcher) Lost() (map[string]uint64, error) {
	return bpfobj.Counters(w.maps.Errors, errorNames)
}

// Close detaches everything.
func (w *Watcher) Close() error {
	return errors.Join(w.reader.Close(), w.obj.Close())
}
