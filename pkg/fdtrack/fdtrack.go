// Package fdtrack loads and attaches the fd-tracking BPF object and reads its
// maps: the live fd table of each tracked process, per-process totals by fd
// kind, the opening stacks and the error counters.
package fdtrack

import (
	"strings"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracefs"
)

// Required programs: without them there is no fd tracking at all.
var required = map[string]bool{"exit_openat": true, "enter_close": true}

// Config sizes the kernel maps.
type Config struct {
	MaxFDs   uint32 // live fd table capacity, all processes together
	ProcRoot string // normally /proc
}

// Tracker owns the loaded fd BPF object and its links.
type Tracker struct {
	obj  *bpfobj.Tracepoints
	maps fdMaps
	proc procinfo.FS

	// Per process: fds that vanished without a traced close (found by
	// reconciling with /proc), added to the kernel's closed counters.
	extraClosed map[uint32]*[len(fdFdCounts{}.Closed)]uint64
	resyncs     map[uint32]uint64
	drift       map[uint32]int // polls in a row whose count differed from /proc
	started     map[uint32]time.Time
}

// Programs returns the tracepoints the fd object attaches, as group/name, with
// the program that goes on each. Used by New and by `check`.
func Programs() (map[string]string, error) {
	spec, err := loadFd()
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(spec.Programs))
	for name, p := range spec.Programs {
		out[name] = strings.TrimPrefix(p.SectionName, "tracepoint/")
	}
	return out, nil
}

// New loads the fd object and attaches every program whose tracepoint exists.
func New(cfg Config) (*Tracker, error) {
	root, _, err := tracefs.Ensure()
	if err != nil {
		return nil, err
	}
	proc, err := procinfo.New(cfg.ProcRoot)
	if err != nil {
		return nil, err
	}
	spec, err := loadFd()
	if err != nil {
		return nil, err
	}
	if cfg.MaxFDs > 0 {
		spec.Maps[fdMapFdTable].MaxEntries = cfg.MaxFDs
	}
	t := &Tracker{
		proc:        proc,
		extraClosed: map[uint32]*[len(fdFdCounts{}.Closed)]uint64{},
		resyncs:     map[uint32]uint64{},
		drift:       map[uint32]int{},
		started:     map[uint32]time.Time{},
	}
	// Optional programs whose tracepoint this kernel lacks are removed from the
	// spec before loading, so they are neither loaded nor fatal.
	t.obj, err = bpfobj.OpenTracepoints(spec, root, func(prog, _ string) bool { return required[prog] },
		"trace fds (CONFIG_FTRACE_SYSCALLS off?)", "fd BPF programs", &t.maps)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Skipped lists the optional tracepoints this kernel lacks.
func (t *Tracker) Skipped() []string { return t.obj.Skipped }

// Close detaches and unloads everything; safe to call more than once.
func (t *Tracker) Close() error {
	return t.obj.Close()
}
