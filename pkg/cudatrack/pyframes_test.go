package cudatrack

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/gpualloc"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/pyframes"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// The C structs of bpf/pyframes.h and their Go mirrors agree.
func TestPyLayout(t *testing.T) {
	if err := pyframes.SameLayout(cudaPyProc{}, pyframes.Proc{}); err != nil {
		t.Error(err)
	}
	if err := pyframes.SameLayout(cudaPyStack{}, pyframes.Stack{}); err != nil {
		t.Error(err)
	}
}

// A Python function that calls cudaMalloc through ctypes is named, with its
// line, in the allocation site's stack and in a failed allocation's
// finding, on every interpreter at hand; so is one whose burst is freed
// before the poll, in the site's counts and in the burst's finding.
func TestPythonFramesAtAllocations(t *testing.T) {
	testutil.RequireRoot(t)
	rt := testutil.CUDAStubs(t)
	script := testutil.PythonScript("gpu.py")
	leak := model.Frame{Kind: model.FramePython, Function: "load_adapter", File: script, Line: testutil.LineOf(t, script, "# alloc: leak")}
	failLine := testutil.LineOf(t, script, "# alloc: fail")
	fail := model.Frame{Kind: model.FramePython, Function: "warmup_kv_cache", File: script, Line: failLine}
	burstLine := testutil.LineOf(t, script, "# alloc: burst")
	burst := model.Frame{Kind: model.FramePython, Function: "prefill_batch", File: script, Line: burstLine}
	for _, py := range testutil.Pythons(t) {
		t.Run(testutil.PythonVersion(t, py)+"/"+filepath.Base(py), func(t *testing.T) {
			c, err := New(Config{ProcRoot: "/proc", Classic: classic}, symbolize.New("/proc"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Close() })
			p := testutil.StartProc(t, []string{"CUDA_STUB_LIMIT=1073741824"}, py, script, rt, "4", "64")
			pr := &model.Process{PID: p.Cmd.Process.Pid, Comm: "python"}
			if err := c.Track(pr.PID); err != nil {
				t.Fatal(err)
			}
			// Filled and judged as a poll of the pipeline does.
			det := gpualloc.New(gpualloc.DefaultConfig())
			judge := func() []model.Finding {
				now := time.Now()
				if _, err := c.Fill(now, []*model.Process{pr}); err != nil {
					t.Fatal(err)
				}
				return det.Observe(now, pr)
			}
			judge() // hooks the runtime ctypes loaded
			p.Signal(t)
			p.Wait(t, "done", 10*time.Second)
			findings := judge()
			var bytes uint64
			for _, s := range pr.CUDA.Sites {
				if slices.Contains(s.Stack, leak) {
					bytes += s.Bytes
				}
			}
			if bytes != 4*64*MiB {
				for _, s := range pr.CUDA.Sites {
					t.Logf("%d bytes at\n  %s", s.Bytes, strings.Join(testutil.Texts(s.Stack), "\n  "))
				}
				t.Fatalf("%d bytes allocated at %s, want %d", bytes, leak, 4*64*MiB)
			}
			if len(pr.CUDA.Failures) != 1 || !slices.Contains(pr.CUDA.Failures[0].Stack, fail) {
				t.Fatalf("failures %+v, want one at %s", pr.CUDA.Failures, fail)
			}
			var summary string
			for _, f := range findings {
				if f.Kind == model.KindGPUAllocFailure {
					summary = f.Summary
				}
			}
			if want := fmt.Sprintf("at warmup_kv_cache (gpu.py:%d)", failLine); !strings.Contains(summary, want) {
				t.Errorf("failure finding %q does not say %q", summary, want)
			}
			// One site may sit under two stack ids (bytes above).
			var at model.CUDASite
			for _, s := range pr.CUDA.Sites {
				if slices.Contains(s.Stack, burst) {
					at.Bytes += s.Bytes
					at.AllocBytes += s.AllocBytes
					at.AllocCalls += s.AllocCalls
					at.FreeBytes += s.FreeBytes
					at.FreeCalls += s.FreeCalls
					at.RecentBytes += s.RecentBytes
				}
			}
			if at.Bytes != 0 || at.AllocBytes != 80*64*MiB || at.FreeBytes != at.AllocBytes || at.AllocCalls != 80 || at.FreeCalls != 80 || at.RecentBytes != at.AllocBytes {
				t.Errorf("at %s: %+v, want 80 × 64 MiB allocated and freed", burst, at)
			}
			summary = ""
			for _, f := range findings {
				if f.Kind == model.KindGPUAllocBurst {
					summary = f.Summary
				}
			}
			if want := fmt.Sprintf("most at prefill_batch (gpu.py:%d)", burstLine); !strings.Contains(summary, want) {
				t.Errorf("burst finding %q does not say %q", summary, want)
			}
			noLoss(t, c)
		})
	}
}
