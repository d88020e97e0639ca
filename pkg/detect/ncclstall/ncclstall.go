// Package ncclstall finds the ranks of an NCCL job that hold it up, among
// the processes of one node: a rank whose collectives fell behind its
// peers' and stopped (nccl_straggler, on that rank's process: a data
// loader that stalled, a thread stuck in I/O) and a communicator none of
// whose ranks progresses, all at the same count (nccl_hang: what holds it
// is on another node, or outside NCCL).
//
// It judges model.NCCLStats, filled by the NCCL view, per communicator id
// over the ranks on this node; the cross-node comparison is the shipped
// Prometheus rule's. Collectives are synchronising: a rank that stops
// holds its peers at most a collective or a few ahead, so the lagging
// rank is the one to look at, and where its threads are says why.
package ncclstall

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/episode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Config holds the thresholds. Zero fields take DefaultConfig's values.
type Config struct {
	// Stall is how long a rank makes no collective before it is judged.
	Stall time.Duration
}

// DefaultConfig returns the thresholds used when none are given.
func DefaultConfig() Config { return Config{Stall: 60 * time.Second} }

// Threads reads where a process's threads are; the pipeline's reads /proc.
type Threads func(pid int) []model.NCCLThread

// Where takes the user stacks of the threads of suspected ranks as they
// leave the CPU (pkg/offcpu); the pipeline's loads its BPF object at the
// first suspect.
type Where interface {
	// Watch names the processes to take stacks of from now on, every poll
	// (none: nothing suspected).
	Watch(now time.Time, pids []int)
	// Stacks are pid's threads' latest stacks by tid; why says why there
	// are none ("" when they are taken).
	Stacks(pid int) (stacks map[int][]model.Frame, why string)
}

// Detector keeps each rank's progress. Not safe for concurrent use.
type Detector struct {
	cfg     Config
	threads Threads
	where   Where
	ranks   map[rankKey]*progress
	// One episode per process and kind: a process that stalls lags in all
	// its communicators at once (data parallel, tensor parallel), and a
	// finding is identified by kind, pid and first sighting.
	straggling map[int]*episode.Episode
	hung       map[int]*episode.Episode
}

type rankKey struct {
	comm string
	pid  int
	rank int
}

// progress is a rank's count, when it last changed, and since when it has
// been behind the most of its communicator on this node (zero: it is not).
type progress struct {
	count  uint64
	at     time.Time
	behind time.Time
}

// member is a rank as one poll sees it.
type member struct {
	p    *model.Process
	c    *model.NCCLComm
	n    uint64
	idle time.Duration // since its last progress
	pr   *progress
}

// New returns a detector; threads and where (nil: none read) say where a
// straggling rank's threads are: their states, and their stacks.
func New(cfg Config, threads Threads, where Where) *Detector {
	cfg.Stall = cmp.Or(cfg.Stall, DefaultConfig().Stall)
	return &Detector{cfg: cfg, threads: threads, where: where, ranks: map[rankKey]*progress{},
		straggling: map[int]*episode.Episode{}, hung: map[int]*episode.Episode{}}
}

// Observe takes in one poll of the processes the NCCL view filled and
// returns the findings: new, updated, or just ended.
func (d *Detector) Observe(now time.Time, procs []*model.Process) []model.Finding {
	comms := map[string][]member{}
	seen := map[rankKey]bool{}
	for _, p := range procs {
		if p.Exited {
			continue
		}
		for i := range p.NCCL.Comms {
			c := &p.NCCL.Comms[i]
			// A handle set up before tracking began has no id: which
			// communicator it is, and so its peers, are not known.
			if c.Destroyed || c.ID == "" {
				continue
			}
			k := rankKey{c.ID, p.PID, c.Rank}
			seen[k] = true
			n := c.Collectives()
			pr := d.ranks[k]
			switch {
			case pr == nil:
				// First seen: its last call is its last progress, if the
				// view knows it (an agent started on a job already stuck).
				pr = &progress{count: n, at: now}
				if !c.LastTime.IsZero() && c.LastTime.Before(now) {
					pr.at = c.LastTime
				}
				d.ranks[k] = pr
			case pr.count != n:
				pr.count, pr.at = n, now
			}
			comms[c.ID] = append(comms[c.ID], member{p: p, c: c, n: n, idle: now.Sub(pr.at), pr: pr})
		}
	}
	for k := range d.ranks {
		if !seen[k] {
			delete(d.ranks, k)
		}
	}

	lags := map[int][]lag{}
	hangs := map[int][]model.NCCLHung{}
	byPID := map[int]*model.Process{}
	// Ranks behind and idle half the stall are suspected: their threads'
	// stacks are taken from then, so that the finding has them when it
	// opens.
	suspects := map[int]bool{}
	for _, id := range slices.Sorted(maps.Keys(comms)) {
		ms := comms[id]
		// One rank cannot be compared with anyone here: the cross-node
		// rule judges it.
		if len(ms) < 2 {
			continue
		}
		slices.SortFunc(ms, func(a, b member) int { return cmp.Or(a.c.Rank-b.c.Rank, a.p.PID-b.p.PID) })
		var most uint64
		stalled, even := true, true
		for _, m := range ms {
			most = max(most, m.n)
			stalled = stalled && m.idle >= d.cfg.Stall
			even = even && m.n == ms[0].n
		}
		if most == 0 {
			continue // set up, never used
		}
		for i, m := range ms {
			if m.n == most {
				m.pr.behind = time.Time{}
				continue
			}
			if m.pr.behind.IsZero() {
				m.pr.behind = now
			}
			if m.idle >= d.cfg.Stall/2 {
				suspects[m.p.PID] = true
			}
			// Its peers have waited on it for Stall, not only moved past
			// it: when a hung communicator resumes, its ranks pass each
			// other, and none of them is a straggler.
			if m.idle < d.cfg.Stall || now.Sub(m.pr.behind) < d.cfg.Stall {
				continue
			}
			byPID[m.p.PID] = m.p
			lags[m.p.PID] = append(lags[m.p.PID], lag{m: m, most: most, peers: slices.Delete(slices.Clone(ms), i, i+1)})
		}
		// A hang has nobody ahead: where counts differ, the ranks behind
		// are waited for (stragglers, once they have been for Stall).
		if stalled && even {
			low := ms[0]
			byPID[low.p.PID] = low.p
			h := model.NCCLHung{Communicator: id, NRanks: low.c.NRanks, Collectives: most}
			for _, m := range ms {
				h.Ranks = append(h.Ranks, rankOf(m))
			}
			hangs[low.p.PID] = append(hangs[low.p.PID], h)
		}
	}

	if d.where != nil {
		d.where.Watch(now, slices.Sorted(maps.Keys(suspects)))
	}
	var out []model.Finding
	out = append(out, d.advance(now, model.KindNCCLStraggler, d.straggling, byPID, func(pid int) (model.Finding, bool) {
		ls := lags[pid]
		if len(ls) == 0 {
			return model.Finding{}, false
		}
		return d.straggler(byPID[pid], ls), true
	})...)
	out = append(out, d.advance(now, model.KindNCCLHang, d.hung, byPID, func(pid int) (model.Finding, bool) {
		hs := hangs[pid]
		if len(hs) == 0 {
			return model.Finding{}, false
		}
		return hang(byPID[pid], hs), true
	})...)
	// The pipeline ends the findings of a process that exits.
	for _, p := range procs {
		if p.Exited {
			d.Forget(p.PID)
		}
	}
	return out
}

// lag is a rank behind its communicator's most on this node.
type lag struct {
	m     member
	most  uint64
	peers []member
}

// advance moves each process's episode of kind on: judge says whether the
// process holds the condition now, and its finding if so.
func (d *Detector) advance(now time.Time, kind string, eps map[int]*episode.Episode, procs map[int]*model.Process,
	judge func(pid int) (model.Finding, bool)) []model.Finding {
	pids := slices.Collect(maps.Keys(eps))
	for pid := range procs {
		if _, ok := eps[pid]; !ok {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	var out []model.Finding
	for _, pid := range pids {
		f, held := judge(pid)
		ep := eps[pid]
		if ep == nil {
			if !held {
				continue
			}
			ep = &episode.Episode{}
			eps[pid] = ep
		}
		out = append(out, ep.Observe(now, kind, pid, episode.Rule{}, episode.Verdict{Raise: held},
			func(prev model.Finding, active bool) model.Finding {
				if !active {
					prev.Active, prev.LastSeen = false, now
					return prev
				}
				f.FirstSeen, f.LastSeen, f.Active = prev.FirstSeen, now, true
				return f
			})...)
		if !ep.Open() {
			delete(eps, pid)
		}
	}
	return out
}

func (d *Detector) straggler(p *model.Process, ls []lag) model.Finding {
	ev := model.NCCLStragglerEvidence{}
	var names []string
	var stack []model.Frame
	for _, l := range ls {
		c := l.m.c
		nl := model.NCCLLag{Communicator: c.ID, Rank: c.Rank, NRanks: c.NRanks, Collectives: l.m.n, Behind: l.most - l.m.n, LastCall: lastCall(c)}
		var peers []string
		for _, q := range l.peers {
			nl.Peers = append(nl.Peers, rankOf(q))
			peers = append(peers, fmt.Sprintf("%d", q.c.Rank))
		}
		ev.Communicators = append(ev.Communicators, nl)
		ev.StalledSeconds = max(ev.StalledSeconds, l.m.idle.Seconds())
		name := fmt.Sprintf("rank %d of %d in communicator %s: %d collectives, %d behind ranks %s", c.Rank, c.NRanks, short(c.ID), l.m.n, l.most-l.m.n, strings.Join(peers, ", "))
		if c.LastOp != "" {
			name += ", last " + c.LastOp
		}
		names = append(names, name)
		if stack == nil {
			stack = c.LastStack
		}
	}
	if d.threads != nil {
		ev.Threads = d.threads(p.PID)
	}
	if d.where != nil {
		var stacks map[int][]model.Frame
		stacks, ev.StacksUnavailable = d.where.Stacks(p.PID)
		for i := range ev.Threads {
			ev.Threads[i].Stack = stacks[ev.Threads[i].TID]
		}
	}
	slices.SortStableFunc(ev.Threads, func(a, b model.NCCLThread) int { return cmp.Compare(stateOrder(a.State), stateOrder(b.State)) })
	summary := fmt.Sprintf("NCCL straggler: no collective for %s while its peers on this node are ahead; %s",
		(time.Duration(ev.StalledSeconds) * time.Second).Round(time.Second), strings.Join(names, "; "))
	if w := threadsLine(ev.Threads); w != "" {
		summary += "; threads " + w
	}
	return model.Finding{Kind: model.KindNCCLStraggler, PID: p.PID, Comm: p.Comm, Severity: model.SeverityWarning,
		Summary: summary, Stack: stack, Evidence: ev}
}

func hang(p *model.Process, hs []model.NCCLHung) model.Finding {
	ev := model.NCCLHangEvidence{Communicators: hs}
	var names []string
	var stack []model.Frame
	for i, h := range hs {
		var ranks []string
		shortest := -1.0
		for _, r := range h.Ranks {
			ranks = append(ranks, fmt.Sprintf("%d (pid %d)", r.Rank, r.PID))
			if shortest < 0 || r.StalledSeconds < shortest {
				shortest = r.StalledSeconds
			}
			if stack == nil && r.LastCall != nil && r.PID == p.PID {
				stack = r.LastCall.Stack
			}
		}
		if i == 0 || shortest < ev.StalledSeconds {
			ev.StalledSeconds = shortest
		}
		names = append(names, fmt.Sprintf("communicator %s (%d ranks) at %d collectives, ranks %s on this node", short(h.Communicator), h.NRanks, h.Collectives, strings.Join(ranks, ", ")))
	}
	return model.Finding{Kind: model.KindNCCLHang, PID: p.PID, Comm: p.Comm, Severity: model.SeverityCritical,
		Summary: fmt.Sprintf("NCCL hang: no rank has made a collective for %s, none ahead: %s",
			(time.Duration(ev.StalledSeconds) * time.Second).Round(time.Second), strings.Join(names, "; ")),
		Stack: stack, Evidence: ev}
}

func rankOf(m member) model.NCCLRank {
	return model.NCCLRank{PID: m.p.PID, Comm: m.p.Comm, Rank: m.c.Rank, Collectives: m.n, StalledSeconds: m.idle.Seconds(), LastCall: lastCall(m.c)}
}

func lastCall(c *model.NCCLComm) *model.NCCLCall {
	if c.LastTime.IsZero() {
		return nil
	}
	return &model.NCCLCall{At: c.LastTime, Op: c.LastOp, Stack: c.LastStack}
}

// short is a communicator id as a summary names it: ids are long hashes.
func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// stateOrder puts the threads that say most first: blocked, then
// running, then the rest.
func stateOrder(s string) int {
	switch s {
	case "blocked":
		return 0
	case "running":
		return 1
	}
	return 2
}

// threadsLine names a few threads, their states and where they wait for
// the summary.
func threadsLine(ts []model.NCCLThread) string {
	var parts []string
	for _, t := range ts[:min(len(ts), 4)] {
		s := fmt.Sprintf("%s %d %s", t.Name, t.TID, t.State)
		if t.WaitChannel != "" {
			s += " in " + t.WaitChannel
		}
		if at := where(t.Stack); at != "" {
			s += " at " + at
		}
		parts = append(parts, s)
	}
	if len(ts) > 4 {
		parts = append(parts, fmt.Sprintf("%d more", len(ts)-4))
	}
	return strings.Join(parts, ", ")
}

// Forget drops what is kept of pid's ranks; its findings the pipeline ends.
func (d *Detector) Forget(pid int) {
	for k := range d.ranks {
		if k.pid == pid {
			delete(d.ranks, k)
		}
	}
	delete(d.straggling, pid)
	delete(d.hung, pid)
}

// whereFrames is how many of a stack's own frames the summary names.
const whereFrames = 3

// where names the code a thread waits in, innermost first: the first few
// frames of the program's own, past the system libraries it calls to
// sleep or block in (the C library, the dynamic loader, the vDSO), and the
// Python line it runs, if any.
func where(stack []model.Frame) string {
	var parts []string
	for _, f := range stack {
		if f.Kind == model.FramePython {
			parts = append(parts, f.String())
			break
		}
		if len(parts) == whereFrames || systemModule(f.Module) {
			continue
		}
		parts = append(parts, f.String())
	}
	return strings.Join(parts, " < ")
}

// systemModule reports whether module is a library every program waits in.
func systemModule(module string) bool {
	for _, p := range []string{"libc.so", "libc-", "libpthread", "ld-linux", "linux-vdso", "[vdso]"} {
		if strings.HasPrefix(module, p) {
			return true
		}
	}
	return false
}
