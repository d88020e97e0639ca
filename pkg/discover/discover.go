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
	"sync"

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

// Watcher owns the discovery BPF object and the goroutine reading its ring
// buffer.
type Watcher struct {
	obj    *bpfobj.Object
	maps   discoverMaps
	reader *ringbuf.Reader
	events chan Event
	done   sync.WaitGroup
}

// New loads and attaches the discovery programs (tp_btf where the kernel
// allows, else classic tracepoints, or those when tracepoint is set) and
// starts reading events.
func New(tracepoint bool) (*Watcher, error) {
	w := &Watcher{events: make(chan Event, 1024)}
	var err error
	w.obj, err = bpfobj.Open(loadDiscover, bpfobj.Options{What: "discovery BPF programs", Maps: &w.maps, Tracepoint: tracepoint})
	if err != nil {
		return nil, err
	}
	if w.reader, err = ringbuf.NewReader(w.maps.Events); err != nil {
		w.obj.Close()
		return nil, fmt.Errorf("opening the discovery ring buffer: %w", err)
	}
	w.done.Add(1)
	go w.read()
	return w, nil
}

// read forwards events until the reader is closed. A full channel blocks
// it, and the ring buffer then fills and counts what it drops.
func (w *Watcher) read() {
	defer w.done.Done()
	defer close(w.events)
	var (
		rec ringbuf.Record
		e   discoverDiscoverEvent
	)
	for {
		if err := w.reader.ReadInto(&rec); err != nil {
			if !errors.Is(err, os.ErrClosed) {
				fmt.Fprintln(os.Stderr, "reading discovery events:", err)
			}
			return
		}
		if _, err := binary.Decode(rec.RawSample, binary.NativeEndian, &e); err != nil {
			continue
		}
		w.events <- Event{PID: int(e.Pid), Why: Why(e.Why)}
	}
}

// Events delivers the events in the order the kernel sent them; it is
// closed by Close.
func (w *Watcher) Events() <-chan Event { return w.events }

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

// Close detaches everything and stops the reader; Events is then closed.
// A reader blocked on a full channel is released by draining it.
func (w *Watcher) Close() error {
	err := w.reader.Close()
	go func() {
		for range w.events {
		}
	}()
	w.done.Wait()
	return errors.Join(err, w.obj.Close())
}
