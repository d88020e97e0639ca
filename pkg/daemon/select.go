// Package daemon is the node-wide mode: which processes to watch (CUDA
// users by default), found from kernel events with a slow /proc resync, the
// cap on how many, the findings log and the HTTP endpoints.
package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/cudatrack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/discover"
	"github.com/open-autoglm/autoglm-ebpf/pkg/nccltrack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/pipeline"
	"github.com/open-autoglm/autoglm-ebpf/pkg/podinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// Rules say which processes the daemon watches.
type Rules struct {
	// All watches every user process (fd, sched, sock views), not only
	// those using CUDA.
	All bool
	// Comm, if set, keeps only processes whose name matches.
	Comm *regexp.Regexp
	// Cgroup, if set, keeps only processes whose cgroup path matches (see
	// CompileGlob).
	Cgroup *regexp.Regexp
	// Max caps the processes watched at once.
	Max int
}

// CompileGlob turns a cgroup glob into a regexp matched against the whole
// path: * matches any run of characters, / included (so "*kubepods*pod1234*"
// selects one pod's containers), ? one character, [...] a class.
func CompileGlob(glob string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(glob); i++ {
		switch c := glob[i]; c {
		case '*':
			b.WriteString(".*")
		case '?':
			b.WriteString(".")
		case '[':
			end := strings.IndexByte(glob[i+1:], ']')
			if end < 0 {
				return nil, fmt.Errorf("glob %q: unterminated [", glob)
			}
			class := glob[i+1 : i+1+end]
			if class == "" || class == "!" {
				return nil, fmt.Errorf("glob %q: empty class []", glob)
			}
			if class[0] == '!' {
				class = "^" + class[1:]
			}
			b.WriteString("[" + strings.ReplaceAll(class, `\`, `\\`) + "]")
			i += end + 1
		case ']':
			return nil, fmt.Errorf("glob %q: ] without [", glob)
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// Finder discovers processes for the pipeline (pipeline.Source): it watches
// those its kernel events name and a periodic walk of /proc finds, when
// they match the rules, up to the cap.
type Finder struct {
	rules   Rules
	proc    procinfo.FS
	cuda    *cudatrack.Finder
	events  *discover.Watcher // nil: the /proc walk alone, every resync
	resync  time.Duration
	lastRun time.Time
	self    int

	// overCap holds processes that matched while the cap was reached; each
	// is counted once in OverCap and retried when a slot frees.
	overCap map[int]bool
	OverCap atomic.Uint64
	capWarn bool
	watched atomic.Int64 // live watched processes, for the gauge
}

// NewFinder returns a Finder for the rules. events may be nil (the kernel
// cannot host the discovery programs): then every resync walks /proc.
func NewFinder(rules Rules, proc procinfo.FS, events *discover.Watcher, resync time.Duration) *Finder {
	return &Finder{
		rules: rules, proc: proc, cuda: cudatrack.NewFinder(proc), events: events, resync: resync,
		self: os.Getpid(), overCap: map[int]bool{},
	}
}

// Watched is the number of processes watched after the last poll.
func (f *Finder) Watched() int64 { return f.watched.Load() }

// Discover watches the processes that appeared since the last poll.
func (f *Finder) Discover(p *pipeline.Pipeline) {
	candidates := map[int]bool{}
	for pid := range f.overCap {
		candidates[pid] = true
	}
	f.drain(candidates)
	// Children of watched processes, tracked from their fork: taken now,
	// they cost no fd listing.
	for _, pid := range p.Forked() {
		candidates[pid] = true
	}
	if f.lastRun.IsZero() || time.Since(f.lastRun) >= f.resync {
		f.lastRun = time.Now()
		pids, err := f.proc.AllPIDs()
		if err != nil {
			slog.Warn("listing processes", "err", err)
		}
		for _, pid := range pids {
			candidates[pid] = true
		}
	}
	for pid := range candidates {
		if p.Watching(pid) || pid == f.self {
			delete(f.overCap, pid)
			continue
		}
		if ok, err := f.matches(pid); err != nil || !ok {
			f.proc.Drop(pid)
			delete(f.overCap, pid)
			continue
		}
		if p.Live() >= f.rules.Max {
			if f.proc.Check(pid) != nil {
				delete(f.overCap, pid) // gone, or a kernel thread
				continue
			}
			if !f.overCap[pid] {
				f.overCap[pid] = true
				f.OverCap.Add(1)
				if !f.capWarn {
					f.capWarn = true
					slog.Warn("--max-processes reached: further matching processes are not watched (counted in autoglm_processes_over_cap_total)",
						"max", f.rules.Max, "pid", pid)
				} else {
					slog.Debug("over --max-processes, not watched", "pid", pid)
				}
			}
			continue
		}
		delete(f.overCap, pid)
		if err := p.Watch(pid); err != nil {
			// Gone already, or a kernel thread: not ours.
			slog.Debug("not watched", "pid", pid, "err", err)
			continue
		}
		slog.Debug("watching", "pid", pid)
	}
	f.watched.Store(int64(p.Live()))
}

// drain adds the pids the kernel reported since the last poll.
func (f *Finder) drain(into map[int]bool) {
	if f.events == nil {
		return
	}
	events, err := f.events.Drain()
	if err != nil {
		slog.Warn("draining discovery events", "err", err)
	}
	for _, e := range events {
		into[e.PID] = true
	}
}

// Lost returns the discovery programs' loss counters.
func (f *Finder) Lost() (map[string]uint64, error) {
	if f.events == nil {
		return nil, nil
	}
	return f.events.Lost()
}

// matches applies the rules to pid. Whether it is a user-space process
// still there is left to the pipeline's Watch, which reads its identity
// anyway: each read saved counts at a hundred process starts a second.
func (f *Finder) matches(pid int) (bool, error) {
	if f.rules.Comm != nil {
		id, err := f.proc.Identify(pid)
		if err != nil || !f.rules.Comm.MatchString(id.Comm) {
			return false, err
		}
	}
	if f.rules.Cgroup != nil {
		cg, err := podinfo.ReadCgroup(f.proc, pid)
		if err != nil || !f.rules.Cgroup.MatchString(cg.Path) {
			return false, err
		}
	}
	if f.rules.All {
		return true, nil
	}
	uses, err := f.cuda.UsesCUDA(pid)
	if errors.Is(err, procinfo.ErrNoProcess) {
		return false, err
	}
	if uses {
		return true, nil
	}
	// A rank maps libnccl, which carries its own copy of the CUDA
	// runtime: no libcudart need show.
	uses, err = nccltrack.MapsLibrary(f.proc, pid)
	if errors.Is(err, procinfo.ErrNoProcess) {
		return false, err
	}
	return uses, nil
}
