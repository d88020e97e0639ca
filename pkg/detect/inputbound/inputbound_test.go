package inputbound

import (
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var t0 = time.Date(2026, 12, 2, 8, 0, 0, 0, time.UTC)

// bounds of the run-queue histogram, as the scheduler view has them.
var bounds = []float64{1e-5, 1e-4, 1e-3, 1e-2, 1e-1}

// proc is a process whose run-queue histogram has grown by waits each of
// which took about wait seconds, n a poll, for polls polls.
type proc struct {
	p *model.Process
}

func newProc(pid, ppid int, comm string) *proc {
	return &proc{&model.Process{PID: pid, PPID: ppid, Comm: comm,
		Sched: model.SchedStats{AllowedCPUs: 1, RunqLatency: model.Histogram{Bounds: bounds, Counts: make([]uint64, len(bounds))}}}}
}

// wait adds n waits of about wait seconds.
func (q *proc) wait(n uint64, wait float64) {
	h := &q.p.Sched.RunqLatency
	for i, b := range bounds {
		if wait <= b {
			h.Counts = append([]uint64(nil), h.Counts...)
			h.Counts[i] += n
			break
		}
	}
	h.Count += n
	h.Sum += float64(n) * wait
}

// run polls every second for secs seconds: the GPU process at sm, each
// worker with 50 waits of wait seconds a poll. It returns the findings of
// the last poll.
func run(d *Detector, from, secs int, gpu *proc, sm float64, wait float64, workers ...*proc) []model.Finding {
	var fs []model.Finding
	for i := from; i < from+secs; i++ {
		gpu.p.CUDA.GPUUtil = []model.GPUUtil{{Device: 0, SM: sm, Source: model.UtilProcess}}
		gpu.wait(50, 1e-5)
		procs := []*model.Process{gpu.p}
		for _, w := range workers {
			w.wait(50, wait)
			procs = append(procs, w.p)
		}
		fs = d.Observe(t0.Add(time.Duration(i)*time.Second), procs)
	}
	return fs
}

// A GPU idle while its workers wait for the one CPU they may use is input
// bound: a finding once that held over the window, naming the workers,
// ended when they stop waiting.
func TestInputBound(t *testing.T) {
	d := New(Config{})
	gpu := newProc(100, 1, "train")
	workers := []*proc{newProc(101, 100, "pt_data_worker"), newProc(102, 100, "pt_data_worker"), newProc(103, 100, "pt_data_worker")}
	if fs := run(d, 0, 20, gpu, 0.05, 0.05, workers...); len(fs) != 0 || gpu.p.CUDA.Verdict != "" {
		t.Fatalf("before a whole window: %+v, verdict %q", fs, gpu.p.CUDA.Verdict)
	}
	fs := run(d, 20, 15, gpu, 0.05, 0.05, workers...)
	if len(fs) != 1 || gpu.p.CUDA.Verdict != InputBound {
		t.Fatalf("findings %+v, verdict %q; want one input-bound finding", fs, gpu.p.CUDA.Verdict)
	}
	f := fs[0]
	if f.Kind != model.KindGPUInputBound || !f.Active || f.PID != 100 || !strings.Contains(f.Summary, "GPU idle 95 %") ||
		!strings.Contains(f.Summary, "child 101 (pt_data_worker") || len(f.Evidence.(model.GPUInputBoundEvidence).Waiting) != 3 {
		t.Errorf("finding %+v", f)
	}
	// The workers keep up again: the finding ends, the verdict goes.
	fs = run(d, 35, 30, gpu, 0.05, 1e-5, workers...)
	if len(fs) != 0 || gpu.p.CUDA.Verdict != "" {
		t.Errorf("after the workers kept up: %+v, verdict %q", fs, gpu.p.CUDA.Verdict)
	}
}

// Right the other way: a busy GPU is the bottleneck whatever the CPU side
// does, and an idle GPU with a calm CPU side is neither.
func TestNotInputBound(t *testing.T) {
	d := New(Config{})
	busy := newProc(200, 1, "train")
	starved := newProc(201, 200, "worker")
	if fs := run(d, 0, 40, busy, 0.95, 0.05, starved); len(fs) != 0 || busy.p.CUDA.Verdict != GPUBound {
		t.Errorf("busy GPU: %+v, verdict %q; want none, gpu_bound", fs, busy.p.CUDA.Verdict)
	}
	idle := newProc(300, 1, "serve")
	calm := newProc(301, 300, "worker")
	if fs := run(d, 0, 40, idle, 0.02, 1e-5, calm); len(fs) != 0 || idle.p.CUDA.Verdict != "" {
		t.Errorf("idle GPU, calm CPU: %+v, verdict %q; want none", fs, idle.p.CUDA.Verdict)
	}
}

// A GPU process that itself waits for a CPU is named with the threads
// preempted most in its worst interval: those that wanted a CPU.
func TestInputBoundNamesThreads(t *testing.T) {
	d := New(Config{})
	gpu := newProc(100, 1, "train")
	var fs []model.Finding
	for i := 0; i < 35; i++ {
		gpu.p.CUDA.GPUUtil = []model.GPUUtil{{Device: 0, SM: 0.1, Source: model.UtilProcess}}
		gpu.wait(50, 0.05)
		gpu.p.Sched.Threads = []model.ThreadSched{{TID: 100, Name: "pt_main_thread", Involuntary: uint64(i) * 10},
			{TID: 105, Name: "tokenizer", Involuntary: uint64(i) * 90}, {TID: 107, Name: "idle", Involuntary: 3}}
		fs = d.Observe(t0.Add(time.Duration(i)*time.Second), []*model.Process{gpu.p})
	}
	if len(fs) != 1 || !strings.Contains(fs[0].Summary, "itself 100 (train, p99 100ms; threads tokenizer 105, pt_main_thread 100)") {
		t.Fatalf("findings %+v", fs)
	}
}

// The host side: a busy GPU whose host waited on it most of the window is
// gpu_bound, confirmed; one whose host did not wait stays gpu_bound, not
// confirmed; and an input-bound finding says how little the host waited.
func TestHostSide(t *testing.T) {
	for _, c := range []struct {
		name      string
		sm, wait  float64
		verdict   string
		confirmed bool
	}{
		{"host blocked on a busy GPU", 0.95, 0.9, GPUBound, true},
		{"busy GPU, host not waiting", 0.95, 0.1, GPUBound, false},
		{"idle GPU, starved CPU side", 0.05, 0.02, InputBound, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := New(Config{})
			gpu := newProc(100, 1, "train")
			gpu.p.CUDA.Libraries = []string{"/usr/lib/libcudart.so.12"}
			gpu.p.CUDA.Waits.Share = c.wait
			fs := run(d, 0, 35, gpu, c.sm, 0.05, newProc(101, 100, "worker"))
			h := gpu.p.CUDA.VerdictHost
			if gpu.p.CUDA.Verdict != c.verdict || h == nil || h.WaitShare != c.wait || h.Confirmed != c.confirmed {
				t.Fatalf("verdict %q, host %+v", gpu.p.CUDA.Verdict, h)
			}
			if c.verdict == InputBound {
				if len(fs) != 1 {
					t.Fatalf("findings %+v", fs)
				}
				if ev := fs[0].Evidence.(model.GPUInputBoundEvidence); ev.HostWaitShare == nil || *ev.HostWaitShare != c.wait {
					t.Errorf("evidence %+v", ev)
				}
			}
		})
	}
	// Where the CUDA libraries are not hooked, what the host did is not
	// known: the verdict alone, as before.
	d := New(Config{})
	gpu := newProc(200, 1, "train")
	fs := run(d, 0, 35, gpu, 0.05, 0.05, newProc(201, 200, "worker"))
	if gpu.p.CUDA.Verdict != InputBound || gpu.p.CUDA.VerdictHost != nil || len(fs) != 1 || fs[0].Evidence.(model.GPUInputBoundEvidence).HostWaitShare != nil {
		t.Errorf("verdict %q, host %+v, findings %+v", gpu.p.CUDA.Verdict, gpu.p.CUDA.VerdictHost, fs)
	}
}
