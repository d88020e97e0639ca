// Package socktrack loads and attaches the socket-tracking BPF object and
// builds the socket view of each tracked process.
//
// Counts come from /proc: the socket inodes in /proc/PID/fd, looked up in the
// TCP tables of the process's network namespace (/proc/PID/net/tcp{,6}), give
// exact per-process counts by TCP state, including sockets opened before
// tracking began; other sockets are sorted by the protocol name sockfs gives
// (the system.sockprotoname attribute of /proc/PID/fd/N). The kernel side (bpf/sock.bpf.c) records when
// each socket of a tracked process entered its state; joined by inode, it
// dates CLOSE_WAIT sockets to the moment the peer's FIN arrived rather than to
// the poll that first saw them.
package socktrack

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracefs"
)

// Tracepoint is the one tracepoint the object cannot do without.
const Tracepoint = "sock/inet_sock_set_state"

// Config sizes the kernel maps.
type Config struct {
	MaxSockets uint32 // TCP sockets tracked in the kernel, all processes together
	ProcRoot   string // normally /proc
}

// Tracker owns the loaded socket BPF object and its links, and what user space
// remembers between polls.
type Tracker struct {
	coll     *ebpf.Collection
	maps     sockMaps
	links    []link.Link
	proc     procinfo.FS
	procRoot string
	skipped  []string // programs whose tracepoint this kernel lacks

	pids map[int]*procState
	// Failed sock_inodes updates (map full): those sockets are dated by
	// polling only.
	inodesFailed uint64
}

// Programs returns the tracepoints the socket object attaches, as group/name,
// with the program that goes on each. Used by New and by `check`.
func Programs() (map[string]string, error) {
	spec, err := loadSock()
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(spec.Programs))
	for name, p := range spec.Programs {
		out[name] = strings.TrimPrefix(p.SectionName, "tracepoint/")
	}
	return out, nil
}

// New loads the socket object and attaches every program whose tracepoint
// exists; without sock/inet_sock_set_state it fails.
func New(cfg Config) (*Tracker, error) {
	root, _, err := tracefs.Ensure()
	if err != nil {
		return nil, err
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	proc, err := procinfo.New(cfg.ProcRoot)
	if err != nil {
		return nil, err
	}
	spec, err := loadSock()
	if err != nil {
		return nil, err
	}
	if cfg.MaxSockets > 0 {
		spec.Maps[sockMapSockTable].MaxEntries = cfg.MaxSockets
		spec.Maps[sockMapSockInodes].MaxEntries = cfg.MaxSockets
	}
	t := &Tracker{proc: proc, procRoot: cfg.ProcRoot, pids: map[int]*procState{}}
	// Missing accept tracepoints only cost accepted sockets their exact
	// dates until the next poll lists them; those programs are dropped from
	// the spec so they are neither loaded nor fatal.
	for name, p := range spec.Programs {
		tp := strings.TrimPrefix(p.SectionName, "tracepoint/")
		group, event, _ := strings.Cut(tp, "/")
		if tracefs.EventExists(root, group, event) {
			continue
		}
		if tp == Tracepoint {
			return nil, fmt.Errorf("tracepoint %s is missing: this kernel cannot trace TCP state changes", tp)
		}
		t.skipped = append(t.skipped, tp)
		delete(spec.Programs, name)
	}
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading socket BPF programs: %+v", ve)
		}
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("loading socket BPF programs: %w (needs root or CAP_BPF+CAP_PERFMON)", err)
		}
		return nil, fmt.Errorf("loading socket BPF programs: %w", err)
	}
	t.coll = coll
	if err := coll.Assign(&t.maps); err != nil {
		t.Close()
		return nil, err
	}
	for name, p := range spec.Programs {
		group, event, _ := strings.Cut(strings.TrimPrefix(p.SectionName, "tracepoint/"), "/")
		l, err := link.Tracepoint(group, event, coll.Programs[name], nil)
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("attaching %s to %s/%s: %w", name, group, event, err)
		}
		t.links = append(t.links, l)
	}
	if len(t.skipped) > 0 {
		slog.Debug("socket tracepoints missing on this kernel", "skipped", t.skipped)
	}
	return t, nil
}

// Skipped lists the optional tracepoints this kernel lacks.
func (t *Tracker) Skipped() []string { return t.skipped }

// Close detaches and unloads everything; safe to call more than once.
func (t *Tracker) Close() error {
	var errs []error
	for _, l := range t.links {
		errs = append(errs, l.Close())
	}
	t.links = nil
	errs = append(errs, t.maps.Close())
	if t.coll != nil {
		t.coll.Close()
		t.coll = nil
	}
	return errors.Join(errs...)
}
