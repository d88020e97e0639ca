package profiles

import (
	"bytes"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/google/pprof/profile"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Live is a sink that keeps the latest snapshot, for Handler to serve the
// current profiles from, and the memory snapshots taken at failed
// allocations (failures), for the GPU handler to serve after the process
// is gone: an out-of-memory error often ends it.
type Live struct {
	last     atomic.Pointer[model.Snapshot]
	failures failures
}

// Update keeps s.
func (l *Live) Update(s *model.Snapshot) {
	l.last.Store(s)
	l.failures.update(s)
}

// Close keeps final: a scrape during shutdown still gets an answer.
func (l *Live) Close(final *model.Snapshot) error {
	if final != nil {
		l.Update(final)
	}
	return nil
}

// Handler serves the current profile of kind, gzipped protobuf as Go's
// /debug/pprof handlers do: of one process with ?pid=N, else of every
// watched process at once, each sample labelled with its process (Labels),
// as Grafana Alloy's pyroscope.scrape and go tool pprof pull it.
func (l *Live) Handler(kind string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("at") || r.URL.Query().Has("time") {
			l.serveFailure(w, r, kind)
			return
		}
		s := l.last.Load()
		if s == nil {
			http.Error(w, "no poll has completed yet", http.StatusServiceUnavailable)
			return
		}
		b, err := NewBuilder(kind, s.Time)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if q := r.URL.Query().Get("pid"); q != "" {
			pid, err := parsePID(q)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			p := find(s, pid)
			if p == nil {
				http.Error(w, fmt.Sprintf("pid %d is not watched", pid), http.StatusNotFound)
				return
			}
			b.Add(p, nil)
		} else {
			for _, p := range s.Processes {
				if !p.Exited {
					b.Add(p, Labels(p))
				}
			}
		}
		prof, err := b.Profile()
		serve(w, prof, err, kind+".pb.gz")
	})
}

// serve writes prof, gzipped protobuf, as a download named file; err (of
// making it) as a server error.
func serve(w http.ResponseWriter, prof *profile.Profile, err error, file string) {
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	var buf bytes.Buffer
	if err := prof.Write(&buf); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="`+file+`"`)
	_, _ = w.Write(buf.Bytes())
}

// parsePID reads the pid parameter q: a positive number.
func parsePID(q string) (int, error) {
	pid, err := strconv.Atoi(q)
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("pid %q: not a positive number", q)
	}
	return pid, nil
}

// find is the watched process pid of s; nil if none (or it exited).
func find(s *model.Snapshot, pid int) *model.Process {
	for _, p := range s.Processes {
		if p.PID == pid && !p.Exited {
			return p
		}
	}
	return nil
}

// Paths are where the profiles are served, by kind.
var Paths = map[string]string{GPU: "/debug/pprof/gpu", FD: "/debug/pprof/fd", Wait: "/debug/pprof/wait"}
