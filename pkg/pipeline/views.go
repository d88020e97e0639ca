package pipeline

import (
	"fmt"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/cudatrack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/ctxstorm"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/fdexhaust"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/fdleak"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/gpualloc"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/gpuxid"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/ncclstall"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/sockleak"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/syncstorm"
	"github.com/open-autoglm/autoglm-ebpf/pkg/fdtrack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/features"
	"github.com/open-autoglm/autoglm-ebpf/pkg/gpunode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/nccltrack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/offcpu"
	"github.com/open-autoglm/autoglm-ebpf/pkg/schedtrack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/socktrack"
)

// view is one kernel-side view as the pipeline loads and polls it.
type view struct {
	name string
	// required: the tool cannot run without it. New fails when it does
	// not load, and a process it cannot track is not watched.
	required bool
	// after names the views whose figures its fill reads: it is filled
	// after them in each poll.
	after []string
	// carries names the views its BPF object carries: up and down with it.
	carries []string
	load    func() (Concern, error)
	// check runs the view's probes for `check`, loading its object as a
	// run would; up: it would run. finds is what check's verdict says the
	// view finds when it is up.
	check func() (rs []features.Result, up bool)
	finds string
}

// views are the kernel-side views, in the order they fill each poll.
func (p *Pipeline) views() []view {
	cfg := p.cfg
	return ordered([]view{
		{name: "fd", required: true, carries: []string{"python"}, check: fdtrack.Check, finds: "fd leaks", load: func() (Concern, error) {
			// Children are tracked from their fork where they are
			// watched: their inherited fds come from the parent's table.
			return fdtrack.NewConcern(fdtrack.Config{MaxFDs: cfg.MaxFDs, ProcRoot: cfg.ProcRoot, Cache: p.cache, Stacks: p.stacks,
				Follow: cfg.Children || cfg.Daemon, ReadsPerPoll: cfg.FDReadsPerPoll, Tracked: p.tracked}, p.sym, cfg.TopSites)
		}},
		{name: "sched", check: schedtrack.Check, finds: "context-switch storms", load: func() (Concern, error) {
			return schedtrack.NewConcern(schedtrack.Config{ProcRoot: cfg.ProcRoot, Tracked: p.tracked})
		}},
		// The fd view's socket counts and opening stacks name what a
		// socket leak holds.
		{name: "sock", after: []string{"fd"}, check: socktrack.Check, finds: "socket leaks", load: func() (Concern, error) {
			return socktrack.NewConcern(socktrack.Config{ProcRoot: cfg.ProcRoot, Cache: p.cache, ProcTables: cfg.SockProcTables, Tracked: p.tracked})
		}},
		{name: "cuda", check: cudatrack.Check, finds: "GPU allocations", load: func() (Concern, error) {
			// A failure that is not out of memory is snapshotted where
			// NVML had its device full at that instant.
			return cudatrack.New(cudatrack.Config{MaxAllocs: cfg.MaxAllocs, Launches: cfg.Launches, ProcRoot: cfg.ProcRoot, TopSites: cfg.TopSites, Cache: p.cache, Symbolizer: p.sym, Stacks: p.stacks, Tracked: p.tracked,
				DeviceFull: p.gpu.DeviceFull}, p.sym)
		}},
		{name: "nccl", check: nccltrack.Check, finds: "NCCL progress per rank", load: func() (Concern, error) {
			return nccltrack.New(nccltrack.Config{ProcRoot: cfg.ProcRoot, Cache: p.cache, Symbolizer: p.sym, Stacks: p.stacks, Tracked: p.tracked}, p.sym)
		}},
	})
}

// Checks runs each view's probes for `check`, in the order the views fill,
// and lists what the views that would run find. A view that would not run
// where it is not expected (devs: the node's GPUs) is absent: its failed
// probes say so, and absent lists it with why.
func Checks(devs gpunode.Devices) (rs []features.Result, finds []string, absent map[string]model.Absence) {
	var p Pipeline // the views' descriptors only: none is loaded
	absent = map[string]model.Absence{}
	for _, v := range p.views() {
		got, up := v.check()
		if up {
			finds = append(finds, v.finds)
		} else if a := devs.Absence(v.name, nil); a != "" {
			absent[v.name] = a
			for i := range got {
				if !got[i].OK {
					got[i].Absent = a
				}
			}
		}
		rs = append(rs, got...)
	}
	// Not a view: loaded by a run only once it suspects a straggling
	// NCCL rank, whose threads' stacks it takes.
	rs = append(rs, offcpu.Check())
	return rs, finds, absent
}

// ordered returns vs with each view after those it names in after, in
// registration order otherwise. A view naming one not registered, or a
// cycle, is a programming error.
func ordered(vs []view) []view {
	var out []view
	placed := map[string]bool{}
	for len(out) < len(vs) {
		progress := false
		for _, v := range vs {
			if placed[v.name] || slices.ContainsFunc(v.after, func(n string) bool { return !placed[n] }) {
				continue
			}
			out = append(out, v)
			placed[v.name] = true
			progress = true
			break // the earliest registered of those ready first
		}
		if !progress {
			panic(fmt.Sprintf("views: the order of %v cannot satisfy their after lists", vs))
		}
	}
	return out
}

// Detector judges one process at a time, each poll, on the figures of the
// views it needs; Forget drops what it keeps of an exited process.
type Detector interface {
	Observe(now time.Time, p *model.Process) []model.Finding
	Forget(pid int)
}

// judge is a detector and the view whose figures it judges: it runs on
// the processes that view filled this poll ("nvml": joined with NVML's
// figures), and not at all while it is down. Each reads one view; what it
// may read of another (sockleak the fd view's limit) is filled by then.
type judge struct {
	need string
	det  Detector
}

// registered are the per-process detectors, in the order they run.
func (p *Pipeline) registered() []judge {
	// A GPU leak's time to exhaustion is judged against the devices'
	// free memory as NVML samples it.
	gpuAlloc := p.cfg.GPUAlloc
	gpuAlloc.Devices = p.gpu.GPUs
	return []judge{
		{"fd", fdleak.New(p.cfg.FDLeak)},
		{"fd", fdexhaust.New(fdexhaust.Config{})},
		{"sched", ctxstorm.New(p.cfg.CtxStorm)},
		{"sock", sockleak.New(p.cfg.SockLeak)},
		{"cuda", gpualloc.New(gpuAlloc)},
		// It reads NVML's utilization where there is one, joined by then.
		{"cuda", syncstorm.New(syncstorm.Config{})},
		{"nvml", gpuxid.New(gpuxid.DefaultConfig())},
	}
}

// AcrossDetector judges together the processes a view filled each poll:
// what one process does only means something beside the others (the
// ranks of a communicator). Forget drops what it keeps of an exited
// process.
type AcrossDetector interface {
	Observe(now time.Time, procs []*model.Process) []model.Finding
	Forget(pid int)
}

// acrossJudge is an AcrossDetector and the view whose processes it
// judges, as judge is.
type acrossJudge struct {
	need string
	det  AcrossDetector
}

// registeredAcross are the detectors across processes, in the order they
// run after the per-process ones.
func (p *Pipeline) registeredAcross() ([]acrossJudge, error) {
	// Where a straggling rank's threads are: their states read from /proc,
	// their stacks taken as they leave the CPU, only for it.
	threads, err := ncclstall.ProcThreads(p.cfg.ProcRoot)
	if err != nil {
		return nil, err
	}
	return []acrossJudge{
		{"nccl", ncclstall.New(p.cfg.NCCLStall, threads, p.offcpu)},
	}, nil
}

// Annotator is a concern that adds to findings what only its source can
// say (the fd view: what a leak's fds point at, from /proc).
type Annotator interface {
	Annotate(p *model.Process, f *model.Finding)
}

// judge runs a poll's fill, enrich and detect phases over observe, the
// live watched processes, and returns the findings: new, updated or just
// ended.
func (p *Pipeline) judge(now time.Time, observe []*model.Process) ([]model.Finding, error) {
	// Fill: each view's part of the processes it tracks, in view order.
	filled := map[string][]*model.Process{}
	for _, c := range p.concerns {
		procs := observe
		if skip := p.untracked[c.Name()]; len(skip) > 0 {
			procs = slices.DeleteFunc(slices.Clone(observe), func(pr *model.Process) bool { return skip[pr.PID] })
		}
		got, err := c.Fill(now, procs)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name(), err)
		}
		filled[c.Name()] = got
	}
	// Enrich: NVML's figures, whichever views are up; the CUDA view's
	// live bytes, where it tracks the process, are filled by now. A
	// fault names the processes on its device that are among them.
	p.gpu.EnrichAll(observe)
	// The snapshots taken at failed allocations since the last poll are
	// completed before any detector hands them on in a finding: NVML's
	// sample of the failure's instant, who else was on its device.
	p.oom.Observe(now, observe)
	if p.status["nvml"].Down == "" {
		filled["nvml"] = observe
	}
	// Detect.
	var fresh []model.Finding
	for _, j := range p.judges {
		for _, pr := range filled[j.need] {
			for _, f := range j.det.Observe(now, pr) {
				p.annotate(pr, &f)
				fresh = append(fresh, f)
			}
		}
	}
	for _, j := range p.across {
		for _, f := range j.det.Observe(now, filled[j.need]) {
			if pr := p.procs[f.PID]; pr != nil {
				p.annotate(pr, &f)
			}
			fresh = append(fresh, f)
		}
	}
	if p.bound != nil {
		// Across processes: a GPU process and the workers it waits on.
		fresh = append(fresh, p.bound.Observe(now, observe)...)
	}
	return fresh, nil
}

// annotate lets each view that tracks pr add to f what its source says.
func (p *Pipeline) annotate(pr *model.Process, f *model.Finding) {
	for _, c := range p.concerns {
		if a, ok := c.Concern.(Annotator); ok && !p.untracked[c.Name()][pr.PID] {
			a.Annotate(pr, f)
		}
	}
}
