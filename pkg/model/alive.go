package model

import "time"

// LastAlive keeps each process's last snapshot in which it was alive, by
// the process (a reused pid is another), in the order first seen: by the
// snapshot that says a process exited, its fds are gone, and what it held
// is what a report's sites and profiles show. Not safe for concurrent use.
type LastAlive struct {
	procs map[aliveKey]*Process
	order []aliveKey
}

type aliveKey struct {
	pid     int
	started int64
}

// Update takes in the processes of s.
func (l *LastAlive) Update(s *Snapshot) {
	if l.procs == nil {
		l.procs = map[aliveKey]*Process{}
	}
	for _, p := range s.Processes {
		k := aliveKey{p.PID, p.Started.UnixNano()}
		last, ok := l.procs[k]
		if !ok {
			l.order = append(l.order, k)
		}
		if !ok || !p.Exited || last.Exited {
			l.procs[k] = p
		}
	}
}

// Of returns the process pid started at started, nil if never seen.
func (l *LastAlive) Of(pid int, started time.Time) *Process {
	return l.procs[aliveKey{pid, started.UnixNano()}]
}

// All returns every process seen, first seen first.
func (l *LastAlive) All() []*Process {
	out := make([]*Process, len(l.order))
	for i, k := range l.order {
		out[i] = l.procs[k]
	}
	return out
}
