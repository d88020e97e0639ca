// The views' parts of the terminal view (model.Shows): the CUDA view's
// state and line, the sched view's column.
package tui

import (
	"bytes"
	"strings"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

func cudaProc(pid int, live uint64) *model.Process {
	p := proc(pid, "trainer", 5, false)
	p.CUDA = model.CUDAStats{LiveBytes: live, LiveAllocs: 3, Libraries: []string{"/usr/lib/libcudart.so.12"}}
	return p
}

func TestGPUInLog(t *testing.T) {
	var buf bytes.Buffer
	v := New(&buf, false)
	v.Update(snap(1, []*model.Process{cudaProc(100, 3<<30), proc(200, "quiet", 4, false)}, nil, nil))
	v.Update(snap(2, []*model.Process{cudaProc(100, 3<<30), proc(200, "quiet", 4, false)}, nil, nil))
	v.Update(snap(3, []*model.Process{cudaProc(100, 3<<30+512<<20), proc(200, "quiet", 4, false)}, nil, nil))
	want := `03:04:06 pid=100 (trainer) open=5 findings=0 gpu_live=3.0GiB rate=-
03:04:06 pid=200 (quiet) open=4 findings=0 rate=-
03:04:08 pid=100 (trainer) open=5 findings=0 gpu_live=3.5GiB rate=+0.0/s
`
	if got := buf.String(); got != want {
		t.Errorf("log:\n%s\nwant:\n%s", got, want)
	}
}

func TestGPUInBlockAndSummary(t *testing.T) {
	var buf bytes.Buffer
	v := New(&buf, true)
	p := cudaProc(100, 3<<30)
	p.CUDA.HasNVML, p.CUDA.NVMLUsedBytes = true, 3<<30+512<<20
	p.CUDA.Failures = []model.CUDAFailure{{API: "cudaMalloc", Code: 2}}
	v.Update(snap(1, []*model.Process{p, proc(200, "quiet", 4, false)}, nil, nil))
	line := "pid 100 (trainer) GPU memory: 3.0 GiB live in 3 allocations, 3.5 GiB per NVML, 1 failed allocations\n"
	if !strings.Contains(buf.String(), line) {
		t.Errorf("live block lacks %q:\n%s", line, buf.String())
	}
	if strings.Contains(buf.String(), "pid 200 (quiet) GPU") {
		t.Error("GPU line for a process without CUDA activity")
	}
	buf.Reset()
	if err := v.Close(nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), line) {
		t.Errorf("summary lacks %q:\n%s", line, buf.String())
	}
}

func TestSwitchRate(t *testing.T) {
	var buf bytes.Buffer
	v := New(&buf, true)
	p := proc(100, "schedwork", 10, false)
	p.Sched.Voluntary, p.Sched.Involuntary = 1000, 200
	v.Update(snap(1, []*model.Process{p}, nil, nil))
	if !strings.Contains(buf.String(), "CS/S") {
		t.Fatalf("no CS/S column:\n%s", buf.String())
	}
	q := *p
	q.Sched.Voluntary, q.Sched.Involuntary = 61000, 10200 // +70000 in 2 s
	buf.Reset()
	v.Update(snap(3, []*model.Process{&q}, nil, nil))
	if !strings.Contains(buf.String(), " 35000 ") {
		t.Errorf("block lacks 35000 switches/s:\n%s", buf.String())
	}
}
