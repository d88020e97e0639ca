package report

import (
	"cmp"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// maxSitesPerKind bounds the call sites a report keeps per process and
// kind, the most held first, then the most made: the views symbolize 64.
const maxSitesPerKind = 100

// Sites are a process's call sites as of its last snapshot alive: GPU
// memory and fds held then and made since watching began. They are what
// the flame graphs are drawn from and what `report --pprof` writes.
type Sites struct {
	GPU  []GPUSite  `json:"gpu,omitempty"`
	FD   []FDSite   `json:"fd,omitempty"`
	Wait []WaitSite `json:"wait,omitempty"`
}

// WaitSite is one call site of host waits on the GPU: one API called
// from one stack.
type WaitSite struct {
	Stack      []model.Frame `json:"stack"`
	API        string        `json:"api"`
	Calls      uint64        `json:"calls"` // since watching began
	Seconds    float64       `json:"seconds"`
	MaxSeconds float64       `json:"max_seconds"`
	P50Seconds *float64      `json:"p50_seconds"` // upper bounds of the histogram's buckets
	P99Seconds *float64      `json:"p99_seconds"`
}

// GPUSite is one call site of device memory.
type GPUSite struct {
	Stack      []model.Frame `json:"stack"`
	LiveBytes  uint64        `json:"live_bytes"`
	LiveAllocs int           `json:"live_allocations"`
	AllocBytes uint64        `json:"alloc_bytes"` // since watching began, freed or not
	AllocCalls uint64        `json:"alloc_calls"`
}

// FDSite is one call site of fds.
type FDSite struct {
	Stack  []model.Frame `json:"stack"`
	Open   int           `json:"open"`
	Opened uint64        `json:"opened"` // since watching began
}

// sitesOf copies p's call sites; nil when it has none.
func sitesOf(p *model.Process) *Sites {
	s := &Sites{}
	for _, c := range p.CUDA.Sites {
		s.GPU = append(s.GPU, GPUSite{Stack: c.Stack, LiveBytes: c.Bytes, LiveAllocs: len(c.Allocs), AllocBytes: max(c.AllocBytes, c.Bytes), AllocCalls: max(c.AllocCalls, uint64(len(c.Allocs)))})
	}
	slices.SortStableFunc(s.GPU, func(a, b GPUSite) int {
		return cmp.Or(cmp.Compare(b.LiveBytes, a.LiveBytes), cmp.Compare(b.AllocBytes, a.AllocBytes))
	})
	s.GPU = s.GPU[:min(len(s.GPU), maxSitesPerKind)]
	for _, sites := range [][]model.FDSite{p.FD.Sites, p.FD.PastSites} {
		for _, f := range sites {
			s.FD = append(s.FD, FDSite{Stack: f.Stack, Open: len(f.Opened), Opened: max(f.OpenedTotal, uint64(len(f.Opened)))})
		}
	}
	slices.SortStableFunc(s.FD, func(a, b FDSite) int {
		return cmp.Or(cmp.Compare(b.Open, a.Open), cmp.Compare(b.Opened, a.Opened))
	})
	s.FD = s.FD[:min(len(s.FD), maxSitesPerKind)]
	// The views order them: most waited since the previous poll first.
	for _, w := range p.CUDA.Waits.Sites {
		s.Wait = append(s.Wait, WaitSite{Stack: w.Stack, API: w.API, Calls: w.Calls, Seconds: w.Seconds, MaxSeconds: w.MaxSeconds,
			P50Seconds: quantile(w.Histogram, 0.5), P99Seconds: quantile(w.Histogram, 0.99)})
	}
	slices.SortStableFunc(s.Wait, func(a, b WaitSite) int { return cmp.Compare(b.Seconds, a.Seconds) })
	s.Wait = s.Wait[:min(len(s.Wait), maxSitesPerKind)]
	if len(s.GPU) == 0 && len(s.FD) == 0 && len(s.Wait) == 0 {
		return nil
	}
	for i := range s.Wait {
		if s.Wait[i].Stack == nil {
			s.Wait[i].Stack = []model.Frame{}
		}
	}
	for i := range s.GPU {
		if s.GPU[i].Stack == nil {
			s.GPU[i].Stack = []model.Frame{}
		}
	}
	for i := range s.FD {
		if s.FD[i].Stack == nil {
			s.FD[i].Stack = []model.Frame{}
		}
	}
	return s
}

// Model returns the sites as the views give them, for the profiles.
func (s *Sites) Model() *model.Process {
	p := &model.Process{}
	if s == nil {
		return p
	}
	for _, g := range s.GPU {
		c := model.CUDASite{Stack: g.Stack, Bytes: g.LiveBytes, AllocBytes: g.AllocBytes, AllocCalls: g.AllocCalls}
		c.Allocs = make([]time.Time, g.LiveAllocs)
		p.CUDA.Sites = append(p.CUDA.Sites, c)
	}
	for _, f := range s.FD {
		p.FD.Sites = append(p.FD.Sites, model.FDSite{Stack: f.Stack, Opened: make([]time.Time, f.Open), OpenedTotal: f.Opened})
	}
	for _, w := range s.Wait {
		p.CUDA.Waits.Sites = append(p.CUDA.Waits.Sites, model.CUDAWaitSite{Stack: w.Stack, API: w.API, Calls: w.Calls, Seconds: w.Seconds, MaxSeconds: w.MaxSeconds})
	}
	return p
}
