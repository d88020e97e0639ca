// Package offcpu says where the threads of a few suspected processes are:
// the user stack, Python frames included, each thread last left the CPU
// at (bpf/offcpu.bpf.c). A detector that suspects a process (a straggling
// NCCL rank) names it with Watch; the object is loaded at the first such
// name, not before, and only the named processes' switches take a stack.
//
// The stacks are the stack service's (pkg/stacks): unwound with the same
// rules, symbolized the same way, and swept with the other views'.
package offcpu

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
)

// NoRegisters is why there are no stacks on a kernel without
// bpf_task_pt_regs.
const NoRegisters = "the kernel does not give a switching thread's user registers (bpf_task_pt_regs, Linux 5.15)"

// Config says where the processes are and whose stack service to use.
type Config struct {
	ProcRoot string // normally /proc
	// Stacks is the service the stacks are kept in; nil: one of the
	// tracer's own.
	Stacks     *stacks.Service
	Symbolizer *symbolize.Symbolizer
	// Tracepoint uses the classic sched_switch tracepoint even where
	// tp_btf works (tests).
	Tracepoint bool
}

// Thread is where one thread was when it last left the CPU.
type Thread struct {
	TID   int
	At    time.Time     // when
	Stack []model.Frame // innermost first; nil when it could not be taken
}

// Tracer owns the loaded object. Not safe for concurrent use.
type Tracer struct {
	obj     *bpfobj.Object
	maps    offcpuMaps
	stacks  stacks.Handle
	view    *stacks.View
	regs    bool         // the kernel gives the user registers
	watched map[int]bool // the processes in offcpu_procs
	polls   int
}

// New loads and attaches the object, with no process named.
func New(cfg Config) (*Tracer, error) {
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	proc, err := procinfo.New(cfg.ProcRoot)
	if err != nil {
		return nil, err
	}
	t := &Tracer{watched: map[int]bool{}, regs: bpfobj.Probe().TaskPtRegs}
	if t.stacks, err = stacks.Hold(cfg.Stacks, proc, cfg.Symbolizer, cfg.ProcRoot); err != nil {
		return nil, err
	}
	t.obj, err = bpfobj.Open(loadOffcpu, bpfobj.Options{What: "off-CPU BPF programs", Maps: &t.maps, Tracepoint: cfg.Tracepoint,
		Tune: t.stacks.Prepare, Replace: t.stacks.Replacements()})
	if err != nil {
		_ = t.stacks.Release()
		return nil, err
	}
	t.view = t.stacks.Join("offcpu")
	return t, nil
}

// Unavailable says why the threads' stacks cannot be taken here; "" when
// they can.
func (t *Tracer) Unavailable() string {
	if !t.regs {
		return NoRegisters
	}
	return ""
}

// Watch makes pids the processes whose threads' stacks are taken, from
// now on; it is called every poll (it takes part in the stack service's
// sweeps), with none when nothing is suspected.
func (t *Tracer) Watch(now time.Time, pids []int) error {
	want := map[int]bool{}
	for _, pid := range pids {
		want[pid] = true
	}
	var errs []error
	for pid := range t.watched {
		if !want[pid] {
			key := uint32(pid)
			if err := t.maps.OffcpuProcs.Delete(&key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
			}
			t.view.Untrack(pid)
			delete(t.watched, pid)
		}
	}
	for pid := range want {
		// The interpreter may have come since the last poll.
		t.stacks.Refresh(pid, now)
		if t.watched[pid] {
			continue
		}
		t.view.Track(pid)
		key, one := uint32(pid), uint8(1)
		if err := t.maps.OffcpuProcs.Put(&key, &one); err != nil {
			errs = append(errs, fmt.Errorf("watching %d: %w", pid, err))
			t.view.Untrack(pid)
			continue
		}
		t.watched[pid] = true
	}
	if t.polls++; t.polls%bpfobj.StackGCEvery == 0 {
		keep := map[uint32]bool{}
		for _, th := range t.entries() {
			if th.StackId >= 0 {
				keep[uint32(th.StackId)] = true
				keep[uint32(t.stacks.Canonical(th.StackId))] = true
			}
		}
		t.view.Sweep(keep)
	}
	return errors.Join(errs...)
}

// entries reads the threads' latest stacks, by tid.
func (t *Tracer) entries() map[uint32]offcpuOffcpuThread {
	out := map[uint32]offcpuOffcpuThread{}
	var tid uint32
	var th offcpuOffcpuThread
	it := t.maps.OffcpuThreads.Iterate()
	for it.Next(&tid, &th) {
		out[tid] = th
	}
	if err := it.Err(); err != nil {
		slog.Debug("reading the off-CPU stacks", "err", err)
	}
	return out
}

// Threads returns where pid's threads were when they last left the CPU
// since it was watched, by tid; nil when none has yet.
func (t *Tracer) Threads(pid int) map[int]Thread {
	var out map[int]Thread
	nowK, now := bpfobj.KtimeNow(), time.Now()
	for tid, th := range t.entries() {
		if int(th.Tgid) != pid {
			continue
		}
		if out == nil {
			out = map[int]Thread{}
		}
		at := now.Add(-time.Duration(nowK - min(th.At, nowK)))
		var frames []model.Frame
		if th.StackId >= 0 {
			frames = t.stacks.Frames(pid, stacks.Site{Stack: t.stacks.Canonical(th.StackId), Py: th.PyStack})
		}
		out[int(tid)] = Thread{TID: int(tid), At: at, Stack: frames}
	}
	return out
}

// errorNames follows enum err_kind in bpf/common.h; the object and the
// unwinder it carries use these.
var errorNames = map[offcpuErrKind]string{
	offcpuErrKindERR_TABLE_FULL: "offcpu_table_full",
	offcpuErrKindERR_STACK:      "offcpu_stack",
	offcpuErrKindERR_READ_USER:  "offcpu_read_user",
	offcpuErrKindERR_RINGBUF:    "offcpu_ringbuf",
}

// Lost returns the object's loss counters (monotonic since load), by
// source name.
func (t *Tracer) Lost() (map[string]uint64, error) {
	out, err := bpfobj.Counters(t.maps.Errors, errorNames)
	if err != nil {
		return nil, fmt.Errorf("reading off-CPU error counters: %w", err)
	}
	return out, nil
}

// Close detaches and unloads the object.
func (t *Tracer) Close() error {
	for _, pid := range slices.Collect(maps.Keys(t.watched)) {
		t.view.Untrack(pid)
	}
	t.view.Leave()
	return errors.Join(t.obj.Close(), t.stacks.Release())
}

// Lazy is a Tracer loaded at the first process named: until a detector
// suspects one, nothing is loaded and no switch pays anything. Safe for
// concurrent use (the pipeline's Close may come from another goroutine).
type Lazy struct {
	cfg  Config
	mu   sync.Mutex
	t    *Tracer
	err  error // why it did not load; then it is not tried again
	done bool  // closed
}

// NewLazy returns a tracer that loads with cfg when first needed.
func NewLazy(cfg Config) *Lazy { return &Lazy{cfg: cfg} }

// Watch is Tracer.Watch, loading the tracer at the first pid.
func (l *Lazy) Watch(now time.Time, pids []int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.done {
		return
	}
	if l.t == nil && l.err == nil && len(pids) > 0 {
		began := time.Now()
		l.t, l.err = New(l.cfg)
		if l.err != nil {
			slog.Warn("the off-CPU stacks of suspected processes cannot be taken; their findings say so", "err", l.err)
		} else {
			slog.Debug("off-CPU tracer loaded", "took", time.Since(began))
		}
	}
	if l.t != nil {
		if err := l.t.Watch(now, pids); err != nil {
			slog.Debug("off-CPU watch", "err", err)
		}
	}
}

// Stacks are the stacks of Tracer.Threads, by tid; why says why there are
// none ("" when the tracer takes them: a thread that has not left the CPU
// since pid was named has none yet).
func (l *Lazy) Stacks(pid int) (stacks map[int][]model.Frame, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.err != nil:
		return nil, "the off-CPU tracer did not load: " + l.err.Error()
	case l.t == nil:
		return nil, "the off-CPU tracer is not loaded"
	case l.t.Unavailable() != "":
		return nil, l.t.Unavailable()
	}
	for tid, th := range l.t.Threads(pid) {
		if th.Stack == nil {
			continue
		}
		if stacks == nil {
			stacks = map[int][]model.Frame{}
		}
		stacks[tid] = th.Stack
	}
	return stacks, ""
}

// Lost is Tracer.Lost; none before the tracer is loaded.
func (l *Lazy) Lost() (map[string]uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.t == nil {
		return nil, nil
	}
	return l.t.Lost()
}

// Close unloads the tracer if it was loaded.
func (l *Lazy) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done = true
	if l.t == nil {
		return nil
	}
	err := l.t.Close()
	l.t = nil
	return err
}
