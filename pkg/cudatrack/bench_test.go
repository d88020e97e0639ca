package cudatrack

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// BenchmarkAllocFree measures one cudaMalloc+cudaFree pair on the stand-ins
// (each call enters the driver stand-in too: four hooked functions per
// pair): without hooks, with an empty entry+return program on every hooked
// function (the bare cost of the probes), with an empty entry program only,
// and with our hooks on each attach path: the classic uprobe+uretprobe
// pairs and, where the kernel has them, session uprobes; then the same
// hooks with the calling process untracked (another process, tracked,
// maps the libraries: the hooks are on the files); and on the classic path
// with the caller's memory snapshot open as if an allocation had just
// failed, every free copying its block to freed_allocs (snapshot.go; the
// address comes back each pair, so the table holds one entry). ns/op is the cost of one
// pair; scripts/bench-cuda.sh compares each with empty. With our hooks it
// also reports the kernel's own count of the time spent in our programs
// (BPF run-time statistics): bpf-ns/pair in all of them, and, on the
// classic path, entry-ns/alloc in the allocation entry program, where the
// stack is unwound.
func BenchmarkAllocFree(b *testing.B) { benchSetups(b, "bench", "pair", nil) }

// BenchmarkSync measures one cudaStreamSynchronize on the stand-ins (which
// calls cuStreamSynchronize: two hooked functions) in the setups of
// BenchmarkAllocFree, the GPU's wait taken out (CUDA_STUB_SYNC_US=0): what
// is left is the call and its hooks. Tracked, every call is counted once
// as a wait.
func BenchmarkSync(b *testing.B) {
	b.Setenv("CUDA_STUB_SYNC_US", "0")
	benchSetups(b, "syncbench", "sync", func(b *testing.B, c *Concern, pid int) {
		pr := &model.Process{PID: pid}
		if _, err := c.Fill(time.Now(), []*model.Process{pr}); err != nil {
			b.Fatal(err)
		}
		if w := pr.CUDA.Waits; w.Calls != uint64(b.N) {
			b.Fatalf("%d waits counted, want %d", w.Calls, b.N)
		}
	})
}

// benchSetups runs cudawork's scenario (N calls, then "ns TOTAL") in each
// setup of BenchmarkAllocFree and reports ns/unit, and bpf-ns/unit with
// our hooks; verify, when set, checks what a tracked caller's hooks saw.
func benchSetups(b *testing.B, scenario, unit string, verify func(b *testing.B, c *Concern, pid int)) {
	testutil.RequireRoot(b)
	runtime := testutil.CUDAStubs(b)
	bin := testutil.Fixture(b, "cudawork")
	// hooked attaches our hooks, tracking pid or, for an untracked caller,
	// another process mapping the same libraries; open opens its memory
	// snapshot for good.
	hooked := func(classic, untracked, open bool) func(b *testing.B, pid int) func() {
		return func(b *testing.B, pid int) func() {
			if !classic && !bpfobj.Probe().UprobeSession {
				b.Skip("no session uprobes on this kernel")
			}
			stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
			if err != nil {
				b.Fatal(err)
			}
			c, err := New(Config{ProcRoot: "/proc", Classic: classic}, symbolize.New("/proc"))
			if err != nil {
				b.Fatal(err)
			}
			caller := pid
			if untracked {
				other := testutil.StartProc(b, nil, bin, runtime, "bench", "600", "1")
				other.Wait(b, "loaded", 10*time.Second)
				pid = other.Cmd.Process.Pid
			}
			if err := c.Track(pid); err != nil {
				b.Fatal(err)
			}
			if n := len(c.Libraries(pid)); n != 2 {
				b.Fatalf("%d libraries hooked, want 2", n)
			}
			if open {
				if err := c.maps.OomSnaps.Update(uint32(pid), cudaCudaSnap{OpenNs: math.MaxUint64}, ebpf.UpdateExist); err != nil {
					b.Fatal(err)
				}
			}
			return func() {
				reportRunTime(b, c, unit)
				if verify != nil && !untracked {
					verify(b, c, caller)
				}
				if open {
					// Each free copied its block, into one entry.
					var (
						k cudaCudaAllocKey
						v cudaCudaFreed
						n int
					)
					for it := c.maps.FreedAllocs.Iterate(); it.Next(&k, &v); {
						n++
					}
					lost, err := c.Lost()
					if err != nil {
						b.Fatal(err)
					}
					if n == 0 || lost["cuda_oom_snapshot"] != 0 {
						b.Fatalf("%d blocks kept, %d frees not kept", n, lost["cuda_oom_snapshot"])
					}
				}
				_ = c.Close()
				_ = stats.Close()
			}
		}
	}
	setups := []struct {
		name   string
		attach func(b *testing.B, pid int) func()
	}{
		{"unhooked", func(*testing.B, int) func() { return func() {} }},
		{"empty", func(b *testing.B, pid int) func() { return attachEmpty(b, pid, runtime, true) }},
		{"empty-entry", func(b *testing.B, pid int) func() { return attachEmpty(b, pid, runtime, false) }},
		{"empty-session", func(b *testing.B, pid int) func() { return attachEmptySession(b, pid, runtime) }},
		{"classic", hooked(true, false, false)},
		{"session", hooked(false, false, false)},
		{"untracked-classic", hooked(true, true, false)},
		{"untracked-session", hooked(false, true, false)},
		{"snapshot-open-classic", hooked(true, false, true)},
	}
	for _, s := range setups {
		b.Run(s.name, func(b *testing.B) {
			b.StopTimer()
			p := testutil.StartProc(b, nil, bin, runtime, scenario, "60", strconv.Itoa(b.N))
			p.Wait(b, "loaded", 10*time.Second)
			detach := s.attach(b, p.Cmd.Process.Pid)
			defer detach()
			b.StartTimer()
			p.Signal(b)
			line := p.Wait(b, "ns ", 10*time.Minute)
			b.StopTimer()
			ns, err := strconv.ParseFloat(strings.TrimPrefix(line, "ns "), 64)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(ns/float64(b.N), "ns/"+unit)
		})
	}
}

// reportRunTime reports the time the kernel counted in our programs and
// how many times they ran, per unit (one call of the benchmark's loop).
func reportRunTime(b *testing.B, c *Concern, unit string) {
	var total time.Duration
	var runs uint64
	for name, p := range c.coll.Programs {
		st, err := p.Stats()
		if err != nil {
			b.Fatal(err)
		}
		total += st.Runtime
		runs += st.RunCount
		if name == cudaProgCudaAllocEnter && st.RunCount > 0 {
			// Two runs per pair: the runtime's call, and the driver's
			// nested in it, which returns early.
			b.ReportMetric(float64(st.Runtime.Nanoseconds())/float64(b.N), "entry-ns/alloc")
		}
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "bpf-ns/"+unit)
	// Probe hits that ran a program of ours: a return declined on the
	// session path is not one.
	b.ReportMetric(float64(runs)/float64(b.N), "runs/"+unit)
}

// attachEmpty puts a program that does nothing on the entry (and the return,
// with returns) of every function our hooks cover, the way our classic
// hooks are attached.
func attachEmpty(b *testing.B, pid int, runtime string, returns bool) func() {
	b.Helper()
	multi := haveUprobeMulti()
	spec := &ebpf.ProgramSpec{
		Type:         ebpf.Kprobe,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "GPL",
	}
	if multi {
		spec.AttachType = ebpf.AttachTraceUprobeMulti
	}
	prog, err := ebpf.NewProgram(spec)
	if err != nil {
		b.Fatal(err)
	}
	var links []link.Link
	for _, lib := range []struct{ path, kind string }{{runtime, kindRuntime}, {filepath.Join(filepath.Dir(runtime), "libcuda.so.1"), kindDriver}} {
		l, err := Inspect(lib.path, lib.path, lib.kind)
		if err != nil {
			b.Fatal(err)
		}
		ex, err := link.OpenExecutable(lib.path)
		if err != nil {
			b.Fatal(err)
		}
		opts := &link.UprobeMultiOptions{PID: uint32(pid)}
		for _, h := range l.Hooks {
			opts.Addresses = append(opts.Addresses, h.Offset)
			if !multi {
				for _, ret := range []bool{false, true}[:btoi(returns)+1] {
					attach := ex.Uprobe
					if ret {
						attach = ex.Uretprobe
					}
					u, err := attach(APIs[h.API].Name, prog, &link.UprobeOptions{Address: h.Offset, PID: pid})
					if err != nil {
						b.Fatal(err)
					}
					links = append(links, u)
				}
			}
		}
		if multi {
			in, err := ex.UprobeMulti(nil, prog, opts)
			if err != nil {
				b.Fatal(err)
			}
			links = append(links, in)
			if returns {
				out, err := ex.UretprobeMulti(nil, prog, opts)
				if err != nil {
					b.Fatal(err)
				}
				links = append(links, out)
			}
		}
	}
	return func() {
		_ = bpfobj.CloseLinks(links)
		prog.Close()
	}
}

// attachEmptySession puts a session program that does nothing and asks for
// every return on every function our hooks cover: the bare cost of the
// session path's probes.
func attachEmptySession(b *testing.B, pid int, runtime string) func() {
	b.Helper()
	if !bpfobj.Probe().UprobeSession {
		b.Skip("no session uprobes on this kernel")
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.Kprobe,
		AttachType:   bpfobj.AttachTraceUprobeSession,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		b.Fatal(err)
	}
	var links []link.Link
	for _, lib := range []struct{ path, kind string }{{runtime, kindRuntime}, {filepath.Join(filepath.Dir(runtime), "libcuda.so.1"), kindDriver}} {
		l, err := Inspect(lib.path, lib.path, lib.kind)
		if err != nil {
			b.Fatal(err)
		}
		var offsets []uint64
		for _, h := range l.Hooks {
			offsets = append(offsets, h.Offset)
		}
		sl, err := bpfobj.UprobeSession(lib.path, prog, offsets, nil, uint32(pid))
		if err != nil {
			b.Fatal(err)
		}
		links = append(links, sl)
	}
	return func() {
		_ = bpfobj.CloseLinks(links)
		prog.Close()
	}
}

// BenchmarkSustained runs allocation+free pairs at a target rate (default
// 100k/s, CUDA_BENCH_RATE) over two threads for 10 s, polling like the
// pipeline every second, and reports the rate reached and what was lost:
// the BPF loss counters and any allocation the counters missed.
func BenchmarkSustained(b *testing.B) {
	testutil.RequireRoot(b)
	rate := "100000"
	if v := strings.TrimSpace(os.Getenv("CUDA_BENCH_RATE")); v != "" {
		rate = v
	}
	runtime := testutil.CUDAStubs(b)
	bin := testutil.Fixture(b, "cudawork")
	for range b.N {
		c, err := New(Config{ProcRoot: "/proc"}, symbolize.New("/proc"))
		if err != nil {
			b.Fatal(err)
		}
		p := testutil.StartProc(b, nil, bin, runtime, "rate", "10", rate, "2")
		p.Wait(b, "loaded", 10*time.Second)
		pr := &model.Process{PID: p.Cmd.Process.Pid}
		if err := c.Track(pr.PID); err != nil {
			b.Fatal(err)
		}
		p.Signal(b)
		// Poll every second, as the pipeline does, until the workload ends.
		var line string
		for line == "" {
			var ok bool
			line, ok = p.TryWait(b, "pairs ", time.Second)
			if _, err := c.Fill(time.Now(), []*model.Process{pr}); err != nil {
				b.Fatal(err)
			}
			if !ok {
				line = ""
			}
		}
		var pairs, ns uint64
		if _, err := fmt.Sscanf(line, "pairs %d ns %d", &pairs, &ns); err != nil {
			b.Fatal(err)
		}
		lost, err := c.Lost()
		if err != nil {
			b.Fatal(err)
		}
		var total uint64
		for _, v := range lost {
			total += v
		}
		cs := pr.CUDA
		missed := int64(pairs) - int64(cs.AllocCalls["cudaMalloc"])
		b.ReportMetric(float64(pairs)/(float64(ns)/1e9), "allocs/s")
		b.ReportMetric(float64(total), "lost")
		b.ReportMetric(float64(missed), "missed")
		b.ReportMetric(float64(cs.LiveAllocs), "live_at_end")
		_ = c.Close()
	}
}

// BenchmarkLaunch measures one cudaLaunchKernel on the stand-ins (which
// calls cuLaunchKernel: two hooked functions, four probe hits per launch
// with --launches): tracked without --launches (the default: the launch
// functions not hooked), with an empty entry+return program on every
// hooked function (the bare cost of the probes), and with --launches.
// ns/launch is the cost of one launch; with --launches it also reports the
// kernel's count of the time spent in our programs (bpf-ns/launch).
func BenchmarkLaunch(b *testing.B) {
	testutil.RequireRoot(b)
	runtime := testutil.CUDAStubs(b)
	bin := testutil.Fixture(b, "cudawork")
	for _, setup := range []string{"default", "empty", "launches"} {
		b.Run(setup, func(b *testing.B) {
			b.StopTimer()
			p := testutil.StartProc(b, nil, bin, runtime, "launchbench", "60", strconv.Itoa(b.N))
			p.Wait(b, "loaded", 10*time.Second)
			pr := &model.Process{PID: p.Cmd.Process.Pid}
			var c *Concern
			if setup == "empty" {
				defer attachEmpty(b, pr.PID, runtime, true)()
			} else {
				stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
				if err != nil {
					b.Fatal(err)
				}
				defer stats.Close()
				if c, err = New(Config{ProcRoot: "/proc", Launches: setup == "launches"}, symbolize.New("/proc")); err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				if err := c.Track(pr.PID); err != nil {
					b.Fatal(err)
				}
			}
			b.StartTimer()
			p.Signal(b)
			line := p.Wait(b, "ns ", 10*time.Minute)
			b.StopTimer()
			ns, err := strconv.ParseFloat(strings.TrimPrefix(line, "ns "), 64)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(ns/float64(b.N), "ns/launch")
			if c == nil {
				return
			}
			if _, err := c.Fill(time.Now(), []*model.Process{pr}); err != nil {
				b.Fatal(err)
			}
			// Every launch counted, once, with --launches; none without.
			var counted, want uint64
			if l := pr.CUDA.Launches; l != nil {
				counted = l.Calls["cudaLaunchKernel"]
			}
			if setup == "launches" {
				want = uint64(b.N)
			}
			if counted != want {
				b.Fatalf("%d launches counted, want %d", counted, want)
			}
			var bpf time.Duration
			for _, prog := range c.coll.Programs {
				st, err := prog.Stats()
				if err != nil {
					b.Fatal(err)
				}
				bpf += st.Runtime
			}
			b.ReportMetric(float64(bpf.Nanoseconds())/float64(b.N), "bpf-ns/launch")
		})
	}
}
