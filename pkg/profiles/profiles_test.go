package profiles

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var t0 = time.Date(2026, 12, 2, 3, 4, 5, 0, time.UTC)

func process() *model.Process {
	main := model.Frame{Kind: model.FrameNative, Function: "main", Module: "app", Path: "/opt/app", BuildID: "ab12", File: "/src/app.c", Line: 40, Offset: 0x20}
	leak := model.Frame{Kind: model.FrameNative, Function: "leak_step", Module: "app", Path: "/opt/app", BuildID: "ab12", File: "/src/app.c", Line: 12, Offset: 0x9}
	burst := model.Frame{Kind: model.FrameNative, Function: "burst_step", Module: "app", Path: "/opt/app", BuildID: "ab12", File: "/src/app.c", Line: 20, Offset: 0x11}
	py := model.Frame{Kind: model.FramePython, Function: "warm_kv_cache", File: "/srv/kv.py", Line: 7}
	return &model.Process{PID: 42, Comm: "app", Pod: model.Pod{Namespace: "ml", Name: "app-0", Container: "app"},
		CUDA: model.CUDAStats{Sites: []model.CUDASite{
			{StackID: 1, Stack: []model.Frame{leak, main}, Bytes: 80 << 20, Allocs: make([]time.Time, 10), AllocBytes: 80 << 20, AllocCalls: 10},
			{StackID: 2, Stack: []model.Frame{burst, main}, AllocBytes: 18 << 30, AllocCalls: 300, FreeBytes: 18 << 30, FreeCalls: 300},
			{StackID: 3, Stack: []model.Frame{{Kind: model.FrameNative, Module: "libffi.so.8", Offset: 0x640e}, py}, AllocBytes: 1 << 30, AllocCalls: 16, FreeBytes: 1 << 30, FreeCalls: 16},
			{StackID: 4, Bytes: 1 << 20, Allocs: make([]time.Time, 1)}, // not symbolized, no counts
		}},
		FD: model.FDStats{
			Sites:     []model.FDSite{{StackID: 5, Stack: []model.Frame{leak, main}, Opened: make([]time.Time, 7), OpenedTotal: 7}},
			PastSites: []model.FDSite{{StackID: 6, Stack: []model.Frame{burst, main}, OpenedTotal: 900, ClosedTotal: 900}},
		},
	}
}

// values returns the values of the sample whose leaf is function fn.
func values(t *testing.T, p *profile.Profile, fn string) []int64 {
	t.Helper()
	for _, s := range p.Sample {
		if s.Location[0].Line[0].Function.Name == fn {
			return s.Value
		}
	}
	t.Fatalf("no sample at %s", fn)
	return nil
}

func TestGPUProfile(t *testing.T) {
	p, err := Of(GPU, process(), t0)
	if err != nil {
		t.Fatal(err)
	}
	// Written and read back as go tool pprof reads it.
	var buf bytes.Buffer
	if err := p.Write(&buf); err != nil {
		t.Fatal(err)
	}
	p, err = profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if p.DefaultSampleType != "inuse_space" || len(p.Sample) != 4 {
		t.Fatalf("default %q, %d samples", p.DefaultSampleType, len(p.Sample))
	}
	for fn, want := range map[string][4]int64{
		"leak_step":          {10, 80 << 20, 10, 80 << 20},
		"burst_step":         {300, 18 << 30, 0, 0},
		"libffi.so.8+0x640e": {16, 1 << 30, 0, 0},
		"[other call sites]": {1, 1 << 20, 1, 1 << 20},
	} {
		if got := values(t, p, fn); [4]int64(got) != want {
			t.Errorf("%s: %v, want %v (alloc objects and space, inuse objects and space)", fn, got, want)
		}
	}
	// Lines and files as the frames have them; the Python frame without a
	// mapping, native ones with their file's path and build-id, one
	// mapping a file.
	for _, l := range p.Location {
		fn := l.Line[0].Function
		switch fn.Name {
		case "leak_step":
			if fn.Filename != "/src/app.c" || l.Line[0].Line != 12 || l.Mapping == nil || l.Mapping.File != "/opt/app" || l.Mapping.BuildID != "ab12" || l.Address != 0x9 {
				t.Errorf("leak_step location %+v, function %+v", l, fn)
			}
		case "burst_step":
			if l.Mapping == nil || l.Mapping.File != "/opt/app" {
				t.Errorf("burst_step location %+v", l)
			}
		case "warm_kv_cache":
			if fn.Filename != "/srv/kv.py" || l.Line[0].Line != 7 || l.Mapping != nil {
				t.Errorf("warm_kv_cache location %+v, function %+v", l, fn)
			}
		}
	}
	if n := len(slices.DeleteFunc(slices.Clone(p.Mapping), func(m *profile.Mapping) bool { return m.File != "/opt/app" })); n != 1 {
		t.Errorf("%d mappings of /opt/app, want 1", n)
	}
}

func TestFDProfile(t *testing.T) {
	p, err := Of(FD, process(), t0)
	if err != nil {
		t.Fatal(err)
	}
	if got := values(t, p, "leak_step"); got[0] != 7 || got[1] != 7 {
		t.Errorf("leak_step: %v, want 7 opened, 7 open", got)
	}
	if got := values(t, p, "burst_step"); got[0] != 900 || got[1] != 0 {
		t.Errorf("burst_step: %v, want 900 opened, none open", got)
	}
}

// A profile of many processes labels each sample with its process.
func TestLabels(t *testing.T) {
	b, err := NewBuilder(GPU, t0)
	if err != nil {
		t.Fatal(err)
	}
	a, c := process(), process()
	c.PID = 43
	b.Add(a, Labels(a))
	b.Add(c, Labels(c))
	p, err := b.Profile()
	if err != nil {
		t.Fatal(err)
	}
	pids := map[string]int{}
	for _, s := range p.Sample {
		pids[s.Label["pid"][0]]++
		if s.Label["pod"][0] != "app-0" || s.Label["namespace"][0] != "ml" || s.Label["comm"][0] != "app" {
			t.Errorf("labels %v", s.Label)
		}
	}
	if pids["42"] != 4 || pids["43"] != 4 {
		t.Errorf("samples by pid %v, want 4 each", pids)
	}
	if _, err := NewBuilder("cpu", t0); err == nil {
		t.Error("a profile of an unknown kind was made")
	}
}
