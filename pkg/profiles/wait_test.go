package profiles

import (
	"bytes"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// The wait profile has one sample per site, the API as its innermost frame
// (one line's two APIs stay apart), calls and nanoseconds waited; a site
// without a stack still counts.
func TestWaitProfile(t *testing.T) {
	step := model.Frame{Kind: model.FramePython, Function: "train_step", File: "/srv/train.py", Line: 17}
	p := &model.Process{PID: 42, Comm: "train", CUDA: model.CUDAStats{Waits: model.CUDAWaits{Sites: []model.CUDAWaitSite{
		{API: "cudaStreamSynchronize", Stack: []model.Frame{step}, Calls: 1000, Seconds: 0.5},
		{API: "cudaMemcpy", Stack: []model.Frame{step}, Calls: 10, Seconds: 2},
		{API: "cuCtxSynchronize", Calls: 3, Seconds: 0.000001},
	}}}}
	prof, err := Of(Wait, p, t0)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := prof.Write(&buf); err != nil {
		t.Fatal(err)
	}
	if prof, err = profile.Parse(&buf); err != nil {
		t.Fatal(err)
	}
	if prof.DefaultSampleType != "wait" || len(prof.SampleType) != 2 || prof.SampleType[1].Unit != "nanoseconds" || len(prof.Sample) != 3 {
		t.Fatalf("profile %v", prof)
	}
	if v := values(t, prof, "cudaStreamSynchronize"); v[0] != 1000 || v[1] != 5e8 {
		t.Errorf("cudaStreamSynchronize: %v", v)
	}
	if v := values(t, prof, "cudaMemcpy"); v[0] != 10 || v[1] != 2e9 {
		t.Errorf("cudaMemcpy: %v", v)
	}
	for _, s := range prof.Sample {
		caller := s.Location[1].Line[0].Function.Name
		if want := map[string]string{"cudaStreamSynchronize": "train_step", "cudaMemcpy": "train_step", "cuCtxSynchronize": unsymbolized}[s.Location[0].Line[0].Function.Name]; caller != want {
			t.Errorf("%s called from %s, want %s", s.Location[0].Line[0].Function.Name, caller, want)
		}
	}
	// Nothing else goes into the other profiles, nor waits into them.
	if gpu, err := Of(GPU, p, t0); err != nil || len(gpu.Sample) != 0 {
		t.Errorf("gpu profile of waits: %v %v", gpu, err)
	}
}
