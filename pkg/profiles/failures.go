package profiles

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// MaxFailureProcesses bounds the processes whose memory snapshots at
// failures Live keeps (model.MaxSnapshots each): past it, the process
// whose newest snapshot is oldest is forgotten. A node's agent runs for
// months; processes fail and go.
const MaxFailureProcesses = 256

// failures keeps the memory snapshots at failures of the processes that
// had any, past their exit. Safe for concurrent use.
type failures struct {
	mu    sync.Mutex
	procs map[procKey]*failed
}

// procKey is a process: a reused pid is another.
type procKey struct {
	pid     int
	started int64
}

// failed is one process's snapshots.
type failed struct {
	comm  string
	snaps []*model.GPUMemorySnapshot // oldest first, the newest model.MaxSnapshots
}

func (f *failed) newest() time.Time { return f.snaps[len(f.snaps)-1].Time }

// update takes in the snapshots of s's processes.
func (fs *failures) update(s *model.Snapshot) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, p := range s.Processes {
		if len(p.CUDA.Snapshots) == 0 {
			continue
		}
		if fs.procs == nil {
			fs.procs = map[procKey]*failed{}
		}
		k := procKey{p.PID, p.Started.UnixNano()}
		f := fs.procs[k]
		if f == nil {
			f = &failed{}
			fs.procs[k] = f
		}
		f.comm = p.Comm
		for _, snap := range p.CUDA.Snapshots {
			if !slices.ContainsFunc(f.snaps, func(o *model.GPUMemorySnapshot) bool { return o.Time.Equal(snap.Time) }) {
				f.snaps = append(f.snaps, snap)
			}
		}
		slices.SortFunc(f.snaps, func(a, b *model.GPUMemorySnapshot) int { return a.Time.Compare(b.Time) })
		f.snaps = f.snaps[max(0, len(f.snaps)-model.MaxSnapshots):]
	}
	for len(fs.procs) > MaxFailureProcesses {
		var oldest procKey
		var at time.Time
		for k, f := range fs.procs {
			if at.IsZero() || f.newest().Before(at) {
				oldest, at = k, f.newest()
			}
		}
		delete(fs.procs, oldest)
	}
}

// find returns pid's newest snapshot (of any process that had the pid),
// or, with precision > 0, its newest taken in [at, at+precision); nil
// if none, and the times of those it has.
func (fs *failures) find(pid int, at time.Time, precision time.Duration) (comm string, snap *model.GPUMemorySnapshot, have []time.Time) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for k, f := range fs.procs {
		if k.pid != pid {
			continue
		}
		for _, s := range f.snaps {
			have = append(have, s.Time)
			if precision > 0 && (s.Time.Before(at) || s.Time.Sub(at) >= precision) {
				continue
			}
			if snap == nil || s.Time.After(snap.Time) {
				comm, snap = f.comm, s
			}
		}
	}
	slices.SortFunc(have, time.Time.Compare)
	return comm, snap, have
}

// serveFailure serves /debug/pprof/gpu?pid=N&at=failure[&time=T]: the
// profile of pid's newest memory snapshot at a failed allocation, or of
// the one taken at T (OOMTimeLayout, or RFC 3339 to its precision).
func (l *Live) serveFailure(w http.ResponseWriter, r *http.Request, kind string) {
	q := r.URL.Query()
	if kind != GPU {
		http.Error(w, fmt.Sprintf("%s: at= and time= are for %s only, which serves the GPU memory at failed allocations", Paths[kind], Paths[GPU]), http.StatusBadRequest)
		return
	}
	if at := q.Get("at"); at != AtFailure {
		http.Error(w, fmt.Sprintf("at %q: only at=%s is served (the memory at a failed allocation)", at, AtFailure), http.StatusBadRequest)
		return
	}
	if !q.Has("pid") {
		http.Error(w, "at=failure needs pid=N", http.StatusBadRequest)
		return
	}
	pid, err := parsePID(q.Get("pid"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var at time.Time
	var precision time.Duration
	if q.Has("time") {
		if at, precision, err = parseSnapshotTime(q.Get("time")); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
	}
	comm, snap, have := l.failures.find(pid, at, precision)
	if snap == nil {
		msg := fmt.Sprintf("pid %d has no memory snapshot at a failed allocation: none of its allocations failed while it was watched, or its snapshots were dropped (the last %d of each of the last %d processes with any are kept)",
			pid, model.MaxSnapshots, MaxFailureProcesses)
		if len(have) > 0 {
			var ts []string
			for _, t := range have {
				ts = append(ts, t.UTC().Format(OOMTimeLayout))
			}
			msg = fmt.Sprintf("pid %d has no memory snapshot taken at %s; it has: %s", pid, q.Get("time"), strings.Join(ts, ", "))
		}
		http.Error(w, msg, http.StatusNotFound)
		return
	}
	prof, err := OfSnapshot(pid, comm, snap)
	serve(w, prof, err, OOMFileName(pid, snap.Time))
}
