// Package inputbound tells, for each process that uses a GPU, whether the
// GPU waits on the CPU side: a GPU kept busy is the compute's bottleneck
// (gpu_bound); a GPU idle most of the time while the process or its worker
// processes wait for a CPU (data loading, tokenization, a DataLoader pool
// starved on a small cpuset) is the input's (input_bound), and the two call
// for opposite fixes. Only the second is a finding, once it holds over a
// whole window, naming the processes the GPU waited on.
//
// It joins what the tool already measures: per-process SM utilization from
// NVML (model.CUDAStats.GPUUtil) and, for the process and its children
// (model.Process.PPID: watch them with --children), the run-queue latency
// of each interval from the scheduler view. The host side of the verdict
// is its waits on the GPU (model.CUDAWaits.Share): a busy GPU is
// confirmed as the bottleneck when the host waited on it most of the
// window (model.CUDAStats.VerdictHost); a busy GPU whose host did not wait
// is still gpu_bound, the host's work then overlapping the GPU's.
package inputbound

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/episode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/series"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Verdicts (model.CUDAStats.Verdict).
const (
	GPUBound   = "gpu_bound"
	InputBound = "input_bound"
)

// Config holds the thresholds. Zero fields take DefaultConfig's values.
type Config struct {
	Window time.Duration // judged over
	// BusySM is the mean SM utilization from which the GPU is the
	// bottleneck; IdleSM the mean at or below which it idles most of the
	// window.
	BusySM, IdleSM float64
	// StarvedWait is the p99 run-queue wait of an interval from which a
	// process waits for a CPU, over at least MinWaits wake-ups.
	StarvedWait time.Duration
	MinWaits    uint64
	// StarvedShare is the share of the window's intervals in which some
	// process the GPU depends on waited so.
	StarvedShare float64
	// HostWaitShare is the share of the window the host's thread that
	// waited most must have waited on the GPU to confirm gpu_bound.
	HostWaitShare float64
}

// DefaultConfig returns the thresholds used when none are given.
func DefaultConfig() Config {
	return Config{Window: 30 * time.Second, BusySM: 0.8, IdleSM: 0.3, StarvedWait: 5 * time.Millisecond, MinWaits: 20, StarvedShare: 0.7, HostWaitShare: 0.5}
}

// Detector keeps a window per GPU process. Not safe for concurrent use.
type Detector struct {
	cfg  Config
	gpu  map[int]*state
	runq map[int]model.Histogram // each process's histogram at its previous poll
	// Each process's threads' preemptions at its previous poll, by tid.
	preempted map[int]map[int]uint64
}

type state struct {
	samples []sample
	since   time.Time // input-bound since; zero when not
	bound   episode.Episode
}

// sample is one interval of a GPU process.
type sample struct {
	t       time.Time
	sm      float64
	waiting []waiter // processes that waited for a CPU in it
	// The host's waits on the GPU in it (CUDAWaits.Share), known where
	// the process's CUDA libraries are hooked.
	hostWait  float64
	hostKnown bool
}

type waiter struct {
	pid     int
	comm    string
	p99     float64 // seconds
	cpus    int     // allowed
	waits   uint64
	isChild bool
	threads []thread // the most preempted in the interval: they wanted a CPU
}

type thread struct {
	tid       int
	name      string
	preempted uint64
}

// threadsShown bounds the threads named per process.
const threadsShown = 3

// New returns a detector; zero fields of cfg take DefaultConfig's values.
func New(cfg Config) *Detector {
	def := DefaultConfig()
	cfg.Window = cmp.Or(cfg.Window, def.Window)
	cfg.BusySM = cmp.Or(cfg.BusySM, def.BusySM)
	cfg.IdleSM = cmp.Or(cfg.IdleSM, def.IdleSM)
	cfg.StarvedWait = cmp.Or(cfg.StarvedWait, def.StarvedWait)
	cfg.MinWaits = cmp.Or(cfg.MinWaits, def.MinWaits)
	cfg.StarvedShare = cmp.Or(cfg.StarvedShare, def.StarvedShare)
	cfg.HostWaitShare = cmp.Or(cfg.HostWaitShare, def.HostWaitShare)
	return &Detector{cfg: cfg, gpu: map[int]*state{}, runq: map[int]model.Histogram{}, preempted: map[int]map[int]uint64{}}
}

// Observe takes in one poll of every watched process, sets the verdict of
// each GPU process (model.CUDAStats.Verdict) and returns the input-bound
// findings: new, updated, or just ended.
func (d *Detector) Observe(now time.Time, procs []*model.Process) []model.Finding {
	children := map[int][]*model.Process{}
	for _, p := range procs {
		children[p.PPID] = append(children[p.PPID], p)
	}
	// Only GPU processes and their children are looked at: a poll of a
	// node's thousand other processes costs nothing here.
	waited := map[int]waiter{}
	looked := map[int]bool{}
	for _, p := range procs {
		if len(p.CUDA.GPUUtil) == 0 {
			continue
		}
		for _, q := range append([]*model.Process{p}, children[p.PID]...) {
			if looked[q.PID] {
				continue
			}
			looked[q.PID] = true
			if w, ok := d.interval(q); ok {
				waited[q.PID] = w
			}
		}
	}
	for pid := range d.runq {
		if !looked[pid] {
			delete(d.runq, pid)
			delete(d.preempted, pid)
		}
	}
	var out []model.Finding
	for _, p := range procs {
		if len(p.CUDA.GPUUtil) == 0 {
			if st := d.gpu[p.PID]; st != nil {
				out = append(out, d.observe(now, p, st, false)...)
			}
			delete(d.gpu, p.PID)
			continue
		}
		st := d.gpu[p.PID]
		if st == nil {
			st = &state{}
			d.gpu[p.PID] = st
		}
		s := sample{t: now, hostWait: p.CUDA.Waits.Share, hostKnown: len(p.CUDA.Libraries) > 0}
		for _, u := range p.CUDA.GPUUtil {
			s.sm += u.SM
		}
		s.sm /= float64(len(p.CUDA.GPUUtil))
		for _, q := range append([]*model.Process{p}, children[p.PID]...) {
			if w, ok := waited[q.PID]; ok {
				w.isChild = q != p
				s.waiting = append(s.waiting, w)
			}
		}
		st.samples = append(st.samples, s)
		for len(st.samples) > 1 && now.Sub(st.samples[1].t) >= d.cfg.Window {
			st.samples = st.samples[1:]
		}
		p.CUDA.Verdict = d.verdict(st, now)
		p.CUDA.VerdictHost = nil
		if share, ok := hostWait(st.samples); ok && p.CUDA.Verdict != "" {
			p.CUDA.VerdictHost = &model.VerdictHost{WaitShare: share, Confirmed: p.CUDA.Verdict == GPUBound && share >= d.cfg.HostWaitShare}
		}
		out = append(out, d.observe(now, p, st, p.CUDA.Verdict == InputBound)...)
	}
	// The pipeline ends the findings of a process that exits.
	for _, p := range procs {
		if p.Exited {
			d.Forget(p.PID)
		}
	}
	return out
}

// interval returns what p waited for a CPU since its previous poll, if it
// waited so: a p99 run-queue wait of StarvedWait or more over MinWaits
// wake-ups.
func (d *Detector) interval(p *model.Process) (waiter, bool) {
	prev, seen := d.runq[p.PID]
	d.runq[p.PID] = p.Sched.RunqLatency
	before := d.preempted[p.PID]
	now := make(map[int]uint64, len(p.Sched.Threads))
	var threads []thread
	for _, th := range p.Sched.Threads {
		now[th.TID] = th.Involuntary
		if n := th.Involuntary - min(before[th.TID], th.Involuntary); n > 0 {
			threads = append(threads, thread{th.TID, th.Name, n})
		}
	}
	d.preempted[p.PID] = now
	if !seen {
		return waiter{}, false
	}
	delta := p.Sched.RunqLatency.Sub(prev)
	q, ok := delta.Quantile(0.99)
	if !ok || delta.Count < d.cfg.MinWaits || q < d.cfg.StarvedWait.Seconds() {
		return waiter{}, false
	}
	slices.SortFunc(threads, func(a, b thread) int { return cmp.Or(cmp.Compare(b.preempted, a.preempted), a.tid-b.tid) })
	return waiter{pid: p.PID, comm: p.Comm, p99: q, cpus: p.Sched.AllowedCPUs, waits: delta.Count,
		threads: threads[:min(len(threads), threadsShown)]}, true
}

// verdict judges the window; "" until it covers Window.
func (d *Detector) verdict(st *state, now time.Time) string {
	if len(st.samples) < 3 || now.Sub(st.samples[0].t) < d.cfg.Window*9/10 {
		return ""
	}
	var sm float64
	starved := 0
	for _, s := range st.samples {
		sm += s.sm
		if len(s.waiting) > 0 {
			starved++
		}
	}
	sm /= float64(len(st.samples))
	switch {
	case sm >= d.cfg.BusySM:
		return GPUBound
	case sm <= d.cfg.IdleSM && float64(starved) >= d.cfg.StarvedShare*float64(len(st.samples)):
		return InputBound
	}
	return ""
}

// hostWait is the share of the window the host waited on the GPU: each
// interval's CUDAWaits.Share weighted by its length; false when it is not
// known for all of the window.
func hostWait(samples []sample) (float64, bool) {
	var waited, span float64
	for i, s := range samples[1:] {
		if !s.hostKnown {
			return 0, false
		}
		dt := s.t.Sub(samples[i].t).Seconds()
		waited += s.hostWait * dt
		span += dt
	}
	if span <= 0 {
		return 0, false
	}
	return series.Round(waited/span, 3), true
}

func (d *Detector) finding(p *model.Process, st *state, now time.Time) model.Finding {
	var sm float64
	worst := map[int]waiter{} // each process's longest wait in the window
	starved := 0
	for _, s := range st.samples {
		sm += s.sm
		if len(s.waiting) > 0 {
			starved++
		}
		for _, w := range s.waiting {
			if w.p99 > worst[w.pid].p99 {
				worst[w.pid] = w
			}
		}
	}
	sm /= float64(len(st.samples))
	ws := make([]waiter, 0, len(worst))
	for _, w := range worst {
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b waiter) int { return cmp.Or(cmp.Compare(b.p99, a.p99), a.pid-b.pid) })
	var names []string
	var ev []model.WaitingProcess
	for i, w := range ws {
		role := "itself"
		if w.isChild {
			role = "child"
		}
		var threads []model.WaitingThread
		var tnames []string
		for _, th := range w.threads {
			threads = append(threads, model.WaitingThread{TID: th.tid, Name: th.name, Preempted: th.preempted})
			tnames = append(tnames, fmt.Sprintf("%s %d", th.name, th.tid))
		}
		ev = append(ev, model.WaitingProcess{PID: w.pid, Comm: w.comm, Role: role, RunqP99Seconds: w.p99, AllowedCPUs: w.cpus, Threads: threads})
		if i < 4 {
			name := fmt.Sprintf("%s %d (%s, p99 %s", role, w.pid, w.comm, time.Duration(w.p99*float64(time.Second)).Round(100*time.Microsecond))
			if !w.isChild && len(tnames) > 0 {
				// The process itself: which of its threads wanted a CPU.
				name += "; threads " + strings.Join(tnames, ", ")
			}
			names = append(names, name+")")
		}
	}
	if len(ws) > 4 {
		names = append(names, fmt.Sprintf("%d more", len(ws)-4))
	}
	span := now.Sub(st.samples[0].t)
	var host *float64
	if share, ok := hostWait(st.samples); ok {
		host = &share
	}
	f := model.Finding{
		Kind: model.KindGPUInputBound, PID: p.PID, Comm: p.Comm, Severity: model.SeverityWarning,
		FirstSeen: st.since, LastSeen: now, Active: true,
		Summary: fmt.Sprintf("GPU idle %.0f %% of the last %s while the processes it waits on wait for a CPU: %s",
			100*(1-sm), span.Round(time.Second), strings.Join(names, ", ")),
		Evidence: model.GPUInputBoundEvidence{
			SMUtilizationMean: sm, WindowSeconds: span.Seconds(), StarvedShare: float64(starved) / float64(len(st.samples)),
			Waiting: ev, Verdict: InputBound, HostWaitShare: host,
		},
	}
	return f
}

// observe moves st's finding on: open while the process is input-bound
// (from the start of the window that showed it), ended at the first poll
// it is not.
func (d *Detector) observe(now time.Time, p *model.Process, st *state, bound bool) []model.Finding {
	if bound && st.since.IsZero() {
		st.since = st.samples[0].t
	}
	return st.bound.Observe(now, model.KindGPUInputBound, p.PID, episode.Rule{}, episode.Verdict{Raise: bound},
		func(f model.Finding, active bool) model.Finding {
			if !active {
				st.since = time.Time{}
				f.Active, f.LastSeen = false, now
				return f
			}
			return d.finding(p, st, now)
		})
}

// Forget drops what is kept of pid.
func (d *Detector) Forget(pid int) {
	delete(d.gpu, pid)
	delete(d.runq, pid)
	delete(d.preempted, pid)
}
