package nvml

import (
	"maps"
	"slices"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// A failed allocation is snapshotted in the kernel at its instant, but
// its snapshot is completed at the next poll (pkg/gpuoom), by which time
// the window's figures are a mix of before and after. The sampler thus
// keeps its latest samples whole, each with its time and every process on
// every device, and At hands out the one of a given instant.

// recentSamples bounds the samples kept for At.
const recentSamples = 64

// Sample is one reading of every device (GPUs and MIG instances): when it
// was taken, and what each device held then.
type Sample struct {
	Time time.Time
	GPUs []model.GPU // as GPUs has them; MemoryUsedMin and MemoryUsedMax unset
}

// remember keeps x among the recent samples. s.mu is held. Those taken
// before the Roll before last are dropped: a failure the pipeline has yet
// to complete is at most a poll old, and one more poll is the margin. At
// most recentSamples are kept: past that one is dropped where they are
// densest (the interior sample whose neighbours are closest together),
// which spreads them over the span kept whatever the sampling interval,
// the oldest and the newest always kept.
func (s *Sampler) remember(x Sample) {
	s.recent = append(s.recent, x)
	old := 0
	for old < len(s.recent)-1 && s.recent[old].Time.Before(s.rolled[0]) {
		old++
	}
	s.recent = slices.Delete(s.recent, 0, old)
	if len(s.recent) <= recentSamples {
		return
	}
	span := func(i int) time.Duration { return s.recent[i+1].Time.Sub(s.recent[i-1].Time) }
	drop := 1
	for i := 2; i < len(s.recent)-1; i++ {
		if span(i) < span(drop) {
			drop = i
		}
	}
	s.recent = slices.Delete(s.recent, drop, drop+1)
}

// nearest returns the kept sample nearest t: the newest taken at or
// before t, else the first after. Before is preferred: it is what the
// devices held when the call at t asked, where one after may already show
// the memory freed, or the process gone. s.mu is held.
func (s *Sampler) nearest(t time.Time) (Sample, bool) {
	if len(s.recent) == 0 {
		return Sample{}, false
	}
	i, exact := slices.BinarySearchFunc(s.recent, t, func(x Sample, t time.Time) int { return x.Time.Compare(t) })
	if !exact && i > 0 {
		i--
	}
	return s.recent[i], true
}

// At returns the kept sample nearest t (the newest at or before t, else
// the first after), its maps the caller's; false before Start succeeds.
// The samples kept reach back to the Roll before last, at most
// recentSamples of them spread over that span.
func (s *Sampler) At(t time.Time) (Sample, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, ok := s.nearest(t)
	if !ok {
		return Sample{}, false
	}
	gpus := make([]model.GPU, len(x.GPUs))
	for i, g := range x.GPUs {
		g.Processes = maps.Clone(g.Processes)
		gpus[i] = g
	}
	return Sample{Time: x.Time, GPUs: gpus}, true
}

// DeviceFull reports whether a device that listed pid in the sample
// nearest t (as At picks it) had at least model.SnapshotFullShare of its
// memory in use: cudatrack.Config.DeviceFull. On a GPU in MIG mode the
// devices are its instances, each with its own memory. A process NVML
// lists without a memory figure (no permission) is on no device here.
func (s *Sampler) DeviceFull(pid int, t time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	x, ok := s.nearest(t)
	if !ok {
		return false
	}
	for _, g := range x.GPUs {
		if _, on := g.Processes[pid]; on && g.MemoryTotal > 0 && float64(g.MemoryUsed) >= model.SnapshotFullShare*float64(g.MemoryTotal) {
			return true
		}
	}
	return false
}
