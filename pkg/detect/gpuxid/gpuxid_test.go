package gpuxid

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var t0 = time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)

func xid(at time.Duration, dev int, n uint64) model.GPUEvent {
	return model.GPUEvent{Time: t0.Add(at), Device: dev, UUID: "GPU-aaaa", Kind: model.GPUEventXID, XID: n,
		GPUInstance: model.NoInstance, ComputeInstance: model.NoInstance}
}

func event(at time.Duration, dev int, kind string) model.GPUEvent {
	return model.GPUEvent{Time: t0.Add(at), Device: dev, UUID: "GPU-aaaa", Kind: kind,
		GPUInstance: model.NoInstance, ComputeInstance: model.NoInstance}
}

// A process whose GPU reports nothing has no finding; one whose GPU falls
// off the bus gets a critical one, counted per device and XID, that stays
// while the XID recurs and ends after Quiet without it.
func TestXIDFindings(t *testing.T) {
	d := New(Config{Quiet: time.Minute})
	calm := &model.Process{PID: 1, Comm: "serve"}
	if fs := d.Observe(t0, calm); len(fs) != 0 {
		t.Fatalf("no fault: %+v", fs)
	}
	p := &model.Process{PID: 2, Comm: "train"}
	p.CUDA.GPUEvents = []model.GPUEvent{xid(0, 0, 79), xid(time.Millisecond, 0, 79), xid(2*time.Millisecond, 0, 31)}
	fs := d.Observe(t0.Add(time.Second), p)
	if len(fs) != 2 {
		t.Fatalf("findings %+v, want XID 31 and 79", fs)
	}
	f := fs[1]
	if ev, _ := f.Evidence.(model.GPUXIDEvidence); f.Kind != model.KindGPUXID || f.Severity != model.SeverityCritical || !f.Active || ev.XID != 79 || ev.Count != 2 ||
		!strings.Contains(f.Summary, "XID 79 2 times") || !strings.Contains(f.Summary, "fallen off the bus") {
		t.Errorf("XID 79 finding %+v", f)
	}
	if fs[0].FirstSeen.Equal(fs[1].FirstSeen) {
		t.Error("two findings of the process share their first sighting")
	}
	p.CUDA.GPUEvents = nil
	if fs := d.Observe(t0.Add(30*time.Second), p); len(fs) != 2 || !fs[0].Active {
		t.Errorf("within Quiet: %+v", fs)
	}
	fs = d.Observe(t0.Add(2*time.Minute), p)
	if len(fs) != 2 || fs[0].Active || fs[1].Active {
		t.Errorf("after Quiet: %+v, want both ended", fs)
	}
	if fs := d.Observe(t0.Add(3*time.Minute), p); len(fs) != 0 {
		t.Errorf("ended findings come back: %+v", fs)
	}
	// A MIG instance is named.
	e := xid(0, 1, 94)
	e.GPUInstance, e.ComputeInstance = 3, 0
	p.CUDA.GPUEvents = []model.GPUEvent{e}
	fs = d.Observe(t0.Add(4*time.Minute), p)
	if len(fs) != 1 || !strings.Contains(fs[0].Summary, "contained ECC error") {
		t.Fatalf("MIG fault: %+v", fs)
	}
	if ev, _ := fs[0].Evidence.(model.GPUXIDEvidence); !slices.Equal(ev.MIGInstances, []model.MIGInstance{{GPUInstance: 3, ComputeInstance: 0}}) {
		t.Errorf("MIG fault: %+v", fs)
	}
}

// A double-bit ECC error is a critical gpu_ecc_error finding of its own,
// next to the XIDs of the same device; corrected errors and changes of
// state make none.
func TestECCFindings(t *testing.T) {
	d := New(Config{Quiet: time.Minute})
	p := &model.Process{PID: 2, Comm: "train"}
	p.CUDA.GPUEvents = []model.GPUEvent{event(0, 0, model.GPUEventPState), event(0, 0, model.GPUEventClock),
		event(0, 0, model.GPUEventSingleBitECC), event(0, 0, model.GPUEventPowerSourceChange)}
	if fs := d.Observe(t0, p); len(fs) != 0 {
		t.Fatalf("a healthy GPU's events: %+v", fs)
	}
	p.CUDA.GPUEvents = []model.GPUEvent{event(time.Second, 0, model.GPUEventDoubleBitECC), xid(time.Second, 0, 48),
		event(2*time.Second, 0, model.GPUEventDoubleBitECC), event(2*time.Second, 0, model.GPUEventPState)}
	fs := d.Observe(t0.Add(3*time.Second), p)
	if len(fs) != 2 {
		t.Fatalf("findings %+v, want gpu_ecc_error and gpu_xid", fs)
	}
	f := fs[0]
	ev, isECC := f.Evidence.(model.GPUECCEvidence)
	if f.Kind != model.KindGPUECCError || f.Severity != model.SeverityCritical || !f.Active || !isECC || ev.Count != 2 ||
		ev.Device != 0 || ev.UUID != "GPU-aaaa" ||
		!strings.Contains(f.Summary, "double-bit ECC error 2 times") || !strings.Contains(f.Summary, "reset the GPU") {
		t.Errorf("ECC finding %+v", f)
	}
	if ev, _ := fs[1].Evidence.(model.GPUXIDEvidence); fs[1].Kind != model.KindGPUXID || ev.XID != 48 || fs[1].FirstSeen.Equal(f.FirstSeen) {
		t.Errorf("XID finding %+v next to the ECC one", fs[1])
	}
	p.CUDA.GPUEvents = nil
	if fs := d.Observe(t0.Add(2*time.Minute), p); len(fs) != 2 || fs[0].Active || fs[1].Active {
		t.Errorf("after Quiet: %+v, want both ended", fs)
	}
}
