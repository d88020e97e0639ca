// Package pipeline is the loop shared by attach, run and daemon. Every
// interval is a poll in phases: fill (each view reads its BPF maps into
// the watched processes, in the order views.go gives), enrich (NVML's
// figures joined into each process, whatever views are up, and the memory
// snapshots of failed allocations completed with them), detect (the
// detectors, each on the processes the views it needs filled), link (one
// cause, one finding). The pipeline merges the findings and hands a
// snapshot to every sink.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/causes"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/ctxstorm"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/fdleak"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/gpualloc"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/inputbound"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/ncclstall"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/sockleak"
	"github.com/open-autoglm/autoglm-ebpf/pkg/gpunode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/gpuoom"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/nvml"
	"github.com/open-autoglm/autoglm-ebpf/pkg/offcpu"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracked"
)

// Sink receives a snapshot every interval and the final one at the end.
type Sink interface {
	Update(s *model.Snapshot)
	Close(final *model.Snapshot) error
}

// Concern is the kernel side of one view (fd, sched, sock, cuda, nccl): one BPF
// object and the Go code that decodes its maps.
type Concern interface {
	Name() string
	// Track starts watching pid in the kernel; Untrack drops all its state.
	Track(pid int) error
	Untrack(pid int)
	// Fill fills the concern's part of each live process and returns
	// those it filled: the detectors that need the view judge them.
	Fill(now time.Time, procs []*model.Process) ([]*model.Process, error)
	// Lost returns monotonic loss counters by source.
	Lost() (map[string]uint64, error)
	// Memory is the kernel memory its BPF maps and programs take now.
	Memory() uint64
	Close() error
}

// Config holds the knobs of one run.
type Config struct {
	Interval time.Duration
	ProcRoot string
	MaxFDs   uint32
	FDLeak   fdleak.Config
	CtxStorm ctxstorm.Config
	SockLeak sockleak.Config
	GPUAlloc gpualloc.Config
	// InputBound judges whether GPU processes wait on their CPU side.
	InputBound inputbound.Config
	// NCCLStall judges the ranks of each NCCL communicator on this node.
	NCCLStall ncclstall.Config
	// Cache, when set, is the poll's cache of /proc reads, shared with a
	// Source that reads them to choose processes (nil: the pipeline's
	// own).
	Cache *procinfo.PollCache
	// SockProcTables reads TCP sockets from /proc/PID/net/tcp{,6} rather
	// than sock_diag: the agent-cost benchmark's baseline.
	SockProcTables bool
	// MaxAllocs is the capacity of the kernel's live GPU allocation table.
	MaxAllocs uint32
	// Launches hooks CUDA kernel launches too (--launches): off by
	// default, they are too many to hook for nothing.
	Launches bool
	// GPUInterval is how often NVML is sampled.
	GPUInterval time.Duration
	// NVML is the management library to sample (nil: the real one); tests
	// give a mock.
	NVML gonvml.Interface
	// TopSites bounds how many opening stacks per process are symbolized.
	TopSites int
	// FDReadsPerPoll bounds the fds described from /proc per poll, all
	// processes together (0: fdtrack.DefaultReadsPerPoll).
	FDReadsPerPoll int
	// MaxProcesses is the most processes watched at once, which sizes the
	// kernel's maps kept per process (0: tracked.DefaultProcesses); over
	// tracked.Capacity New fails.
	MaxProcesses int
	// Children also watches the descendants of the targets: those forked
	// while their parent is watched are tracked from their fork (the fd
	// view's kernel side), others are found every interval and seeded
	// from /proc.
	Children bool
	// Daemon runs until cancelled, whatever is watched, and forgets a
	// process (its state, its findings) once a snapshot has reported its
	// exit, so that processes coming and going do not grow memory.
	Daemon bool
	// Source, if set, is asked for new processes to watch at each poll.
	Source Source
	// Pod, if set, says where a process runs in Kubernetes. It is asked
	// when a process is watched (known is zero), and again at each poll,
	// given what it said last, while the pod's name or the container's is
	// missing: the API server may answer later, and the kubelet reports a
	// container's id in the pod's status only after its process started.
	Pod func(pid int, known model.Pod) model.Pod
	// OOMProfile, if set, names where the pprof profile of a memory
	// snapshot taken at a failed allocation of pid at the instant at is
	// served or written (model.GPUMemorySnapshot.Profile): the daemon's
	// URL path, or the file --pprof writes.
	OOMProfile func(pid int, at time.Time) string

	// views, in tests, replaces the registered views (a view that
	// refuses every process, one that does not load).
	views func([]view) []view
}

// Source finds processes to watch (the daemon's discovery).
type Source interface {
	// Discover watches new processes with p.Watch; called at each poll.
	Discover(p *Pipeline)
	// Lost returns the source's monotonic loss counters by source name.
	Lost() (map[string]uint64, error)
}

// DefaultConfig is what the CLI starts from.
func DefaultConfig() Config {
	return Config{Interval: time.Second, ProcRoot: "/proc", MaxFDs: 1 << 16, FDLeak: fdleak.DefaultConfig(), CtxStorm: ctxstorm.DefaultConfig(), SockLeak: sockleak.DefaultConfig(),
		GPUAlloc: gpualloc.DefaultConfig(), InputBound: inputbound.DefaultConfig(), NCCLStall: ncclstall.DefaultConfig(), MaxAllocs: 1 << 18, GPUInterval: nvml.DefaultInterval, TopSites: 64}
}

// Pipeline owns the concerns and the per-process state.
type Pipeline struct {
	cfg      Config
	concerns []ranked // loaded, in poll order
	arrivals chan arrival
	pending  int  // concerns still loading
	closed   bool // Close was called: concerns that load now are closed at once
	proc     procinfo.FS
	sym      *symbolize.Symbolizer
	stacks   *stacks.Service     // the call stacks of every view
	tracked  *tracked.Set        // the processes each view tracks
	cache    *procinfo.PollCache // one read of /proc/PID/maps and fd per process per poll
	sinks    []Sink
	gpu      *nvml.Sampler
	stopGPU  context.CancelFunc
	// oom completes the memory snapshots taken at failed allocations
	// once NVML's figures are joined.
	oom *gpuoom.Stage

	start   time.Time
	targets []int
	procs   map[int]*model.Process
	starts  map[int]uint64 // start time of each watched pid, to notice reuse
	// identified: watched during this poll, so its stat was just read
	identified map[int]bool
	// forked: children the fd view tracks from their fork, not watched
	// yet, offered to the Source and to Children this poll.
	forked   []int
	order    []int // pids in the order they were added
	findings []model.Finding
	judges   []judge // the per-process detectors
	across   []acrossJudge
	// offcpu takes the stacks of suspected NCCL stragglers' threads,
	// loaded at the first suspect.
	offcpu   *offcpu.Lazy
	link     *causes.Linker
	bound    *inputbound.Detector // across processes: a GPU process and its workers
	required []string             // the views the tool cannot run without

	// Views that could not follow a process (a namespace they cannot
	// enter, a file they cannot read) leave it to the others: by concern,
	// the pids it does not track. Counted by view and reason, logged once
	// per view and reason.
	untracked     map[string]map[int]bool
	trackFailures map[model.TrackFailure]uint64

	// status: how each view stands, for the health series and readiness.
	status map[string]model.ViewState
	// devices: the node's GPUs, which say whether a GPU view that does
	// not run is down or absent.
	devices gpunode.Devices
	// memory: the kernel memory of each view's BPF objects, read every
	// memoryEvery snapshots (each map and program is a syscall and an
	// fdinfo read).
	memory    map[string]uint64
	snapshots int
}

// memoryEvery is how many snapshots apart the BPF objects' memory is read:
// maps without preallocation grow with the watched processes, slowly.
const memoryEvery = 10

// New starts loading every concern's BPF side, all at once: each concern is
// adopted as soon as it is loaded, so the slowest does not hold up the
// others. New returns once the fd concern, the one the tool cannot do
// without, is loaded; Ready waits for the rest. Close must be called to
// unload everything.
func New(cfg Config, sinks ...Sink) (*Pipeline, error) {
	proc, err := procinfo.New(cfg.ProcRoot)
	if err != nil {
		return nil, err
	}
	cache := cfg.Cache
	if cache == nil {
		cache = procinfo.NewPollCache()
	}
	p := &Pipeline{
		cfg:        cfg,
		proc:       proc,
		sym:        symbolize.New(cfg.ProcRoot).ShareMaps(proc.WithPollCache(cache)),
		sinks:      sinks,
		start:      time.Now(),
		procs:      map[int]*model.Process{},
		identified: map[int]bool{},
		starts:     map[int]uint64{},
		cache:      cache,
		link:       causes.New(causes.DefaultGrace),
		bound:      inputbound.New(cfg.InputBound),

		untracked:     map[string]map[int]bool{},
		trackFailures: map[model.TrackFailure]uint64{},
		status:        map[string]model.ViewState{},
		devices:       gpunode.Find(cfg.ProcRoot),
	}
	for _, v := range model.Views {
		p.status[v] = model.ViewState{Down: "loading"}
	}
	// Made before the views that share them: the processes tracked, and
	// the stack service the fd view cannot do without.
	if p.tracked, err = tracked.New(cfg.MaxProcesses); err != nil {
		// The tool's first bpf() call: EPERM here is this process's lack
		// (its capabilities, or a seccomp filter), not a map too large;
		// cilium/ebpf's own hint names RLIMIT_MEMLOCK.
		if errors.Is(err, unix.EPERM) {
			err = fmt.Errorf("%w (%s)", err, bpfobj.EPERMCause())
		}
		return nil, err
	}
	if p.stacks, err = stacks.New(stacks.Config{Proc: proc.WithPollCache(cache), Symbolizer: p.sym, Processes: p.tracked.Entries()}); err != nil {
		p.tracked.Close()
		return nil, err
	}
	p.offcpu = offcpu.NewLazy(offcpu.Config{ProcRoot: cfg.ProcRoot, Stacks: p.stacks, Symbolizer: p.sym})
	if p.across, err = p.registeredAcross(); err != nil {
		p.stacks.Close()
		p.tracked.Close()
		return nil, err
	}

	// NVML is optional: without a driver the sampler reports one clear
	// error and the GPU join is skipped.
	ctx, cancel := context.WithCancel(context.Background())
	// Without a GPU device node in the agent's /dev NVML can reach no GPU:
	// libnvidia-ml is not even loaded, as its zeroed data alone take
	// ~12 MiB of memory once initialised.
	lib := cfg.NVML
	if lib == nil && len(p.devices.Agent) > 0 {
		lib = gonvml.New()
	}
	p.gpu, p.stopGPU = nvml.New(lib), cancel
	err = p.gpu.Start(ctx, cfg.GPUInterval)
	p.status["nvml"] = p.stateOf("nvml", err)
	if err != nil {
		logDown("nvml", p.status["nvml"], err)
	}

	p.oom = gpuoom.New(gpuoom.Config{NVML: p.gpu, Proc: proc, Pod: cfg.Pod, Profile: cfg.OOMProfile})
	p.judges = p.registered()

	// Views not required are optional: a kernel that cannot host one
	// loses that view, not the whole tool.
	loaders := p.views()
	if cfg.views != nil {
		loaders = cfg.views(loaders)
	}
	p.arrivals = make(chan arrival, len(loaders))
	p.pending = len(loaders)
	for rank, v := range loaders {
		if v.required {
			p.required = append(p.required, v.name)
		}
		go func() {
			began := time.Now()
			c, err := v.load()
			slog.Debug("concern loaded", "concern", v.name, "took", time.Since(began), "err", err)
			p.arrivals <- arrival{view: v, rank: rank, c: c, err: err}
		}()
	}
	for slices.ContainsFunc(p.required, func(name string) bool { return !p.has(name) }) {
		if err := p.adopt(<-p.arrivals); err != nil {
			p.Close()
			return nil, err
		}
	}
	return p, nil
}

// stateOf returns the state of a view that started with err (nil: up). One
// that does not run where it is not expected (gpunode) is absent.
func (p *Pipeline) stateOf(view string, err error) model.ViewState {
	if err == nil {
		return model.ViewState{}
	}
	return model.ViewState{Down: err.Error(), Absent: p.devices.Absence(view, err)}
}

// logDown says, once at start, why a view does not run: at info level when
// it is absent, which is no fault.
func logDown(view string, st model.ViewState, err error) {
	if st.Absent != "" {
		slog.Info("concern absent: not expected on this node; continuing without it (autoglm_view_absent)",
			"concern", view, "reason", st.Absent, "why", st.Absent.Meaning(), "err", err)
		return
	}
	slog.Warn("concern unavailable on this machine; continuing without it (autoglm_view_up 0)", "concern", view, "err", err)
}

// arrival is the outcome of loading one view's concern.
type arrival struct {
	view view
	rank int // position in the poll order
	c    Concern
	err  error
}

func (p *Pipeline) has(name string) bool {
	return slices.ContainsFunc(p.concerns, func(c ranked) bool { return c.Name() == name })
}

// adopt takes a loaded concern into the poll order and starts tracking the
// live watched processes in it. Only a required view's failure is an error.
func (p *Pipeline) adopt(a arrival) error {
	if p.pending--; p.pending == 0 {
		// Loading parsed the kernel's BTF and every object (~20 MB of heap
		// at once), all garbage now. The runtime would hand those pages
		// back over minutes; the tool runs beside the workload, so now.
		defer debug.FreeOSMemory()
	}
	name := a.view.name
	st := p.stateOf(name, a.err)
	p.status[name] = st
	for _, c := range a.view.carries {
		p.status[c] = st
		if st.Down != "" {
			p.status[c] = model.ViewState{Down: fmt.Sprintf("the %s view is down", name), Absent: st.Absent}
		}
	}
	if a.err != nil {
		if a.view.required {
			return a.err
		}
		logDown(name, st, a.err)
		return nil
	}
	if p.closed {
		_ = a.c.Close()
		return nil
	}
	for _, pid := range p.order {
		if p.procs[pid].Exited {
			continue
		}
		// The process may have exited since it was watched: the next poll
		// notices that.
		if err := a.c.Track(pid); err != nil {
			p.trackFailed(a.c, pid, err)
		}
	}
	i, _ := slices.BinarySearchFunc(p.concerns, a.rank, func(c ranked, r int) int { return c.rank - r })
	p.concerns = slices.Insert(p.concerns, i, ranked{a.c, a.rank})
	return nil
}

// adoptArrived adopts the concerns loaded since the last call, without waiting.
func (p *Pipeline) adoptArrived() {
	for p.pending > 0 {
		select {
		case a := <-p.arrivals:
			_ = p.adopt(a)
		default:
			return
		}
	}
}

// Ready waits until every concern has loaded (or failed to) and tracks the
// watched processes in each: `run` calls it before letting its command go,
// so that nothing the command does is missed.
func (p *Pipeline) Ready() {
	for p.pending > 0 {
		_ = p.adopt(<-p.arrivals)
	}
}

// ranked is a loaded concern and its place in the poll order.
type ranked struct {
	Concern
	rank int
}

// Watch starts tracking pid as a target. It fails with a clear error for a
// pid that does not exist or is a kernel thread.
func (p *Pipeline) Watch(pid int) error {
	if p.Watching(pid) {
		return nil
	}
	if err := p.watch(pid); err != nil {
		return err
	}
	p.targets = append(p.targets, pid)
	return nil
}

func (p *Pipeline) watch(pid int) error {
	p.adoptArrived()
	id, err := p.proc.Identify(pid)
	if err != nil {
		return err
	}
	comm, start := id.Comm, id.Start
	for i, c := range p.concerns {
		err := c.Track(pid)
		if err == nil {
			continue
		}
		if !slices.Contains(p.required, c.Name()) {
			p.trackFailed(c, pid, err)
			continue
		}
		// Leave no half-tracked process behind in the kernel, in the
		// failing concern either (Untrack tolerates missing state).
		for _, d := range p.concerns[:i+1] {
			d.Untrack(pid)
		}
		p.forgetUntracked(pid)
		return fmt.Errorf("%s: %w", c.Name(), err)
	}
	pr := &model.Process{PID: pid, PPID: id.PPID, Comm: comm, Started: time.Now()}
	if p.cfg.Pod != nil {
		pr.Pod = p.cfg.Pod(pid, model.Pod{})
	}
	p.procs[pid] = pr
	p.starts[pid] = start
	p.identified[pid] = true
	p.order = append(p.order, pid)
	return nil
}

// Run polls until ctx is done or every watched process has exited, then
// gives the final snapshot to the sinks and returns it.
func (p *Pipeline) Run(ctx context.Context) (*model.Snapshot, error) {
	tick := time.NewTicker(p.cfg.Interval)
	defer tick.Stop()
	var runErr error
	for {
		snap, err := p.poll(time.Now())
		if err != nil {
			runErr = err
			break
		}
		for _, s := range p.sinks {
			s.Update(snap)
		}
		if (!p.cfg.Daemon && p.allExited()) || !p.wait(ctx, tick.C) {
			break
		}
	}
	final := p.snapshot(time.Now())
	for _, s := range p.sinks {
		if err := s.Close(final); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	return final, runErr
}

// wait adopts concerns as they load until the next tick (true) or the end
// of ctx (false).
func (p *Pipeline) wait(ctx context.Context, tick <-chan time.Time) bool {
	for {
		arrivals := p.arrivals
		if p.pending == 0 {
			arrivals = nil
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick:
			return true
		case a := <-arrivals:
			_ = p.adopt(a)
		}
	}
}

func (p *Pipeline) allExited() bool {
	for _, pr := range p.procs {
		if !pr.Exited {
			return false
		}
	}
	return true
}

func (p *Pipeline) poll(now time.Time) (*model.Snapshot, error) {
	p.cache.Next()
	clear(p.identified)
	// NVML's figures for this interval: what its samples since the last
	// poll did (the join and the snapshot read them).
	p.gpu.Roll()
	p.adoptArrived()
	if p.cfg.Daemon {
		p.forgetExited()
	}
	p.forked = nil
	if fd, ok := p.fd(); ok {
		p.forked = fd.Forked()
	}
	if p.cfg.Source != nil {
		p.cfg.Source.Discover(p)
	}
	if p.cfg.Children {
		p.adoptChildren()
	}
	// A process found dead this interval is observed once more: the kernel
	// still holds what it did since the last poll (a failed allocation just
	// before it crashed, say). Then its kernel state is dropped and its last
	// observation kept.
	var observe, exiting []*model.Process
	for _, pid := range p.order {
		pr := p.procs[pid]
		if pr.Exited {
			continue
		}
		if p.identified[pid] {
			// Watched this poll, from a stat read a moment ago.
		} else if id, ok := p.alive(pid); !ok {
			exiting = append(exiting, pr)
		} else {
			// comm changes at exec (run starts the command through a shell).
			pr.Comm = id.Comm
		}
		if p.cfg.Pod != nil && pr.Pod.UID != "" && (pr.Pod.Name == "" || pr.Pod.Container == "" && pr.Pod.ContainerID != "") {
			pr.Pod = p.cfg.Pod(pid, pr.Pod)
		}
		observe = append(observe, pr)
	}
	fresh, err := p.judge(now, observe)
	if err != nil {
		return nil, err
	}
	// One cause, one finding: an fd leak made of CLOSE_WAIT sockets is
	// the socket leak's.
	for _, f := range p.link.Link(now, observe, fresh, p.findings) {
		p.record(f, now, f.Active)
	}
	for _, pr := range exiting {
		pr.Exited = true
		for _, c := range p.concerns {
			c.Untrack(pr.PID)
		}
		for _, j := range p.judges {
			j.det.Forget(pr.PID)
		}
		for _, j := range p.across {
			j.det.Forget(pr.PID)
		}
		p.oom.Forget(pr.PID)
		p.forgetUntracked(pr.PID)
		p.sym.Forget(pr.PID)
		for _, f := range p.findings {
			if f.PID == pr.PID && f.Active {
				p.record(f, now, false)
			}
		}
		slog.Debug("target exited", "pid", pr.PID)
	}
	return p.snapshot(now), nil
}

// forgetExited drops the processes whose exit the last snapshot reported,
// with their findings (daemon mode).
func (p *Pipeline) forgetExited() {
	gone := map[int]bool{}
	p.order = slices.DeleteFunc(p.order, func(pid int) bool {
		if !p.procs[pid].Exited {
			return false
		}
		gone[pid] = true
		delete(p.procs, pid)
		delete(p.starts, pid)
		return true
	})
	if len(gone) == 0 {
		return
	}
	p.targets = slices.DeleteFunc(p.targets, func(pid int) bool { return gone[pid] })
	p.findings = slices.DeleteFunc(p.findings, func(f model.Finding) bool { return gone[f.PID] && !f.Active })
}

// Watching reports whether pid is watched and alive as far as the last poll
// knows.
func (p *Pipeline) Watching(pid int) bool {
	pr := p.procs[pid]
	return pr != nil && !pr.Exited
}

// Live is the number of watched processes that have not exited.
func (p *Pipeline) Live() int {
	n := 0
	for _, pr := range p.procs {
		if !pr.Exited {
			n++
		}
	}
	return n
}

// alive reports whether the process watched as pid still runs, with its
// identity now, from one read of its stat: a pid that died and was reused
// by another process within one interval is not it.
func (p *Pipeline) alive(pid int) (procinfo.Identity, bool) {
	id, err := p.proc.Identify(pid)
	return id, err == nil && id.Start == p.starts[pid] && id.Running
}

// Forked returns the children that the kernel tracks from their fork from a
// watched process and that are not watched yet: watched this poll, they
// start from what their parent's table says, not from /proc; left, they are
// let go at the next.
func (p *Pipeline) Forked() []int { return p.forked }

// fdView is the fd concern's side the pipeline asks of it alone.
type fdView interface {
	Forked() []int
	Reads() model.FDReads
}

// fd returns the fd concern, once loaded.
func (p *Pipeline) fd() (fdView, bool) {
	for _, c := range p.concerns {
		if v, ok := c.Concern.(fdView); ok {
			return v, true
		}
	}
	return nil, false
}

// adoptChildren starts watching descendants of the live watched processes
// that are not watched yet: those the kernel marked at their fork, then
// those a walk of /proc finds (started before their parent was watched).
func (p *Pipeline) adoptChildren() {
	for _, pid := range p.forked {
		if _, ok := p.procs[pid]; ok {
			continue
		}
		if err := p.watch(pid); err != nil {
			slog.Debug("child not watched", "pid", pid, "err", err)
		}
	}
	var roots []int
	for _, pid := range p.order {
		if !p.procs[pid].Exited {
			roots = append(roots, pid)
		}
	}
	kids, err := p.proc.Descendants(roots)
	if err != nil {
		slog.Warn("listing child processes", "err", err)
		return
	}
	for _, pid := range kids {
		if _, ok := p.procs[pid]; ok {
			continue
		}
		// A child may exit between the listing and here; that is no error.
		if err := p.watch(pid); err != nil {
			slog.Debug("child not watched", "pid", pid, "err", err)
			continue
		}
		slog.Debug("watching child", "pid", pid)
	}
}

// record merges a detector verdict into the run's findings, keyed by kind,
// pid and first sighting.
func (p *Pipeline) record(f model.Finding, now time.Time, active bool) {
	f.Active = active
	if !active {
		f.LastSeen = now
	}
	for i := range p.findings {
		g := &p.findings[i]
		if g.Kind == f.Kind && g.PID == f.PID && g.FirstSeen.Equal(f.FirstSeen) {
			*g = f
			return
		}
	}
	p.findings = append(p.findings, f)
}

// trackFailed records that concern c could not track pid and drops what c
// set up for it: the process is left to the other views.
func (p *Pipeline) trackFailed(c Concern, pid int, err error) {
	c.Untrack(pid)
	name := c.Name()
	for _, j := range p.judges {
		if j.need == name {
			j.det.Forget(pid)
		}
	}
	key := model.TrackFailure{View: name, Reason: failureReason(err)}
	if p.trackFailures[key] == 0 {
		slog.Warn("a view cannot follow a process; the other views go on watching it (logged once per view and reason)",
			"view", name, "reason", key.Reason, "pid", pid, "err", err)
	}
	p.trackFailures[key]++
	if p.untracked[name] == nil {
		p.untracked[name] = map[int]bool{}
	}
	p.untracked[name][pid] = true
}

func (p *Pipeline) forgetUntracked(pid int) {
	for _, pids := range p.untracked {
		delete(pids, pid)
	}
}

// failureReason names the cause of a failed Track with bounded
// cardinality: the errno's name (EPERM, ENOENT, ...), else "other".
func failureReason(err error) string {
	var errno unix.Errno
	if errors.As(err, &errno) {
		if name := unix.ErrnoName(errno); name != "" {
			return name
		}
	}
	return "other"
}

func (p *Pipeline) snapshot(now time.Time) *model.Snapshot {
	s := &model.Snapshot{Time: now, Start: p.start, Targets: p.targets, Findings: slices.Clone(p.findings), Lost: map[string]uint64{},
		TrackFailures: maps.Clone(p.trackFailures), Views: maps.Clone(p.status)}
	if p.snapshots++; p.snapshots%memoryEvery == 1 || !p.memoryOfAll() {
		p.memory = make(map[string]uint64, len(p.concerns)+1)
		for _, c := range p.concerns {
			p.memory[c.Name()] = c.Memory()
		}
		if p.stacks != nil {
			// The maps the fd and cuda objects share, counted once.
			p.memory["stacks"] = p.stacks.Memory()
		}
		if p.tracked != nil {
			// The processes every view tracks, one map.
			p.memory["tracked"] = p.tracked.Memory()
		}
	}
	s.BPFMemory = maps.Clone(p.memory)
	if fd, ok := p.fd(); ok {
		s.FDReads = fd.Reads()
	}
	for _, pid := range p.order {
		pr := *p.procs[pid]
		s.Processes = append(s.Processes, &pr)
	}
	s.GPUs = p.gpu.GPUs()
	if xids := p.gpu.XIDCounts(); len(xids) > 0 {
		s.GPUXIDs = xids
	}
	if events := p.gpu.EventCounts(); len(events) > 0 {
		s.GPUEventCounts = events
	}
	for _, c := range p.concerns {
		lost, err := c.Lost()
		if err != nil {
			slog.Warn("reading BPF error counters", "concern", c.Name(), "err", err)
			continue
		}
		maps.Copy(s.Lost, lost)
	}
	if p.offcpu != nil {
		if lost, err := p.offcpu.Lost(); err != nil {
			slog.Warn("reading BPF error counters", "concern", "offcpu", "err", err)
		} else {
			maps.Copy(s.Lost, lost)
		}
	}
	if p.stacks != nil {
		if lost, err := p.stacks.Lost(); err != nil {
			slog.Warn("reading the stack service's counters", "err", err)
		} else {
			maps.Copy(s.Lost, lost)
		}
		s.Refused = p.stacks.Refused()
	}
	if p.cfg.Source != nil {
		if lost, err := p.cfg.Source.Lost(); err == nil {
			maps.Copy(s.Lost, lost)
		}
	}
	return s
}

// memoryOfAll reports whether p.memory has every loaded concern's.
func (p *Pipeline) memoryOfAll() bool {
	for _, c := range p.concerns {
		if _, ok := p.memory[c.Name()]; !ok {
			return false
		}
	}
	return true
}

// Close unloads every concern's BPF programs and maps and stops NVML. The
// concerns are closed side by side: detaching waits for the kernel to be
// done with each program, and those waits need not add up.
func (p *Pipeline) Close() error {
	if p.stopGPU != nil {
		p.stopGPU()
		p.gpu.Wait()
		p.stopGPU = nil
	}
	p.closed = true
	p.Ready() // closes what is still loading as it arrives
	errs := make([]error, len(p.concerns))
	var wg sync.WaitGroup
	for i, c := range p.concerns {
		wg.Go(func() {
			if err := c.Close(); err != nil {
				errs[i] = fmt.Errorf("unloading %s BPF: %w", c.Name(), err)
			}
		})
	}
	wg.Wait()
	p.concerns = nil
	if p.offcpu != nil {
		errs = append(errs, p.offcpu.Close())
	}
	if p.stacks != nil {
		// After the objects that use its maps.
		errs = append(errs, p.stacks.Close())
		p.stacks = nil
	}
	if p.tracked != nil {
		errs = append(errs, p.tracked.Close())
		p.tracked = nil
	}
	return errors.Join(errs...)
}
