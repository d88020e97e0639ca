package gpualloc

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/series"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// exhaustion is how long a leak has until the memory it draws on runs out.
type exhaustion struct {
	headroom uint64 // bytes the process can still take
	of       string // what bounds them: "device" (NVML's free memory) or "budget"
	what     string // what happens then, for the summary
	known    bool   // seconds is set: a headroom is known and live bytes grow
	seconds  float64
}

// exhaustion returns the time left at growth bytes/s: against the free
// memory of the fullest device the process uses, and against MemoryBudget,
// whichever runs out first.
func (d *Detector) exhaustion(p *model.Process, growth float64) exhaustion {
	var e exhaustion
	if free, ok := d.deviceFree(p.PID); ok {
		e = exhaustion{headroom: free, of: "device", what: "device full"}
	}
	if b := d.cfg.MemoryBudget; b > 0 {
		// The GPU's own figure where there is one: it counts what the
		// hooks do not see (context, caches).
		used := p.CUDA.LiveBytes
		if p.CUDA.HasNVML {
			used = p.CUDA.NVMLUsedBytes
		}
		if left := b - min(used, b); e.of == "" || left < e.headroom {
			e = exhaustion{headroom: left, of: "budget", what: human(float64(b)) + " budget used up"}
		}
	}
	if e.of != "" && growth > 0 {
		e.known, e.seconds = true, float64(e.headroom)/growth
	}
	return e
}

// deviceFree is the free memory of the fullest GPU pid uses, as NVML last
// sampled it. A process NVML does not list (no permission, some containers)
// is taken to use the only GPU when there is one.
func (d *Detector) deviceFree(pid int) (uint64, bool) {
	used := d.devicesOf(pid)
	if len(used) == 0 {
		return 0, false
	}
	free := uint64(math.MaxUint64)
	for _, g := range used {
		free = min(free, g.MemoryTotal-min(g.MemoryUsed, g.MemoryTotal))
	}
	return free, true
}

// devicesOf returns the GPUs pid uses, as NVML last sampled them; the only
// GPU when NVML does not list the process (no permission, some
// containers); none without NVML.
func (d *Detector) devicesOf(pid int) []model.GPU {
	if d.cfg.Devices == nil {
		return nil
	}
	gpus := d.cfg.Devices()
	var used []model.GPU
	for _, g := range gpus {
		if _, ok := g.Processes[pid]; ok {
			used = append(used, g)
		}
	}
	if len(used) == 0 && len(gpus) == 1 {
		used = gpus
	}
	return used
}

// nearFull says what a process whose live device bytes peaked at peak came
// close to, within NearFullShare: MemoryBudget, or the memory of a device
// it uses at its most used since the previous poll; "" for neither.
func (d *Detector) nearFull(pid int, peak uint64) string {
	share := d.cfg.NearFullShare
	if b := d.cfg.MemoryBudget; b > 0 && float64(peak) >= share*float64(b) {
		return fmt.Sprintf("within %.0f %% of the %s budget", 100*(1-share), human(float64(b)))
	}
	for _, g := range d.devicesOf(pid) {
		if g.MemoryTotal > 0 && float64(max(g.MemoryUsedMax, g.MemoryUsed)) >= share*float64(g.MemoryTotal) {
			return fmt.Sprintf("GPU %s within %.0f %% of its %s", g.Label(), 100*(1-share), human(float64(g.MemoryTotal)))
		}
	}
	return ""
}

// evidence records e: the time to exhaustion (nil when not known), the
// headroom and what bounds it (nil without NVML or a budget).
func (e exhaustion) evidence(ev *model.GPUMemoryLeakEvidence) {
	if e.of != "" {
		ev.HeadroomBytes, ev.HeadroomOf = new(e.headroom), new(e.of)
	}
	if e.known {
		ev.TimeToExhaustionSeconds = new(series.Round(e.seconds, 1))
	}
}

// Bytes is a byte count on the command line (--gpu-memory-budget): a whole
// number of bytes, or a number with a binary unit, KiB, MiB, GiB or TiB
// (case does not matter; 1.5GiB is rounded down to a whole byte). It is a
// pflag.Value.
type Bytes uint64

var byteUnits = []struct {
	name  string
	shift uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}}

// Set parses s.
func (b *Bytes) Set(s string) error {
	num, shift := strings.TrimSpace(s), uint(0)
	for _, u := range byteUnits {
		if len(num) > len(u.name) && strings.EqualFold(num[len(num)-len(u.name):], u.name) {
			num, shift = strings.TrimSpace(num[:len(num)-len(u.name)]), u.shift
			break
		}
	}
	if n, err := strconv.ParseUint(num, 10, 64); err == nil && n <= math.MaxUint64>>shift {
		*b = Bytes(n << shift)
		return nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f*float64(uint64(1)<<shift) >= math.MaxUint64 {
		return fmt.Errorf("%q is not a byte count (a number of bytes, or with KiB, MiB, GiB or TiB)", s)
	}
	*b = Bytes(f * float64(uint64(1)<<shift))
	return nil
}

// String renders b in the largest unit that divides it, e.g. 80GiB.
func (b Bytes) String() string {
	for _, u := range byteUnits {
		if b != 0 && uint64(b)%(1<<u.shift) == 0 {
			return strconv.FormatUint(uint64(b)>>u.shift, 10) + u.name
		}
	}
	return strconv.FormatUint(uint64(b), 10)
}

// Type names the value in flag usage.
func (b *Bytes) Type() string { return "bytes" }
