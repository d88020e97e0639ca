// Package schedtrack loads and attaches the scheduler BPF object and reads
// its maps: context switches per thread and per process, split voluntary and
// involuntary as the kernel splits them, and run-queue latency per process.
package schedtrack

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracked"
)

// How the programs attach (see bpfobj).
const (
	ModeBTF        = bpfobj.ModeBTF
	ModeTracepoint = bpfobj.ModeTracepoint
)

// The sched event each program goes on, by mode. The classic
// sched_wakeup_new record cannot be attributed to a process (see
// bpf/sched.bpf.c), so that mode has no program for it.
var modePrograms = map[string]map[string]string{
	ModeBTF:        {"switch_btf": "sched_switch", "wakeup_btf": "sched_wakeup", "wakeup_new_btf": "sched_wakeup_new"},
	ModeTracepoint: {"switch_tp": "sched_switch", "wakeup_tp": "sched_wakeup"},
}

// Config chooses how to attach and where /proc is.
type Config struct {
	ProcRoot string // normally /proc
	// Tracepoint uses the classic tracepoints even where tp_btf works, so
	// that tests and benchmarks cover the fallback on any kernel.
	Tracepoint bool
	// Tracked is the map of tracked processes shared with the other
	// objects; nil: one of the tracker's own, closed with it.
	Tracked *tracked.Set
}

// Tracker owns the loaded scheduler BPF object and its links.
type Tracker struct {
	obj    *bpfobj.Object
	maps   schedMaps
	member *tracked.View
	pids   map[uint32]bool // tracked tgids, from which tracked_bits is computed
	// The threads' counts, by tid, each a tracked process's.
	threads *bpfobj.Table[uint32, schedThreadSched]
}

// New loads the scheduler object and attaches it: tp_btf if this kernel
// loads and attaches it, else the classic tracepoints.
func New(cfg Config) (*Tracker, error) {
	t := &Tracker{pids: map[uint32]bool{}}
	var err error
	if t.member, err = tracked.Join(cfg.Tracked); err != nil {
		return nil, err
	}
	t.obj, err = bpfobj.Open(loadSched, bpfobj.Options{What: "sched BPF programs", Maps: &t.maps, Tracepoint: cfg.Tracepoint,
		Tracked: t.member, PerProcess: []string{schedMapProcCounts}})
	if err != nil {
		_ = t.member.Close()
		return nil, err
	}
	t.threads = bpfobj.NewTable(t.maps.ThreadCounts, func(_ uint32, th schedThreadSched) uint32 { return th.Tgid })
	return t, nil
}

// Mode says how the programs are attached: ModeBTF or ModeTracepoint.
func (t *Tracker) Mode() string { return t.obj.Mode }

// BTFError says why tp_btf is not used, or nil.
func (t *Tracker) BTFError() error { return t.obj.BTFError }

// Events returns the sched events the attached programs trace.
func (t *Tracker) Events() []string {
	return slices.Sorted(maps.Values(modePrograms[t.obj.Mode]))
}

// Close detaches and unloads everything; safe to call more than once.
func (t *Tracker) Close() error {
	return errors.Join(t.obj.Close(), t.member.Close())
}

// Track starts counting pid: its counters first (the BPF side only updates
// existing ones), then the filter.
func (t *Tracker) Track(pid int) error {
	tgid := uint32(pid)
	if err := t.threads.Claim(tgid, t.tracked); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	zero := make([]schedProcSched, ebpf.MustPossibleCPU())
	if err := t.maps.ProcCounts.Update(tgid, zero, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if err := t.member.Track(tgid, 0, 0); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	t.pids[tgid] = true
	if err := t.updateBits(tgid); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	return nil
}

// trackedBits is the size of the kernel's tracked_bits prefilter.
const trackedBits = 1 << 18

// updateBits rewrites the prefilter word that holds tgid's bit from the
// tracked set: other tracked tgids may share the bit.
func (t *Tracker) updateBits(tgid uint32) error {
	word := tgid / 64 % (trackedBits / 64)
	var w uint64
	for p := range t.pids {
		if p/64%(trackedBits/64) == word {
			w |= 1 << (p % 64)
		}
	}
	return t.maps.TrackedBits.Update(word, w, ebpf.UpdateAny)
}

// tracked reports whether tgid is tracked: a read of the thread table drops
// the threads of the others.
func (t *Tracker) tracked(tgid uint32) bool { return t.pids[tgid] }

// Untrack stops counting pid and drops its kernel state, the threads first
// seen since the last poll at the next (see bpfobj.Table).
func (t *Tracker) Untrack(pid int) {
	tgid := uint32(pid)
	delete(t.pids, tgid)
	_ = t.updateBits(tgid)
	t.member.Untrack(tgid, 0)
	_ = t.maps.ProcCounts.Delete(tgid)
	t.threads.Forget(tgid)
}

// Forget drops the entry of one thread, for a thread that is gone without
// the final switch that drops it in the kernel (the thread that execs in a
// multi-threaded process takes the leader's tid).
func (t *Tracker) Forget(tid int) {
	_ = t.maps.ThreadCounts.Delete(uint32(tid))
}

// Thread is one thread's switch-outs since tracking began.
type Thread struct {
	TID         int
	Voluntary   uint64
	Involuntary uint64
}

// Sample is what the kernel counted for one process since tracking began.
type Sample struct {
	Voluntary   uint64
	Involuntary uint64
	Threads     []Thread // live threads that have switched, by tid
	RunqSlots   [len(schedProcSched{}.RunqSlots)]uint64
	RunqSumNs   uint64
}

// Poll returns a sample for each tracked pid in pids.
func (t *Tracker) Poll(pids []int) (map[int]*Sample, error) {
	out := make(map[int]*Sample, len(pids))
	for _, pid := range pids {
		var per []schedProcSched
		if err := t.maps.ProcCounts.Lookup(uint32(pid), &per); err != nil {
			return nil, fmt.Errorf("reading sched counters of pid %d: %w", pid, err)
		}
		s := &Sample{}
		for _, c := range per {
			s.Voluntary += c.Voluntary
			s.Involuntary += c.Involuntary
			s.RunqSumNs += c.RunqSumNs
			for i, n := range c.RunqSlots {
				s.RunqSlots[i] += n
			}
		}
		out[pid] = s
	}
	threads, err := t.threads.Read(t.tracked)
	if err != nil {
		return nil, fmt.Errorf("reading sched thread table: %w", err)
	}
	for pid, s := range out {
		for _, e := range threads[uint32(pid)] {
			// A thread woken but not yet switched out has an entry and no counts.
			if th := e.Val; th.Voluntary+th.Involuntary > 0 {
				s.Threads = append(s.Threads, Thread{TID: int(e.Key), Voluntary: th.Voluntary, Involuntary: th.Involuntary})
			}
		}
	}
	for _, s := range out {
		slices.SortFunc(s.Threads, func(a, b Thread) int { return a.TID - b.TID })
	}
	return out, nil
}

// firstSlot is the kernel slot whose upper bound is the first histogram
// bound: slots below it (waits under about a microsecond) are merged into
// it, as nothing useful is told apart there.
const firstSlot = 9

// slotUnitExp: the kernel slots waits in units of 2^slotUnitExp seconds
// (bpf/sched.bpf.c, RUNQ_UNIT_*).
const slotUnitExp = -30

// Histogram turns the kernel's log2 slots (slot i: waits of [2^i, 2^(i+1))
// units of 2^-30 s) into a model histogram whose bounds are powers of two
// of a second, from 2^-20 s (~0.95 µs) to 2 s. The last slot has no upper
// bound, so it counts in Count and Sum only.
func (s *Sample) Histogram() model.Histogram {
	last := len(s.RunqSlots) - 1
	h := model.Histogram{Sum: float64(s.RunqSumNs) / 1e9}
	for i := firstSlot; i < last; i++ {
		h.Bounds = append(h.Bounds, math.Ldexp(1, i+1+slotUnitExp))
		h.Counts = append(h.Counts, s.RunqSlots[i])
	}
	for i := range firstSlot {
		h.Counts[0] += s.RunqSlots[i]
	}
	for _, n := range s.RunqSlots {
		h.Count += n
	}
	return h
}

// errorNames follows enum err_kind in bpf/common.h; the object uses these.
var errorNames = map[schedErrKind]string{
	schedErrKindERR_TABLE_FULL: "sched_table_full",
	schedErrKindERR_COUNTERS:   "sched_counters",
}

// Memory is the kernel memory of the object's maps and programs now.
func (t *Tracker) Memory() uint64 { return t.obj.Memory() }

// Lost returns the BPF error counters (monotonic since load), by source name.
func (t *Tracker) Lost() (map[string]uint64, error) {
	out, err := bpfobj.Counters(t.maps.Errors, errorNames)
	if err != nil {
		return nil, fmt.Errorf("reading sched error counters: %w", err)
	}
	// A program the kernel skips because a BPF program already runs on that
	// CPU (a wake-up from an interrupt during another) loses its event.
	var misses uint64
	for _, p := range t.obj.Programs() {
		if st, err := p.Stats(); err == nil {
			misses += st.RecursionMisses
		}
	}
	out["sched_recursion_misses"] = misses
	return out, nil
}
