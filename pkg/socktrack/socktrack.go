// Package socktrack loads and attaches the socket-tracking BPF object and
// builds the socket view of each tracked process.
//
// Counts are exact: the socket inodes in /proc/PID/fd, looked up in the TCP
// sockets of the process's network namespace, give per-process counts by TCP
// state, including sockets opened before tracking began. The namespace's
// sockets come from sock_diag netlink (INET_DIAG), which leaves TIME_WAIT
// sockets out in the kernel, or from /proc/PID/net/tcp{,6} where sock_diag
// is missing. Other sockets are sorted by the protocol name sockfs gives (the
// system.sockprotoname attribute of /proc/PID/fd/N). The kernel side (bpf/sock.bpf.c) records when
// each socket of a tracked process entered its state; joined by inode, it
// dates CLOSE_WAIT sockets to the moment the peer's FIN arrived rather than to
// the poll that first saw them.
package socktrack

import (
	"errors"
	"log/slog"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracked"
)

// Tracepoint is the one tracepoint the object cannot do without.
const Tracepoint = "sock/inet_sock_set_state"

// Config sizes the kernel maps.
type Config struct {
	MaxSockets uint32 // TCP sockets tracked in the kernel, all processes together
	ProcRoot   string // normally /proc
	// Cache, when set, shares reads of /proc/PID/fd with the fd concern
	// within a poll: both list a process that just started.
	Cache *procinfo.PollCache
	// ProcTables reads TCP sockets from /proc/PID/net/tcp{,6} even where
	// sock_diag works: the benchmark's baseline. Without sock_diag they
	// are read from there anyway.
	ProcTables bool
	// Tracked is the map of tracked processes shared with the other
	// objects; nil: one of the tracker's own, closed with it.
	Tracked *tracked.Set
}

// Tracker owns the loaded socket BPF object and its links, and what user space
// remembers between polls.
type Tracker struct {
	obj      *bpfobj.Object
	maps     sockMaps
	member   *tracked.View
	proc     procinfo.FS
	procRoot string

	pids map[int]*procState
	// The kernel's claimed sockets, each a tracked process's.
	table *bpfobj.Table[uint64, sockSockInfo]
	diag  *diag // nil: TCP sockets are read from /proc/PID/net/tcp{,6}
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
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	proc, err := procinfo.New(cfg.ProcRoot)
	if err != nil {
		return nil, err
	}
	t := &Tracker{proc: proc.WithPollCache(cfg.Cache), procRoot: cfg.ProcRoot, pids: map[int]*procState{}}
	if t.member, err = tracked.Join(cfg.Tracked); err != nil {
		return nil, err
	}
	// Missing accept tracepoints only cost accepted sockets their exact
	// dates until the next poll lists them; those programs are dropped from
	// the spec so they are neither loaded nor fatal.
	t.obj, err = bpfobj.Open(loadSock, bpfobj.Options{
		What: "socket BPF programs", Maps: &t.maps,
		Required: func(_, tp string) bool { return tp == Tracepoint }, Cannot: "trace TCP state changes",
		Tune: func(spec *ebpf.CollectionSpec) error {
			if cfg.MaxSockets > 0 {
				spec.Maps[sockMapSockTable].MaxEntries = cfg.MaxSockets
				spec.Maps[sockMapSockInodes].MaxEntries = cfg.MaxSockets
			}
			return nil
		},
		Tracked: t.member,
	})
	if err != nil {
		_ = t.member.Close()
		return nil, err
	}
	t.table = bpfobj.NewTable(t.maps.SockTable, func(_ uint64, info sockSockInfo) uint32 { return info.Tgid })
	if !cfg.ProcTables {
		if t.diag, err = newDiag(cfg.ProcRoot); err != nil {
			slog.Warn("sock_diag unavailable: reading TCP sockets from /proc/PID/net/tcp, which costs more on hosts with many sockets", "err", err)
		}
	}
	return t, nil
}

// Skipped lists the optional tracepoints this kernel lacks.
func (t *Tracker) Skipped() []string { return t.obj.Skipped }

// Close detaches and unloads everything; safe to call more than once.
func (t *Tracker) Close() error {
	if t.diag != nil {
		t.diag.close()
	}
	return errors.Join(t.obj.Close(), t.member.Close())
}
