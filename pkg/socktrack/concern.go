package socktrack

import (
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Concern is the socket concern as the pipeline sees it: the tracker, its
// samples turned into the model's view.
type Concern struct {
	*Tracker
}

// NewConcern loads the socket BPF object.
func NewConcern(cfg Config) (*Concern, error) {
	t, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &Concern{Tracker: t}, nil
}

// Name is the concern's name in logs and `check`.
func (c *Concern) Name() string { return "sock" }

// Fill fills the socket part of each process and returns those filled: a
// process whose sockets could not be read this time (it is exiting) keeps
// its previous view and is not judged on it.
func (c *Concern) Fill(_ time.Time, procs []*model.Process) ([]*model.Process, error) {
	pids := make([]int, len(procs))
	marks := make(map[int]FDMark, len(procs))
	for i, p := range procs {
		pids[i] = p.PID
		// The fd view filled first this poll (the sock view's after).
		if p.FD.Opened != nil {
			marks[p.PID] = FDMark{Opened: p.FD.Opened["socket"], Closed: p.FD.Closed["socket"], Live: p.FD.OpenSockets}
		}
	}
	samples, err := c.Poll(pids, marks)
	if err != nil {
		return nil, err
	}
	var filled []*model.Process
	for _, p := range procs {
		s := samples[p.PID]
		if s == nil {
			continue
		}
		p.Sock = stats(s, func() map[int][]model.Frame { return openingStacks(p.FD.Sites) })
		filled = append(filled, p)
	}
	return filled, nil
}

// openingStacks maps fd numbers to the symbolized stack that opened them,
// from the fd concern (which fills first in each interval).
func openingStacks(sites []model.FDSite) map[int][]model.Frame {
	out := map[int][]model.Frame{}
	for _, site := range sites {
		if site.Stack == nil {
			continue
		}
		for _, fd := range site.FDs {
			out[int(fd)] = site.Stack
		}
	}
	return out
}

// stats turns a sample into the model view; CLOSE_WAIT sockets get the
// stack that opened their fd where the fd table knows it. The fd-to-stack
// index (one entry per fd with a stack) is built only when one is needed:
// for a process holding 15 000 fds it was most of this view's poll.
func stats(s *Sample, opening func() map[int][]model.Frame) model.SockStats {
	st := model.SockStats{TCPByState: map[string]int{}, ByKind: map[string]int{}}
	for _, k := range model.SockKinds {
		st.ByKind[k] = s.ByKind[k]
	}
	var stacks map[int][]model.Frame
	for _, c := range s.Conns {
		st.TCPByState[c.State]++
		if c.State == "CLOSE_WAIT" {
			if stacks == nil {
				stacks = opening()
			}
			st.CloseWait = append(st.CloseWait, model.SockConn{Local: c.Local, Remote: c.Remote, State: c.State, Since: c.Since, Stack: stacks[c.FD], FD: c.FD})
		}
	}
	return st
}
