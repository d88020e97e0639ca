package fdtrack

import (
	"cmp"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/topk"
)

// Concern is the fd concern as the pipeline sees it: the tracker, the
// symbolization of opening stacks, and what an fd leak's fds point at.
type Concern struct {
	*Tracker
	sym      *symbolize.Symbolizer
	topSites int
	sites    map[int]map[stacks.Site]*site // by pid: a process forgotten drops its own
	targets  map[findingKey]leakRead       // what each fd leak's fds point at
	limits   map[int]limitRead
	filled   map[int]grouped // by pid: the last grouping of its fds
}

// limitRead is a process's RLIMIT_NOFILE as last read from /proc.
type limitRead struct {
	limit  uint64
	polls  int    // since it was read
	failed uint64 // EMFILE failures when it was read
}

// limitEvery is how many polls a read RLIMIT_NOFILE is used before
// /proc/PID/limits is read again: a limit rarely changes after start
// (prlimit from outside), while reading and parsing the file each poll for
// each long-lived process cost more than its fd table. Close to the limit,
// and when fds fail with EMFILE (a process may lower its own limit), it is
// read each poll.
const limitEvery = 10

// site is an opening call site of one process.
type site struct {
	id     int64 // key.ID()
	key    stacks.Site
	frames []model.Frame // symbolized on first use
}

// NewConcern loads the fd BPF object. topSites bounds how many opening stacks
// per process are symbolized (largest first, each once), so that the site a
// finding names has its frames.
func NewConcern(cfg Config, sym *symbolize.Symbolizer, topSites int) (*Concern, error) {
	if cfg.Symbolizer == nil {
		cfg.Symbolizer = sym
	}
	t, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &Concern{Tracker: t, sym: sym, topSites: topSites, sites: map[int]map[stacks.Site]*site{}, targets: map[findingKey]leakRead{}, limits: map[int]limitRead{}, filled: map[int]grouped{}}, nil
}

// Name is the concern's name in logs and `check`.
func (c *Concern) Name() string { return "fd" }

// Untrack drops the kernel state of an exited process and what was read of it.
func (c *Concern) Untrack(pid int) {
	c.Tracker.Untrack(pid)
	delete(c.sites, pid)
	delete(c.limits, pid)
	delete(c.filled, pid)
	for k := range c.targets {
		if k.pid == pid {
			delete(c.targets, k)
		}
	}
}

// Fill fills the fd part of each process; it returns them all.
func (c *Concern) Fill(now time.Time, procs []*model.Process) ([]*model.Process, error) {
	pids := make([]int, len(procs))
	for i, p := range procs {
		pids[i] = p.PID
		c.stacks.Refresh(p.PID, now)
	}
	samples, err := c.Poll(pids)
	if err != nil {
		return nil, err
	}
	for _, p := range procs {
		c.fill(p, samples[p.PID])
		p.FD.Limit = c.limit(p)
	}
	return procs, nil
}

// limit returns the soft RLIMIT_NOFILE of p: read again every limitEvery
// polls, and at each poll once p holds over half of it or fails with
// EMFILE. 0 when it cannot be read.
func (c *Concern) limit(p *model.Process) uint64 {
	l, ok := c.limits[p.PID]
	failed := p.FD.Failed["EMFILE"]
	if !ok || l.polls >= limitEvery || uint64(p.FD.Open) > l.limit/2 || failed != l.failed {
		n, err := c.proc.NoFileLimit(p.PID)
		if err != nil {
			return l.limit
		}
		l = limitRead{limit: n, failed: failed}
	}
	l.polls++
	c.limits[p.PID] = l
	return l.limit
}

// fill turns a kernel sample into the model view.
func (c *Concern) fill(pr *model.Process, s *Sample) {
	pr.FD.Open = len(s.FDs)
	pr.FD.Opened = kindMap(s.Opened[:])
	pr.FD.Closed = kindMap(s.Closed[:])
	// Both errnos, zeros included: a failure counter that exists before
	// the first failure lets rate() and increase() see that failure.
	pr.FD.Failed = make(map[string]uint64, len(model.FDErrnos))
	for i, name := range model.FDErrnos {
		pr.FD.Failed[name] = s.Failed[i]
	}
	pr.FD.OpenAtAttach = s.AtStart
	pr.FD.LastFailure = nil
	if lf := s.LastFailure; lf != nil {
		st := c.site(pr.PID, siteOf(*lf))
		pr.FD.LastFailure = &model.FDFailure{Time: lf.Opened, Kind: kindName(lf.Kind), StackID: st.id, Stack: c.frames(pr.PID, st)}
	}
	f, ok := c.filled[pr.PID]
	if !ok || len(f.fds) != len(s.FDs) || len(s.FDs) > 0 && &f.fds[0] != &s.FDs[0] {
		f = c.group(pr.PID, s.FDs)
		c.filled[pr.PID] = f
	}
	pr.FD.OpenSockets = f.sockets
	// A copy: the stacks are set on it, and snapshots share the last one.
	sites := slices.Clone(f.sites)
	held := make(map[stacks.Site]bool, len(sites))
	for i := range sites {
		st := f.byID[sites[i].StackID]
		held[st.key] = true
		n := s.Sites[st.key]
		sites[i].OpenedTotal, sites[i].ClosedTotal = n.Made, n.Released
		if i < c.topSites {
			sites[i].Stack = c.frames(pr.PID, st)
		}
	}
	pr.FD.Sites = sites
	pr.FD.PastSites = c.past(pr.PID, s.Sites, held)
}

// past returns the sites of pid that opened fds and hold none: the
// topSites most opened first, in that order and symbolized, then the others
// as they come. Its readers (the report, the profiles) rank what they
// need; sorting them all each poll would cost what they grow to.
func (c *Concern) past(pid int, counts map[stacks.Site]stacks.Counts, held map[stacks.Site]bool) []model.FDSite {
	type pastSite struct {
		st *site
		n  stacks.Counts
	}
	var ps []pastSite
	for key, n := range counts {
		if !held[key] && n.Made > 0 {
			ps = append(ps, pastSite{c.site(pid, key), n})
		}
	}
	top := topk.Of(ps, c.topSites, func(a, b pastSite) int {
		return cmp.Or(cmp.Compare(b.n.Made, a.n.Made), cmp.Compare(a.st.id, b.st.id))
	})
	out := make([]model.FDSite, 0, len(ps))
	named := make(map[*site]bool, len(top))
	for _, p := range top {
		named[p.st] = true
		out = append(out, model.FDSite{StackID: p.st.id, OpenedTotal: p.n.Made, ClosedTotal: p.n.Released, Stack: c.frames(pid, p.st)})
	}
	for _, p := range ps {
		if !named[p.st] {
			out = append(out, model.FDSite{StackID: p.st.id, OpenedTotal: p.n.Made, ClosedTotal: p.n.Released})
		}
	}
	return out
}

// grouped is a process's fds grouped by call site, largest first.
type grouped struct {
	fds     []FD // what was grouped: the tracker hands the same slice while the fds stay
	sites   []model.FDSite
	byID    map[int64]*site
	sockets int
}

// group groups the fds of pid by call site.
func (c *Concern) group(pid int, fds []FD) grouped {
	bySite := map[*site]*model.FDSite{}
	g := grouped{fds: fds, byID: map[int64]*site{}}
	for _, fd := range fds {
		if kindName(fd.Kind) == "socket" {
			g.sockets++
		}
		if !fd.Known() {
			continue
		}
		st := c.site(pid, siteOf(fd))
		ms := bySite[st]
		if ms == nil {
			ms = &model.FDSite{StackID: st.id}
			bySite[st] = ms
		}
		ms.Opened = append(ms.Opened, fd.Opened)
		ms.FDs = append(ms.FDs, fd.Num)
	}
	g.sites = make([]model.FDSite, 0, len(bySite))
	for st, ms := range bySite {
		g.sites = append(g.sites, *ms)
		g.byID[st.id] = st
	}
	slices.SortFunc(g.sites, func(a, b model.FDSite) int {
		if len(a.Opened) != len(b.Opened) {
			return len(b.Opened) - len(a.Opened)
		}
		return int(a.StackID - b.StackID)
	})
	return g
}

// siteOf is the call site fd was opened at.
func siteOf(fd FD) stacks.Site { return stacks.Site{Stack: fd.StackID, Py: fd.PyStack} }

// site returns the call site k of pid.
func (c *Concern) site(pid int, k stacks.Site) *site {
	of := c.sites[pid]
	if of == nil {
		of = map[stacks.Site]*site{}
		c.sites[pid] = of
	}
	st := of[k]
	if st == nil {
		st = &site{id: k.ID(), key: k}
		of[k] = st
	}
	return st
}

// frames symbolizes a site once, its Python frames merged in.
func (c *Concern) frames(pid int, st *site) []model.Frame {
	if st.frames == nil {
		st.frames = c.stacks.Frames(pid, st.key)
	}
	return st.frames
}

// kindName names an fd kind of the BPF side.
func kindName(k uint8) string {
	if int(k) < len(model.FDKinds) {
		return model.FDKinds[k]
	}
	return model.FDKinds[0]
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
