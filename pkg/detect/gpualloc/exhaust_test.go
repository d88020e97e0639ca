package gpualloc

import (
	"math"
	"strings"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/series"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// leakAt20MiBs runs a 1 GiB pool and a 20 MiB/s leak from 10s under d and
// returns the leak finding's first report. join, if set, adjusts each
// sample of the process (as NVML's join does).
func leakAt20MiBs(t *testing.T, d *Detector, s *sim, join func(p *model.Process)) report {
	t.Helper()
	for sec := 0; sec <= 40; sec++ {
		now := at(sec)
		if sec == 1 {
			s.alloc(poolSite, 4, 256*mib, now)
		}
		if sec >= 10 {
			s.alloc(cacheSite, 5, 4*mib, now)
		}
		p := s.process(42)
		if join != nil {
			join(p)
		}
		for _, f := range d.Observe(now, p) {
			if f.Kind == model.KindGPUMemoryLeak {
				return report{sec, f}
			}
		}
	}
	t.Fatal("leak not found")
	return report{}
}

func TestExhaustionDevice(t *testing.T) {
	s := newSim(1)
	cfg := DefaultConfig()
	// An 80 GiB device; other processes use 77 GiB. NVML lists ours with
	// its live bytes plus a 500 MiB context.
	const total, others, context = 80 * gib, 77 * gib, 500 * mib
	cfg.Devices = func() []model.GPU {
		used := s.liveBytes + context
		return []model.GPU{
			{Index: 0, MemoryTotal: total, MemoryUsed: others + used, Processes: map[int]uint64{7: others, 42: used}},
			{Index: 1, MemoryTotal: total, MemoryUsed: 1 * gib, Processes: map[int]uint64{8: 1 * gib}},
		}
	}
	r := leakAt20MiBs(t, New(cfg), s, nil)
	ev := r.f.Evidence.(model.GPUMemoryLeakEvidence)
	free := float64(total - others - context - s.liveBytes)
	t.Logf("at %ds: %s", r.sec, r.f.Summary)
	if val(ev.HeadroomOf) != "device" || val(ev.HeadroomBytes) != uint64(free) {
		t.Errorf("headroom %v of %v, want %.0f of the device", val(ev.HeadroomBytes), val(ev.HeadroomOf), free)
	}
	want := free / (20 * mib)
	if ev.TimeToExhaustionSeconds == nil {
		t.Fatal("time_to_exhaustion_seconds null")
	}
	if got := *ev.TimeToExhaustionSeconds; math.Abs(got-want) > 0.05*want {
		t.Errorf("time_to_exhaustion_seconds %v, want %.0f", got, want)
	}
	if r.f.Severity != model.SeverityCritical || !strings.HasSuffix(r.f.Summary, "; device full in ~"+series.RoughSeconds(want)+" at this rate") {
		t.Errorf("severity %s, summary %q", r.f.Severity, r.f.Summary)
	}
}

func TestExhaustionDeviceNotListed(t *testing.T) {
	for _, tc := range []struct {
		name  string
		gpus  int
		known bool
	}{{"the only GPU", 1, true}, {"one of two GPUs", 2, false}} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Devices = func() []model.GPU {
				var gpus []model.GPU
				for i := range tc.gpus {
					gpus = append(gpus, model.GPU{Index: i, MemoryTotal: 80 * gib, MemoryUsed: 40 * gib, Processes: map[int]uint64{}})
				}
				return gpus
			}
			ev := leakAt20MiBs(t, New(cfg), newSim(1), nil).f.Evidence.(model.GPUMemoryLeakEvidence)
			if got := ev.HeadroomBytes != nil; got != tc.known {
				t.Errorf("headroom %v, want known %v", val(ev.HeadroomBytes), tc.known)
			}
			if tc.known && val(ev.HeadroomBytes) != uint64(40*gib) {
				t.Errorf("headroom %v, want 40 GiB", val(ev.HeadroomBytes))
			}
		})
	}
}

func TestExhaustionBudget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		budget   uint64
		nvml     bool   // NVML lists the process, 500 MiB above our live bytes
		device   uint64 // free memory of its device; 0 without NVML's devices
		of       string
		critical bool
	}{
		{"budget without NVML", 4 * gib, false, 0, "budget", true},
		{"budget against NVML's figure", 4 * gib, true, 0, "budget", true},
		{"budget before the device", 4 * gib, true, 100 * gib, "budget", true},
		{"device before the budget", 400 * gib, true, 2 * gib, "device", true},
		{"far budget", 80 * gib, false, 0, "budget", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(1)
			cfg := DefaultConfig()
			cfg.MemoryBudget = tc.budget
			if tc.device > 0 {
				cfg.Devices = func() []model.GPU {
					return []model.GPU{{MemoryTotal: 200 * gib, MemoryUsed: 200*gib - tc.device, Processes: map[int]uint64{42: s.liveBytes}}}
				}
			}
			r := leakAt20MiBs(t, New(cfg), s, func(p *model.Process) {
				if tc.nvml {
					p.CUDA.NVMLUsedBytes, p.CUDA.HasNVML = p.CUDA.LiveBytes+500*mib, true
				}
			})
			ev := r.f.Evidence.(model.GPUMemoryLeakEvidence)
			t.Logf("%s", r.f.Summary)
			used := s.liveBytes
			if tc.nvml {
				used += 500 * mib
			}
			want := tc.budget - used
			if tc.of == "device" {
				want = tc.device
			}
			if val(ev.HeadroomOf) != tc.of || val(ev.HeadroomBytes) != want {
				t.Errorf("headroom %v of %v, want %d of %s", val(ev.HeadroomBytes), val(ev.HeadroomOf), want, tc.of)
			}
			wantTTE := float64(want) / (20 * mib)
			if ev.TimeToExhaustionSeconds == nil {
				t.Fatal("time_to_exhaustion_seconds null")
			}
			if got := *ev.TimeToExhaustionSeconds; math.Abs(got-wantTTE) > 0.05*wantTTE {
				t.Errorf("time_to_exhaustion_seconds %v, want %.0f", got, wantTTE)
			}
			if got := r.f.Severity == model.SeverityCritical; got != tc.critical {
				t.Errorf("severity %s, want critical %v", r.f.Severity, tc.critical)
			}
			what := "device full"
			if tc.of == "budget" {
				what = human(float64(tc.budget)) + " budget used up"
			}
			if !strings.Contains(r.f.Summary, "; "+what+" in ~") {
				t.Errorf("summary %q, want %q", r.f.Summary, what)
			}
		})
	}
}

func TestBytes(t *testing.T) {
	for in, want := range map[string]uint64{
		"0": 0, "85899345920": 80 * gib, "80GiB": 80 * gib, "80 gib": 80 * gib, "512MiB": 512 * mib,
		"1TiB": 1 << 40, "64KiB": 64 << 10, "1.5GiB": 1536 * mib, "0.5KiB": 512,
	} {
		var b Bytes
		if err := b.Set(in); err != nil || uint64(b) != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, b, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "-1", "80GB", "80G", "lots", "1e30", "NaN", "16777216TiB"} {
		var b Bytes
		if err := b.Set(in); err == nil {
			t.Errorf("Set(%q) = %d, want an error", in, b)
		}
	}
	for b, want := range map[Bytes]string{0: "0", 80 * gib: "80GiB", 1536 * mib: "1536MiB", 1000: "1000", 1 << 40: "1TiB"} {
		if got := b.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", b, got, want)
		}
	}
	var b Bytes
	if b.Type() != "bytes" {
		t.Errorf("Type() = %q", b.Type())
	}
}
