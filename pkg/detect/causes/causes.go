// Package causes joins findings of different detectors that one cause
// explains, so that one problem is reported once.
//
// A server that never closes connections its peers hung up leaks TCP
// sockets in CLOSE_WAIT, and each of them holds an fd: the fd-leak detector
// sees the fd growth (at the accept call site) seconds before the
// socket-leak detector has seen the sockets stay long enough. Reported
// alone, that would be two findings for one bug. Here an fd leak whose
// leaking fds are mostly CLOSE_WAIT sockets is held back until the socket
// leak is raised (for at most Grace), and then recorded as caused by it; the
// socket leak carries the fd growth as evidence and names the fd leak as
// related.
//
// An fd-exhaustion finding lists the leaks of the same process that lead to
// it as related; it is not held back: running out of fds is reported at once.
//
// A GPU memory leak and allocation bursts from the same call site of one
// process are two faces of one site (a cache that takes a burst each step
// and keeps part of it): each names the other as related and says so.
package causes

import (
	"fmt"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/stack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// DefaultGrace is how long an fd leak made of CLOSE_WAIT sockets waits for
// the socket leak: the socket detector needs its window (10 s) and its
// minimum age (5 s), plus a few intervals of slack.
const DefaultGrace = 20 * time.Second

// minCloseWaitShare of an fd leak's site's fds must be CLOSE_WAIT sockets
// for the socket leak to explain it.
const minCloseWaitShare = 0.5

// Linker links the findings of each poll. It is not safe for concurrent use.
type Linker struct {
	grace time.Duration
}

// New returns a Linker that holds an fd leak back for at most grace.
func New(grace time.Duration) *Linker {
	return &Linker{grace: grace}
}

// Link takes the findings the detectors returned at one poll (fresh), the
// processes they are about, and the findings recorded before; it returns
// what to record now: fresh, with explained fd leaks marked (or left out
// while they wait for their cause) and the explaining findings updated.
func (l *Linker) Link(now time.Time, procs []*model.Process, fresh, recorded []model.Finding) []model.Finding {
	byPID := make(map[int]*model.Process, len(procs))
	for _, p := range procs {
		byPID[p.PID] = p
	}
	out := slices.Clone(fresh)
	// Detectors return their findings afresh each poll: what an earlier
	// poll linked stays.
	for i := range out {
		f := &out[i]
		if prev := find(recorded, f.Kind, f.PID, f.FirstSeen); prev != nil {
			for _, r := range prev.Related {
				f.Related = appendRef(f.Related, r)
			}
			if g, ok := prev.Evidence.(model.SocketLeakEvidence); ok && g.FDGrowth != nil {
				if ev, _ := f.Evidence.(model.SocketLeakEvidence); ev.FDGrowth == nil {
					ev.FDGrowth = g.FDGrowth
					f.Evidence = ev
				}
			}
		}
	}
	drop := make([]bool, len(out))
	for i := range out {
		f := &out[i]
		p := byPID[f.PID]
		if f.Kind != model.KindFDLeak || p == nil {
			continue
		}
		prev := find(recorded, f.Kind, f.PID, f.FirstSeen)
		cause := -1
		if prev != nil && prev.CausedBy != nil || closeWaitShare(f, p) >= minCloseWaitShare {
			cause = latest(out, model.KindSocketLeak, f.PID)
		}
		switch {
		case cause >= 0:
			link(f, &out[cause])
		case prev != nil && prev.CausedBy != nil:
			// Its socket leak ended before it: the link stays.
			f.CausedBy = prev.CausedBy
		case prev == nil && closeWaitShare(f, p) >= minCloseWaitShare && now.Sub(f.FirstSeen) < l.grace:
			drop[i] = true // wait for the socket leak
		}
	}
	for i := range out {
		if f := &out[i]; f.Kind == model.KindFDExhausted {
			for j, g := range out {
				if (g.Kind == model.KindFDLeak && g.CausedBy == nil || g.Kind == model.KindSocketLeak) && g.PID == f.PID && g.Active && !drop[j] {
					f.Related = appendRef(f.Related, g.Ref())
				}
			}
		}
	}
	linkGPU(out)
	kept := out[:0]
	for i, f := range out {
		if !drop[i] {
			kept = append(kept, f)
		}
	}
	return kept
}

// linkGPU relates each GPU leak to the bursts of the same process and call
// site.
func linkGPU(out []model.Finding) {
	for i := range out {
		f := &out[i]
		if f.Kind != model.KindGPUMemoryLeak || len(f.Stack) == 0 {
			continue
		}
		for j := range out {
			g := &out[j]
			if g.Kind != model.KindGPUAllocBurst || g.PID != f.PID || len(g.Stack) == 0 || stack.CallSite(g.Stack) != stack.CallSite(f.Stack) {
				continue
			}
			f.Related = appendRef(f.Related, g.Ref())
			g.Related = appendRef(g.Related, f.Ref())
			f.Summary += "; the same site also bursts (" + model.KindGPUAllocBurst + ")"
			g.Summary += "; the same site also leaks (" + model.KindGPUMemoryLeak + ")"
		}
	}
}

// link marks fd leak f as caused by socket leak s and gives s the fd
// growth as evidence.
func link(f, s *model.Finding) {
	ref := s.Ref()
	f.CausedBy = &ref
	f.Summary += fmt.Sprintf("; these fds are the CLOSE_WAIT sockets of the %s", model.KindSocketLeak)
	s.Related = appendRef(s.Related, f.Ref())
	fd, isFD := f.Evidence.(model.FDLeakEvidence)
	// Set on a copy: s's evidence may be shared with an earlier snapshot.
	ev, _ := s.Evidence.(model.SocketLeakEvidence)
	ev.FDGrowth = &model.FDGrowth{
		FDLeakFirstSeen:         f.FirstSeen,
		OpenFDs:                 fd.OpenFDs,
		GrowthPerSecond:         fd.GrowthPerSecond,
		Limit:                   fd.Limit,
		TimeToExhaustionSeconds: fd.TimeToExhaustionSeconds,
		WindowSeconds:           fd.WindowSeconds,
	}
	s.Evidence = ev
	if f.Severity == model.SeverityCritical {
		s.Severity = model.SeverityCritical
	}
	if isFD && f.Active {
		s.Summary += fmt.Sprintf("; they hold the process's fds, %d open and growing %.1f/s", fd.OpenFDs, fd.GrowthPerSecond)
	}
}

// closeWaitShare is the share of the fds at f's site (its stack) that are
// TCP sockets in CLOSE_WAIT.
func closeWaitShare(f *model.Finding, p *model.Process) float64 {
	if len(f.Stack) == 0 || len(p.Sock.CloseWait) == 0 {
		return 0
	}
	cw := make(map[int32]bool, len(p.Sock.CloseWait))
	for _, c := range p.Sock.CloseWait {
		cw[int32(c.FD)] = true
	}
	for _, s := range p.FD.Sites {
		if !slices.Equal(s.Stack, f.Stack) || len(s.FDs) == 0 {
			continue
		}
		n := 0
		for _, fd := range s.FDs {
			if cw[fd] {
				n++
			}
		}
		return float64(n) / float64(len(s.FDs))
	}
	return 0
}

// latest returns the index in fs of the finding of kind about pid seen
// first most recently, or -1.
func latest(fs []model.Finding, kind string, pid int) int {
	best := -1
	for i, f := range fs {
		if f.Kind == kind && f.PID == pid && (best < 0 || f.FirstSeen.After(fs[best].FirstSeen)) {
			best = i
		}
	}
	return best
}

func find(fs []model.Finding, kind string, pid int, first time.Time) *model.Finding {
	for i, f := range fs {
		if f.Kind == kind && f.PID == pid && f.FirstSeen.Equal(first) {
			return &fs[i]
		}
	}
	return nil
}

func appendRef(refs []model.FindingRef, r model.FindingRef) []model.FindingRef {
	for _, x := range refs {
		if x.Kind == r.Kind && x.PID == r.PID && x.FirstSeen.Equal(r.FirstSeen) {
			return refs
		}
	}
	return append(slices.Clone(refs), r)
}
