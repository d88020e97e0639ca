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
		ev.Class != model.XIDDevice || !strings.Contains(f.Summary, "XID 79 2 times") || !strings.Contains(f.Summary, "fallen off the bus") {
		t.Errorf("XID 79 finding %+v", f)
	}
	if ev, _ := fs[0].Evidence.(model.GPUXIDEvidence); fs[0].Severity != model.SeverityWarning || ev.XID != 31 || ev.Class != model.XIDApplication {
		t.Errorf("XID 31 finding %+v: want an application's warning", fs[0])
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

// on is an XID of GPU 0 with the processes on it.
func on(at time.Duration, n uint64, procs ...model.DeviceProcess) model.GPUEvent {
	e := xid(at, 0, n)
	e.Processes = procs
	return e
}

// Each XID is judged by its class: a fault of the device is critical for
// every process on it, which the evidence lists; one of an application a
// warning that says whether the process was alone on the device (45, the
// cleanup after one, info); one not classified a warning with its number.
func TestXIDClasses(t *testing.T) {
	train, eval := model.DeviceProcess{PID: 2, Comm: "train"}, model.DeviceProcess{PID: 3, Comm: "eval"}
	other := model.DeviceProcess{PID: 9} // not watched
	for _, c := range []struct {
		xid      uint64
		procs    []model.DeviceProcess
		severity string
		class    string
		says     []string
	}{
		{79, []model.DeviceProcess{train, eval, other}, model.SeverityCritical, model.XIDDevice,
			[]string{"fallen off the bus", "a fault of the device, not of train: it affects all 3 processes on it"}},
		{48, []model.DeviceProcess{train}, model.SeverityCritical, model.XIDDevice, []string{"double-bit ECC", "a fault of the device, not of train"}},
		{74, []model.DeviceProcess{train, eval}, model.SeverityCritical, model.XIDDevice, []string{"NVLink"}},
		{119, []model.DeviceProcess{train, eval}, model.SeverityCritical, model.XIDDevice, []string{"GSP RPC timeout"}},
		{31, []model.DeviceProcess{train}, model.SeverityWarning, model.XIDApplication,
			[]string{"GPU memory page fault", "a fault of the application: train, alone on the device, caused it"}},
		{13, []model.DeviceProcess{train, eval}, model.SeverityWarning, model.XIDApplication,
			[]string{"graphics engine exception", "one of the 2 processes on the device caused it", "NVRM: Xid"}},
		{43, []model.DeviceProcess{train}, model.SeverityWarning, model.XIDApplication, []string{"GPU stopped processing"}},
		{45, []model.DeviceProcess{train, eval}, model.SeverityInfo, model.XIDApplication, []string{"preemptive cleanup", "informational"}},
		{109, []model.DeviceProcess{train}, model.SeverityWarning, model.XIDUnknown, []string{"XID 109 once", "context switch timeout", "XID 109 is not classified here"}},
		{157, []model.DeviceProcess{train}, model.SeverityWarning, model.XIDUnknown, []string{"XID 157 once", "see NVIDIA's XID catalogue", "XID 157 is not classified here"}},
	} {
		d := New(Config{Quiet: time.Minute})
		p := &model.Process{PID: 2, Comm: "train"}
		p.CUDA.GPUEvents = []model.GPUEvent{on(0, c.xid, c.procs...)}
		fs := d.Observe(t0.Add(time.Second), p)
		if len(fs) != 1 {
			t.Fatalf("XID %d: findings %+v", c.xid, fs)
		}
		f := fs[0]
		ev, _ := f.Evidence.(model.GPUXIDEvidence)
		if f.Kind != model.KindGPUXID || f.Severity != c.severity || ev.Class != c.class || ev.XID != c.xid || !slices.Equal(ev.Processes, c.procs) {
			t.Errorf("XID %d: %s %s, processes %v; want %s %s, %v", c.xid, f.Severity, ev.Class, ev.Processes, c.severity, c.class, c.procs)
		}
		for _, w := range c.says {
			if !strings.Contains(f.Summary, w) {
				t.Errorf("XID %d: summary %q lacks %q", c.xid, f.Summary, w)
			}
		}
	}
}

// The processes of a finding are those of every report of its XID while
// it is active, the process itself among them even where an event lists
// none; a comm learnt once stays.
func TestXIDProcessesAccumulate(t *testing.T) {
	d := New(Config{Quiet: time.Minute})
	p := &model.Process{PID: 2, Comm: "train"}
	p.CUDA.GPUEvents = []model.GPUEvent{xid(0, 0, 79)}
	fs := d.Observe(t0, p)
	if ev, _ := fs[0].Evidence.(model.GPUXIDEvidence); !slices.Equal(ev.Processes, []model.DeviceProcess{{PID: 2, Comm: "train"}}) {
		t.Errorf("an event listing none: processes %v, want the process itself", ev.Processes)
	}
	p.CUDA.GPUEvents = []model.GPUEvent{on(time.Second, 79, model.DeviceProcess{PID: 2}, model.DeviceProcess{PID: 5, Comm: "eval"})}
	d.Observe(t0.Add(time.Second), p)
	p.CUDA.GPUEvents = []model.GPUEvent{on(2*time.Second, 79, model.DeviceProcess{PID: 5})}
	fs = d.Observe(t0.Add(2*time.Second), p)
	want := []model.DeviceProcess{{PID: 2, Comm: "train"}, {PID: 5, Comm: "eval"}}
	if ev, _ := fs[0].Evidence.(model.GPUXIDEvidence); len(fs) != 1 || ev.Count != 3 || !slices.Equal(ev.Processes, want) ||
		!strings.Contains(fs[0].Summary, "all 2 processes") {
		t.Errorf("findings %+v, want one of 3 reports with processes %v", fs, want)
	}
}

// The catalogue holds the classes NVIDIA's XID catalogue gives the common
// XIDs: the device's memory, driver, NVLink, bus and GSP faults, and the
// application's own.
func TestCatalogue(t *testing.T) {
	for _, n := range []uint64{48, 63, 64, 74, 79, 92, 94, 95, 119, 120} {
		if Class(n) != model.XIDDevice || Severity(n) != model.SeverityCritical {
			t.Errorf("XID %d: %s %s, want a critical device fault", n, Class(n), Severity(n))
		}
	}
	for _, n := range []uint64{13, 31, 43, 45} {
		if Class(n) != model.XIDApplication {
			t.Errorf("XID %d: %s, want the application's", n, Class(n))
		}
	}
	if Severity(45) != model.SeverityInfo || Severity(13) != model.SeverityWarning || Severity(1000) != model.SeverityWarning || Class(1000) != model.XIDUnknown {
		t.Errorf("severities: 45 %s, 13 %s, 1000 %s (%s)", Severity(45), Severity(13), Severity(1000), Class(1000))
	}
	for n, x := range Catalogue {
		if !slices.Contains([]string{model.XIDApplication, model.XIDDevice, model.XIDUnknown}, x.Class) || x.Meaning == "" {
			t.Errorf("XID %d: %+v", n, x)
		}
	}
}
