// Package fdtrack loads and attaches the fd-tracking BPF object and reads its
// maps: the live fd table of each tracked process, per-process totals by fd
// kind, the opening stacks and the error counters.
package fdtrack

import (
	"errors"
	"time"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracked"
)

// Config sizes the kernel maps.
type Config struct {
	MaxFDs   uint32 // live fd table capacity, all processes together
	ProcRoot string // normally /proc
	// Cache, when set, shares reads of /proc/PID/maps and /proc/PID/fd
	// with the other concerns within a poll.
	Cache *procinfo.PollCache
	// Tracepoint uses the classic raw_syscalls tracepoints even where tp_btf
	// works, so that tests and benchmarks cover the fallback on any kernel.
	Tracepoint bool
	// Symbolizer reads the call-frame information that stacks are unwound
	// with; nil: one of the tracker's own.
	Symbolizer *symbolize.Symbolizer
	// Stacks is the stack service shared with the other objects; nil: one
	// of the tracker's own (with Symbolizer), closed with it.
	Stacks *stacks.Service
	// Tracked is the map of tracked processes shared with the other
	// objects; nil: one of the tracker's own, closed with it.
	Tracked *tracked.Set
	// Follow tracks the children of tracked processes from their fork
	// (Forked offers them): their inherited fds are taken from the
	// parent's table, not read from /proc.
	Follow bool
	// ReadsPerPoll bounds the fds described from /proc (a readlink each)
	// per poll, node-wide; a table larger than what is left is filled over
	// several polls. 0: DefaultReadsPerPoll.
	ReadsPerPoll int
}

// DefaultReadsPerPoll is ReadsPerPoll's default: ~25 ms of readlinks here,
// a fortieth of a core at a 1 s interval.
const DefaultReadsPerPoll = 8192

// Tracker owns the loaded fd BPF object and its links.
type Tracker struct {
	obj  *bpfobj.Object
	maps fdMaps
	proc procinfo.FS
	// The live fd table and the failure sites, each entry a process's.
	table     *bpfobj.Table[fdFdKey, fdFdInfo]
	failSites *bpfobj.Table[uint32, fdFdInfo]
	sites     *stacks.Sites // fds opened and closed per call site

	// Per process: fds that vanished without a traced close (found by
	// reconciling with /proc), added to the kernel's closed counters.
	extraClosed map[uint32]*[len(fdFdCounts{}.Closed)]uint64
	resyncs     map[uint32]uint64
	drift       map[uint32]bool // suspects: their count differed from /proc's (checkDrift)
	started     map[uint32]time.Time
	atStart     map[uint32]int // open fds /proc listed when tracking began
	polls       int            // for the stack map's garbage collection
	// last is each process's fds as a poll turned them out, used again
	// while its table entries are the same: a process holding 15 000 fds
	// cost that many entries to rebuild each poll, idle or not.
	last map[uint32]lastFDs

	// Children tracked from fork hold the fds they inherited here, by
	// number, not in the kernel table: a leaking shell's 3 000 fds are not
	// copied, read back and deleted for each of its children. The kernel
	// table's entry of a number wins over an inherited one (dup2 onto it).
	inherited map[uint32]map[int32]uint8
	inhGen    map[uint32]uint64 // bumped when a process's inherited set changes
	filling   map[uint32]bool   // fds left to describe at a later poll
	pending   map[uint32]bool   // children marked at fork, first seen by the last Forked
	offered   map[uint32]bool   // children marked at fork, offered by Forked, not tracked yet
	follow    bool
	budget    int           // descriptions left this poll
	reads     model.FDReads // reads.PerPoll: the budget of each poll

	stacks stacks.Handle // closed by Close where it is the tracker's own
	view   *stacks.View
	member *tracked.View
}

// New loads the fd object and attaches it: tp_btf where the kernel allows,
// else the classic raw_syscalls tracepoints.
func New(cfg Config) (*Tracker, error) {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	proc, err := procinfo.New(cfg.ProcRoot)
	if err != nil {
		return nil, err
	}
	t := &Tracker{
		proc:        proc.WithPollCache(cfg.Cache),
		extraClosed: map[uint32]*[len(fdFdCounts{}.Closed)]uint64{},
		resyncs:     map[uint32]uint64{},
		drift:       map[uint32]bool{},
		started:     map[uint32]time.Time{},
		atStart:     map[uint32]int{},
		last:        map[uint32]lastFDs{},
		inherited:   map[uint32]map[int32]uint8{},
		inhGen:      map[uint32]uint64{},
		filling:     map[uint32]bool{},
		pending:     map[uint32]bool{},
		offered:     map[uint32]bool{},
		follow:      cfg.Follow,
	}
	t.reads.PerPoll = cfg.ReadsPerPoll
	if t.reads.PerPoll <= 0 {
		t.reads.PerPoll = DefaultReadsPerPoll
	}
	t.budget = t.reads.PerPoll
	if t.member, err = tracked.Join(cfg.Tracked); err != nil {
		return nil, err
	}
	if t.stacks, err = stacks.Hold(cfg.Stacks, t.proc, cfg.Symbolizer, cfg.ProcRoot); err != nil {
		t.closeShared()
		return nil, err
	}
	t.obj, err = bpfobj.Open(loadFd, bpfobj.Options{
		What: "fd BPF programs", Maps: &t.maps, Tracepoint: cfg.Tracepoint,
		Cannot: "trace fds (CONFIG_FTRACE_SYSCALLS off?)",
		Tune: func(spec *ebpf.CollectionSpec) error {
			if cfg.MaxFDs > 0 {
				spec.Maps[fdMapFdTable].MaxEntries = cfg.MaxFDs
			}
			return t.stacks.Prepare(spec)
		},
		Replace: t.stacks.Replacements(),
		Tracked: t.member, PerProcess: []string{fdMapFdCounters, fdMapFailSites, fdMapForks},
	})
	if err != nil {
		t.closeShared()
		return nil, err
	}
	t.table = bpfobj.NewTable(t.maps.FdTable, func(k fdFdKey, _ fdFdInfo) uint32 { return k.Tgid })
	t.failSites = bpfobj.NewTable(t.maps.FailSites, func(tgid uint32, _ fdFdInfo) uint32 { return tgid })
	t.sites = t.stacks.Sites(t.maps.Sites, t.maps.SiteOwners)
	t.view = t.stacks.Join("fd")
	return t, nil
}

// Mode says how the programs are attached: bpfobj.ModeBTF or ModeTracepoint.
func (t *Tracker) Mode() string { return t.obj.Mode }

// BTFError says why tp_btf is not used, or nil.
func (t *Tracker) BTFError() error { return t.obj.BTFError }

// Close detaches and unloads everything; safe to call more than once.
func (t *Tracker) Close() error {
	var errs []error
	if t.view != nil {
		t.view.Leave()
		t.view = nil
	}
	errs = append(errs, t.obj.Close())
	errs = append(errs, t.closeShared())
	return errors.Join(errs...)
}

// closeShared closes the shared maps the tracker made itself.
func (t *Tracker) closeShared() error {
	return errors.Join(t.stacks.Release(), t.member.Close())
}

// Stacks is the stack service the tracker's stacks are in.
func (t *Tracker) Stacks() *stacks.Service { return t.stacks.Service }
