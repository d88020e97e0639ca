package cudatrack

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
)

// waitPoll is what one process's waits were at the previous poll, for the
// changes since.
type waitPoll struct {
	at      time.Time
	sites   map[WaitSite]WaitCounts
	threads map[int]ThreadCounts
	names   map[int]string // thread names, read once
}

// fillWaits turns the kernel's waits and launches of p into the model view,
// built anew (earlier snapshots share the previous slices).
func (c *Concern) fillWaits(now time.Time, p *model.Process, s *Sample) {
	last := c.waits[p.PID]
	if last == nil {
		last = &waitPoll{names: map[int]string{}}
		c.waits[p.PID] = last
	}
	// The share of the interval: none at the first poll, which has no
	// interval.
	interval := 0.0
	if !last.at.IsZero() {
		interval = now.Sub(last.at).Seconds()
	}
	p.CUDA.Waits = c.waitsOf(p, s, last, interval)
	p.CUDA.Launches = launchesOf(s.Launches)
	last.at, last.sites, last.threads = now, s.Waits, s.Threads
}

func (c *Concern) waitsOf(p *model.Process, s *Sample, last *waitPoll, interval float64) model.CUDAWaits {
	var w model.CUDAWaits
	var all WaitCounts
	for k, n := range s.Waits {
		was := last.sites[k]
		site := model.CUDAWaitSite{
			API:           APIs[k.API].Name,
			StackID:       k.Site.ID(),
			Calls:         n.Calls,
			Seconds:       seconds(n.TotalNs),
			MaxSeconds:    seconds(n.MaxNs),
			Histogram:     waitHistogram(n.Slots, n.TotalNs),
			RecentCalls:   n.Calls - min(was.Calls, n.Calls),
			RecentSeconds: seconds(n.TotalNs - min(was.TotalNs, n.TotalNs)),
		}
		w.Sites = append(w.Sites, site)
		all.Calls += n.Calls
		all.TotalNs += n.TotalNs
		for i, v := range n.Slots {
			all.Slots[i] += v
		}
	}
	w.Calls, w.Seconds = all.Calls, seconds(all.TotalNs)
	if all.Calls > 0 {
		w.Histogram = waitHistogram(all.Slots, all.TotalNs)
	}
	slices.SortFunc(w.Sites, func(a, b model.CUDAWaitSite) int {
		return cmp.Or(cmp.Compare(b.RecentSeconds, a.RecentSeconds), cmp.Compare(b.Seconds, a.Seconds), cmp.Compare(a.API, b.API), cmp.Compare(a.StackID, b.StackID))
	})
	for i := range w.Sites[:min(len(w.Sites), c.topSites)] {
		w.Sites[i].Stack = c.stack(p.PID, stacks.SiteOf(w.Sites[i].StackID))
	}
	for tid, n := range s.Threads {
		t := model.ThreadWait{TID: tid, Name: c.threadName(p, last, tid), Calls: n.Calls, Seconds: seconds(n.TotalNs)}
		if interval > 0 {
			t.Share = min(1, seconds(n.TotalNs-min(last.threads[tid].TotalNs, n.TotalNs))/interval)
		}
		w.Share = max(w.Share, t.Share)
		w.Threads = append(w.Threads, t)
	}
	slices.SortFunc(w.Threads, func(a, b model.ThreadWait) int {
		return cmp.Or(cmp.Compare(b.Share, a.Share), cmp.Compare(b.Seconds, a.Seconds), cmp.Compare(a.TID, b.TID))
	})
	return w
}

// threadName names a thread of p: from the scheduler's view when it has the
// thread, else from /proc, once; "" when the thread is gone unnamed.
func (c *Concern) threadName(p *model.Process, last *waitPoll, tid int) string {
	if n, ok := last.names[tid]; ok {
		return n
	}
	for _, t := range p.Sched.Threads {
		if t.TID == tid && t.Name != "" {
			last.names[tid] = t.Name
			return t.Name
		}
	}
	n, err := c.proc.ThreadComm(p.PID, tid)
	if err != nil {
		return "" // gone: asked again next time, in case it was a passing error
	}
	last.names[tid] = n
	return n
}

func launchesOf(l *LaunchCounts) *model.CUDALaunches {
	if l == nil {
		return nil
	}
	out := &model.CUDALaunches{Calls: make(map[string]uint64, len(l.Calls)), Histogram: waitHistogram(l.Slots, l.TotalNs)}
	for api, n := range l.Calls {
		out.Calls[APIs[api].Name] = n
	}
	return out
}

func seconds(ns uint64) float64 { return float64(ns) / 1e9 }

// firstWaitSlot is the kernel slot whose upper bound is the first histogram
// bound, 2^-20 s (about a microsecond): shorter waits are merged into it.
const firstWaitSlot = 9

// waitUnitExp: the kernel slots durations in units of 2^waitUnitExp seconds
// (WAIT_UNIT_* in bpf/cuda.bpf.c).
const waitUnitExp = -30

// waitHistogram turns the kernel's log2 slots (slot i: [2^i, 2^(i+1)) units
// of 2^-30 s) into a model histogram whose bounds are powers of two of a
// second, from 2^-20 s to 2^9 s. The last slot has no upper bound, so it
// counts in Count and Sum only.
func waitHistogram(slots [waitSlots]uint64, totalNs uint64) model.Histogram {
	last := len(slots) - 1
	h := model.Histogram{Sum: seconds(totalNs)}
	for i := firstWaitSlot; i < last; i++ {
		h.Bounds = append(h.Bounds, math.Ldexp(1, i+1+waitUnitExp))
		h.Counts = append(h.Counts, slots[i])
	}
	for i := range firstWaitSlot {
		h.Counts[0] += slots[i]
	}
	for _, n := range slots {
		h.Count += n
	}
	return h
}
