package schedtrack

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// Concern is the scheduler concern as the pipeline sees it: the tracker,
// and thread names and CPU affinity from the system.
type Concern struct {
	*Tracker
	proc  procinfo.FS
	names map[[2]int]threadName // by pid and tid
	polls int
}

// threadName is a thread's name as last read. Names are read again every
// nameEvery polls: a thread names itself once, mostly right after it
// starts, and reading each thread's name each poll was most of what a
// process with many threads cost this view.
type threadName struct {
	name string
	read int // the poll it was read at
	seen int // the last poll that listed the thread
}

const nameEvery = 10

// NewConcern loads and attaches the scheduler BPF object.
func NewConcern(cfg Config) (*Concern, error) {
	proc, err := procinfo.New(cfg.ProcRoot)
	if err != nil {
		return nil, err
	}
	t, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &Concern{Tracker: t, proc: proc, names: map[[2]int]threadName{}}, nil
}

// Name is the concern's name in logs and `check`.
func (c *Concern) Name() string { return "sched" }

// Fill fills the scheduler part of each process; it returns them all.
func (c *Concern) Fill(_ time.Time, procs []*model.Process) ([]*model.Process, error) {
	pids := make([]int, len(procs))
	for i, p := range procs {
		pids[i] = p.PID
	}
	samples, err := c.Poll(pids)
	if err != nil {
		return nil, err
	}
	c.polls++
	for _, p := range procs {
		c.fill(p, samples[p.PID])
	}
	for key, n := range c.names {
		if n.seen != c.polls {
			delete(c.names, key)
		}
	}
	return procs, nil
}

// fill turns a kernel sample into the model view.
func (c *Concern) fill(p *model.Process, s *Sample) {
	p.Sched.Voluntary = s.Voluntary
	p.Sched.Involuntary = s.Involuntary
	threads := make([]model.ThreadSched, 0, len(s.Threads))
	for _, th := range s.Threads {
		key := [2]int{p.PID, th.TID}
		n, ok := c.names[key]
		if !ok || c.polls-n.read >= nameEvery {
			name, err := c.proc.ThreadName(p.PID, th.TID)
			if errors.Is(err, procinfo.ErrNoProcess) {
				c.Forget(th.TID)
				continue
			}
			n = threadName{name: name, read: c.polls}
		}
		n.seen = c.polls
		c.names[key] = n
		name := n.name
		threads = append(threads, model.ThreadSched{TID: th.TID, Name: name, Voluntary: th.Voluntary, Involuntary: th.Involuntary})
	}
	slices.SortFunc(threads, func(a, b model.ThreadSched) int {
		return cmp.Or(cmp.Compare(b.Voluntary+b.Involuntary, a.Voluntary+a.Involuntary), cmp.Compare(a.TID, b.TID))
	})
	p.Sched.Threads = threads
	if n, err := procinfo.AllowedCPUs(p.PID); err == nil {
		p.Sched.AllowedCPUs = n
	}
	p.Sched.RunqLatency = s.Histogram()
}
