// Package pipeline is the loop shared by attach, run and (later) daemon: every
// interval it reads each concern's BPF maps, builds per-process state, runs
// the detectors and hands a snapshot to every sink.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/fdleak"
	"github.com/open-autoglm/autoglm-ebpf/pkg/fdtrack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
)

// Sink receives a snapshot every interval and the final one at the end.
type Sink interface {
	Update(s *model.Snapshot)
	Close(final *model.Snapshot) error
}

// Config holds the knobs of one run.
type Config struct {
	Interval time.Duration
	ProcRoot string
	MaxFDs   uint32
	FDLeak   fdleak.Config
	// TopSites bounds how many opening stacks per process are symbolized (the
	// largest first; each once), so the site a finding names has its frames.
	TopSites int
}

// DefaultConfig is what the CLI starts from.
func DefaultConfig() Config {
	return Config{Interval: time.Second, ProcRoot: "/proc", MaxFDs: 1 << 16, FDLeak: fdleak.DefaultConfig(), TopSites: 64}
}

// siteKey identifies an opening call site of one process: the kernel's
// frame-pointer stack plus the return addresses scanned from the stack.
type siteKey struct {
	pid     int
	stack   int32
	callers fdtrack.Callers
}

type site struct {
	id     int64
	key    siteKey
	frames []string // symbolized on first use
}

// Pipeline owns the loaded BPF objects and the per-process state.
type Pipeline struct {
	cfg      Config
	fd       *fdtrack.Tracker
	proc     procinfo.FS
	sym      *symbolize.Symbolizer
	det      *fdleak.Detector
	sinks    []Sink
	sites    map[siteKey]*site
	nextSite int64

	start    time.Time
	targets  []int
	procs    map[int]*model.Process
	order    []int // pids in the order they were added
	findings []model.Finding
}

// New loads and attaches the BPF side. Close must be called to unload it.
func New(cfg Config, sinks ...Sink) (*Pipeline, error) {
	proc, err := procinfo.New(cfg.ProcRoot)
	if err != nil {
		return nil, err
	}
	fd, err := fdtrack.New(fdtrack.Config{MaxFDs: cfg.MaxFDs, ProcRoot: cfg.ProcRoot})
	if err != nil {
		return nil, err
	}
	return &Pipeline{
		cfg:   cfg,
		fd:    fd,
		proc:  proc,
		sym:   symbolize.New(cfg.ProcRoot),
		det:   fdleak.New(cfg.FDLeak),
		sinks: sinks,
		sites: map[siteKey]*site{},
		start: time.Now(),
		procs: map[int]*model.Process{},
	}, nil
}

// Watch starts tracking pid. It fails with a clear error for a pid that does
// not exist or is a kernel thread.
func (p *Pipeline) Watch(pid int) error {
	if err := p.proc.Check(pid); err != nil {
		return err
	}
	comm, err := p.proc.Comm(pid)
	if err != nil {
		return err
	}
	if err := p.fd.Track(pid); err != nil {
		return err
	}
	p.targets = append(p.targets, pid)
	p.procs[pid] = &model.Process{PID: pid, Comm: comm, Started: time.Now()}
	p.order = append(p.order, pid)
	return nil
}

// Run polls until ctx is done or every watched process has exited, then
// gives the final snapshot to the sinks and returns it.
func (p *Pipeline) Run(ctx context.Context) (*model.Snapshot, error) {
	tick := time.NewTicker(p.cfg.Interval)
	defer tick.Stop()
	var runErr error
	for {
		snap, err := p.poll(time.Now())
		if err != nil {
			runErr = err
			break
		}
		for _, s := range p.sinks {
			s.Update(snap)
		}
		if p.allExited() {
			break
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
			continue
		}
		break
	}
	final := p.snapshot(time.Now())
	for _, s := range p.sinks {
		if err := s.Close(final); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	return final, runErr
}

func (p *Pipeline) allExited() bool {
	for _, pr := range p.procs {
		if !pr.Exited {
			return false
		}
	}
	return true
}

// live returns the pids still being watched.
func (p *Pipeline) live() []int {
	var out []int
	for _, pid := range p.order {
		if !p.procs[pid].Exited {
			out = append(out, pid)
		}
	}
	return out
}

func (p *Pipeline) poll(now time.Time) (*model.Snapshot, error) {
	pids := p.live()
	samples, err := p.fd.Poll(pids)
	if err != nil {
		return nil, err
	}
	for _, pid := range pids {
		pr := p.procs[pid]
		if !p.proc.Alive(pid) {
			// The kernel dropped its fds without close(): keep the last
			// observation as its final state and forget its kernel state.
			pr.Exited = true
			p.fd.Untrack(pid)
			p.sym.Forget(pid)
			p.det.Forget(pid)
			for k := range p.sites {
				if k.pid == pid {
					delete(p.sites, k)
				}
			}
			for _, f := range p.findings {
				if f.PID == pid && f.Active {
					p.record(f, now, false)
				}
			}
			slog.Debug("target exited", "pid", pid)
			continue
		}
		if limit, err := p.proc.NoFileLimit(pid); err == nil {
			pr.FD.Limit = limit
		}
		// comm changes at exec (run starts the command through a shell).
		if comm, err := p.proc.Comm(pid); err == nil {
			pr.Comm = comm
		}
		p.fill(pr, samples[pid])
		for _, f := range p.det.Observe(now, pr) {
			p.record(f, now, f.Active)
		}
	}
	return p.snapshot(now), nil
}

// record merges a detector verdict into the run's findings, keyed by kind,
// pid and first sighting.
func (p *Pipeline) record(f model.Finding, now time.Time, active bool) {
	f.Active = active
	if !active {
		f.LastSeen = now
	}
	for i := range p.findings {
		g := &p.findings[i]
		if g.Kind == f.Kind && g.PID == f.PID && g.FirstSeen.Equal(f.FirstSeen) {
			*g = f
			return
		}
	}
	p.findings = append(p.findings, f)
}

// fill turns a kernel sample into the model view, symbolizing the stacks
// holding the most live fds.
func (p *Pipeline) fill(pr *model.Process, s *fdtrack.Sample) {
	pr.FD.Open = len(s.FDs)
	pr.FD.Opened = kindMap(s.Opened[:])
	pr.FD.Closed = kindMap(s.Closed[:])
	bySite := map[*site]*model.FDSite{}
	for _, fd := range s.FDs {
		if fd.StackID < 0 {
			continue
		}
		st := p.site(siteKey{pr.PID, fd.StackID, fd.Callers})
		ms := bySite[st]
		if ms == nil {
			ms = &model.FDSite{StackID: st.id}
			bySite[st] = ms
		}
		ms.Opened = append(ms.Opened, fd.Opened)
	}
	sites := make([]model.FDSite, 0, len(bySite))
	byID := map[int64]*site{}
	for st, ms := range bySite {
		sites = append(sites, *ms)
		byID[st.id] = st
	}
	slices.SortFunc(sites, func(a, b model.FDSite) int {
		if len(a.Opened) != len(b.Opened) {
			return len(b.Opened) - len(a.Opened)
		}
		return int(a.StackID - b.StackID)
	})
	for i := range sites {
		if i >= p.cfg.TopSites {
			break
		}
		sites[i].Stack = p.frames(pr.PID, byID[sites[i].StackID])
	}
	pr.FD.Sites = sites
}

// site returns the call site of k, numbering new ones.
func (p *Pipeline) site(k siteKey) *site {
	st := p.sites[k]
	if st == nil {
		p.nextSite++
		st = &site{id: p.nextSite, key: k}
		p.sites[k] = st
	}
	return st
}

// frames symbolizes a site once: the kernel's frame-pointer stack merged
// with the scanned return addresses (glibc has no frame pointers).
func (p *Pipeline) frames(pid int, st *site) []string {
	if st.frames != nil {
		return st.frames
	}
	key := st.key
	fp, err := p.fd.Stack(key.stack)
	if err != nil {
		return nil
	}
	var scan []uint64
	for _, c := range key.callers {
		if c != 0 {
			scan = append(scan, c)
		}
	}
	st.frames = p.sym.Frames(pid, p.sym.Unwind(pid, fp, scan))
	return st.frames
}

func kindMap(counts []uint64) map[string]uint64 {
	m := make(map[string]uint64, len(counts))
	for i, n := range counts {
		if i < len(model.FDKinds) && n > 0 {
			m[model.FDKinds[i]] = n
		}
	}
	return m
}

func (p *Pipeline) snapshot(now time.Time) *model.Snapshot {
	s := &model.Snapshot{Time: now, Start: p.start, Targets: p.targets, Findings: slices.Clone(p.findings)}
	for _, pid := range p.order {
		pr := *p.procs[pid]
		s.Processes = append(s.Processes, &pr)
	}
	lost, err := p.fd.Lost()
	if err != nil {
		slog.Warn("reading BPF error counters", "err", err)
	}
	s.Lost = lost
	return s
}

// Skipped lists optional probes this kernel lacks.
func (p *Pipeline) Skipped() []string { return p.fd.Skipped() }

// Close unloads every BPF program and map.
func (p *Pipeline) Close() error {
	if p.fd == nil {
		return nil
	}
	err := p.fd.Close()
	p.fd = nil
	if err != nil {
		return fmt.Errorf("unloading BPF: %w", err)
	}
	return nil
}
