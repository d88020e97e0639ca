package cudatrack

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj/bpfobjtest"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

const MiB = 1 << 20

// classic makes newConcern attach uprobe and uretprobe pairs where the
// kernel has session uprobes (Config.Classic); set by forceClassic.
var classic bool

// forceClassic makes the concerns of the rest of the test take the classic
// path, as on kernels before 6.13.
func forceClassic(t *testing.T) {
	classic = true
	t.Cleanup(func() { classic = false })
}

func newConcern(t *testing.T) *Concern {
	t.Helper()
	testutil.RequireRoot(t)
	c, err := New(Config{ProcRoot: "/proc", Classic: classic}, symbolize.New("/proc"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// target is a build of cudawork with the libraries it maps.
type target struct {
	bin, lib string
	before   []string // hooked once tracked
	after    []string // hooked once the runtime is loaded
}

// dynamic is cudawork loading the runtime stand-in late with dlopen.
func dynamic(t *testing.T) target {
	lib := testutil.CUDAStubs(t)
	return target{
		bin:   testutil.Fixture(t, "cudawork"),
		lib:   lib,
		after: []string{filepath.Join(filepath.Dir(lib), "libcuda.so.1"), lib},
	}
}

// static is cudawork with the runtime stand-in linked in.
func static(t *testing.T) target {
	bin := testutil.CUDAStaticWork(t)
	libs := []string{bin, filepath.Join(filepath.Dir(bin), "libcuda.so.1")}
	return target{bin: bin, lib: "-", before: libs, after: libs}
}

// work runs a cudawork scenario in step mode, tracked from before the
// runtime is loaded; it returns once the runtime is loaded and hooked.
func work(t *testing.T, c *Concern, tg target, scenario string, args ...string) (*testutil.Proc, *model.Process) {
	t.Helper()
	return workEnv(t, c, tg, nil, scenario, args...)
}

// workEnv is work with extra environment variables (KEY=VALUE).
func workEnv(t *testing.T, c *Concern, tg target, env []string, scenario string, args ...string) (*testutil.Proc, *model.Process) {
	t.Helper()
	p := testutil.StartProc(t, append([]string{"CUDAWORK_STEP=1"}, env...), tg.bin, append([]string{tg.lib, scenario, "60"}, args...)...)
	pr := &model.Process{PID: p.Cmd.Process.Pid}
	if err := c.Track(pr.PID); err != nil {
		t.Fatal(err)
	}
	observe(t, c, pr)
	if !slices.Equal(pr.CUDA.Libraries, tg.before) {
		t.Fatalf("hooked libraries before the runtime was loaded = %v, want %v", pr.CUDA.Libraries, tg.before)
	}
	p.Signal(t)
	p.Wait(t, "loaded", 10*time.Second)
	// One poll after the dlopen is enough to hook it.
	observe(t, c, pr)
	if !slices.Equal(pr.CUDA.Libraries, tg.after) {
		t.Fatalf("hooked libraries after the runtime was loaded = %v, want %v", pr.CUDA.Libraries, tg.after)
	}
	return p, pr
}

func observe(t *testing.T, c *Concern, pr *model.Process) {
	t.Helper()
	if _, err := c.Fill(time.Now(), []*model.Process{pr}); err != nil {
		t.Fatal(err)
	}
}

func noLoss(t *testing.T, c *Concern) {
	t.Helper()
	lost, err := c.Lost()
	if err != nil {
		t.Fatal(err)
	}
	if len(lost) == 0 {
		t.Fatal("no loss counters")
	}
	for k, v := range lost {
		// The tracker's own stack service counts under stacks_.
		if !strings.HasPrefix(k, "cuda_") && !strings.HasPrefix(k, "stacks_") {
			t.Errorf("loss counter %q lacks the cuda_ or stacks_ prefix", k)
		}
		if v != 0 {
			t.Errorf("lost %s = %d", k, v)
		}
	}
}

func stackHas(stack []model.Frame, fn string) bool {
	return slices.ContainsFunc(stack, func(f model.Frame) bool { return f.Function == fn })
}

// Every runtime allocation API once: each is counted once under its own
// name, and the driver calls the stand-in runtime makes are not counted.
func TestRuntimeCountedOnce(t *testing.T) {
	runOnce(t, newConcern(t), dynamic(t))
}

// A runtime linked into the executable is found in its .symtab and hooked
// there.
func TestStaticRuntime(t *testing.T) {
	runOnce(t, newConcern(t), static(t))
}

// The same through one perf-event uprobe per function, as on kernels
// without uprobe_multi links.
func TestRuntimeCountedOncePerFunction(t *testing.T) {
	saved := haveUprobeMulti
	haveUprobeMulti = func() bool { return false }
	c := newConcern(t)
	haveUprobeMulti = saved
	if c.multi {
		t.Fatal("still using uprobe_multi links")
	}
	runOnce(t, c, dynamic(t))
}

func runOnce(t *testing.T, c *Concern, tg target) {
	p, pr := work(t, c, tg, "once")
	p.Signal(t)
	p.Wait(t, "done", 10*time.Second)
	observe(t, c, pr)
	cs := pr.CUDA
	wantAlloc := map[string]uint64{
		"cudaMalloc": 1 * MiB, "cudaMallocAsync": 2 * MiB, "cudaMallocFromPoolAsync": 3 * MiB,
		"cudaMallocManaged": 4 * MiB, "cudaMallocPitch": 1024 * 10, "cudaMallocHost": 5 * MiB, "cudaHostAlloc": 6 * MiB,
	}
	for api, n := range wantAlloc {
		if cs.AllocCalls[api] != 1 || cs.AllocBytes[api] != n {
			t.Errorf("%s: %d calls, %d bytes; want 1 call, %d bytes", api, cs.AllocCalls[api], cs.AllocBytes[api], n)
		}
	}
	if len(cs.AllocCalls) != len(wantAlloc) {
		t.Errorf("allocation calls by API = %v, want only the runtime's", cs.AllocCalls)
	}
	wantFree := map[string]uint64{"cudaFreeAsync": 2 * MiB, "cudaFree": 4 * MiB, "cudaFreeHost": 5 * MiB}
	for api, n := range wantFree {
		if cs.Calls[api] != 1 || cs.FreeBytes[api] != n {
			t.Errorf("%s: %d calls, %d bytes freed; want 1 call, %d bytes", api, cs.Calls[api], cs.FreeBytes[api], n)
		}
	}
	for api := range cs.Calls {
		if APIs[apiIndex[api]].Layer != LayerRuntime {
			t.Errorf("driver call %s counted (%d) inside runtime calls", api, cs.Calls[api])
		}
	}
	if want := uint64(1*MiB + 3*MiB + 10240); cs.LiveBytes != want || cs.LiveAllocs != 3 || cs.HostLiveBytes != 6*MiB {
		t.Errorf("live: %d device bytes in %d allocations, %d host bytes; want %d in 3, 6 MiB", cs.LiveBytes, cs.LiveAllocs, cs.HostLiveBytes, want)
	}
	// The kernel's running sum leaves pinned host memory out too.
	if got := kernelLive(t, c, pr.PID); got != int64(cs.LiveBytes) {
		t.Errorf("kernel live sum %d, table %d", got, cs.LiveBytes)
	}
	if cs.HostAllocBytes != 11*MiB {
		t.Errorf("host bytes allocated %d, want 11 MiB (cudaMallocHost + cudaHostAlloc)", cs.HostAllocBytes)
	}
	if len(cs.Failures) != 0 {
		t.Errorf("failures: %+v", cs.Failures)
	}
	noLoss(t, c)
}

// The driver API called directly is counted under the driver's names, VMM
// handles included.
func TestDriverDirect(t *testing.T) {
	c := newConcern(t)
	p, pr := work(t, c, dynamic(t), "driver")
	p.Signal(t)
	p.Wait(t, "done", 10*time.Second)
	observe(t, c, pr)
	cs := pr.CUDA
	want := map[string]uint64{"cuMemAlloc_v2": 1, "cuMemCreate": 1, "cuMemAllocHost_v2": 1, "cuMemMap": 1, "cuMemUnmap": 1, "cuMemFreeHost": 1}
	if len(cs.Calls) != len(want) {
		t.Errorf("calls = %v, want %v", cs.Calls, want)
	}
	for api, n := range want {
		if cs.Calls[api] != n {
			t.Errorf("calls[%s] = %d, want %d (all: %v)", api, cs.Calls[api], n, cs.Calls)
		}
	}
	if cs.AllocCalls["cuMemMap"] != 0 || cs.AllocCalls["cuMemAlloc_v2"] != 1 {
		t.Errorf("allocation calls = %v", cs.AllocCalls)
	}
	if cs.AllocBytes["cuMemAlloc_v2"] != 8*MiB || cs.AllocBytes["cuMemCreate"] != 2*MiB || cs.FreeBytes["cuMemFreeHost"] != 3*MiB {
		t.Errorf("bytes: allocated %v, freed %v", cs.AllocBytes, cs.FreeBytes)
	}
	if cs.LiveBytes != 10*MiB || cs.LiveAllocs != 2 || cs.HostLiveBytes != 0 {
		t.Errorf("live: %d bytes in %d allocations, want 10 MiB in 2", cs.LiveBytes, cs.LiveAllocs)
	}
	if got := kernelLive(t, c, pr.PID); got != 10*MiB {
		t.Errorf("kernel live sum %d, want 10 MiB", got)
	}
	if cs.HostAllocBytes != 3*MiB {
		t.Errorf("host bytes allocated %d, want 3 MiB (cuMemAllocHost_v2)", cs.HostAllocBytes)
	}
	noLoss(t, c)
}

func TestFailure(t *testing.T) {
	c := newConcern(t)
	p, pr := work(t, c, dynamic(t), "fail")
	p.Signal(t)
	p.Wait(t, "done", 10*time.Second)
	observe(t, c, pr)
	cs := pr.CUDA
	// The driver failed too, inside the runtime call: one failure only.
	if len(cs.Failures) != 1 {
		t.Fatalf("failures = %+v, want one", cs.Failures)
	}
	f := cs.Failures[0]
	if f.API != "cudaMalloc" || f.Code != 2 || f.Error != "cudaErrorMemoryAllocation" || f.Size != 2048*MiB {
		t.Errorf("failure = %+v", f)
	}
	if !stackHas(f.Stack, "load_checkpoint") {
		t.Errorf("failing function not in stack: %q", f.Stack)
	}
	if cs.AllocCalls["cudaMalloc"] != 1 || cs.LiveAllocs != 0 || len(cs.AllocBytes) != 0 {
		t.Errorf("after a failed call: calls %v, bytes %v, live %d", cs.AllocCalls, cs.AllocBytes, cs.LiveAllocs)
	}
	noLoss(t, c)
}

// A failed pitched allocation reports the bytes asked for, width x rows: the
// pitch is never written when the call fails. Through the runtime and the
// driver called directly.
func TestPitchFailure(t *testing.T) {
	c := newConcern(t)
	tg := dynamic(t)
	tg.bin = filepath.Join(t.TempDir(), "pitchfail")
	if out, err := exec.Command("gcc", "-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-o", tg.bin,
		filepath.Join("testdata", "pitchfail.c")).CombinedOutput(); err != nil {
		t.Fatalf("building pitchfail: %v\n%s", err, out)
	}
	p, pr := work(t, c, tg, "pitch")
	p.Signal(t)
	p.Wait(t, "done", 10*time.Second)
	observe(t, c, pr)
	cs := pr.CUDA
	// The runtime's call fails in the driver too: one failure for it.
	if len(cs.Failures) != 2 {
		t.Fatalf("failures = %+v, want two", cs.Failures)
	}
	want := []struct {
		api, fn string
		size    uint64
	}{
		{"cudaMallocPitch", "load_image", 3000 * 1000000},
		{"cuMemAllocPitch_v2", "load_image_driver", 5000 * 300000},
	}
	for i, w := range want {
		f := cs.Failures[i]
		if f.API != w.api || f.Code != 2 || f.Size != w.size {
			t.Errorf("failure %d = %s code %d size %d; want %s code 2 size %d", i, f.API, f.Code, f.Size, w.api, w.size)
		}
		if n := cs.FailedCalls[model.CUDAFailureKind{API: f.API, Error: f.Error}]; n != 1 {
			t.Errorf("failures of %s with %s counted %d times, want 1", f.API, f.Error, n)
		}
		if !stackHas(f.Stack, w.fn) {
			t.Errorf("failure %d: %s not in stack %q", i, w.fn, f.Stack)
		}
	}
	if cs.LiveAllocs != 0 || len(cs.AllocBytes) != 0 || cs.HostAllocBytes != 0 {
		t.Errorf("after failed calls: bytes %v, live %d, host %d", cs.AllocBytes, cs.LiveAllocs, cs.HostAllocBytes)
	}
	noLoss(t, c)
}

// Live bytes grow, and the largest site is the leaking function.
func TestLeak(t *testing.T) {
	c := newConcern(t)
	_, pr := work(t, c, dynamic(t), "leak")
	// Poll until live bytes have grown at three polls: a loaded machine
	// may starve the workload for a while.
	var live []uint64
	grew := 0
	testutil.Eventually(t, time.Minute, "live bytes to grow at three polls", func() bool {
		observe(t, c, pr)
		if n := len(live); n > 0 && pr.CUDA.LiveBytes > live[n-1] {
			grew++
		}
		live = append(live, pr.CUDA.LiveBytes)
		return grew >= 3
	})
	for i := 1; i < len(live); i++ {
		if live[i] < live[i-1] {
			t.Errorf("live bytes fell while leaking: %v", live)
		}
	}
	cs := pr.CUDA
	if len(cs.Sites) == 0 {
		t.Fatal("no allocation sites")
	}
	top := cs.Sites[0]
	if !stackHas(top.Stack, "leak_weights") {
		t.Errorf("top site is not the leak: %q", top.Stack)
	}
	if top.Bytes != uint64(len(top.Allocs))*MiB || top.Bytes+256<<10 < cs.LiveBytes {
		t.Errorf("top site holds %d bytes in %d allocations; process %d live", top.Bytes, len(top.Allocs), cs.LiveBytes)
	}
	if cs.FreeBytes["cudaFree"] == 0 || cs.AllocCalls["cuMemAlloc_v2"] != 0 {
		t.Errorf("bytes freed %v, allocation calls %v", cs.FreeBytes, cs.AllocCalls)
	}
	noLoss(t, c)
}

// A burst much larger than anything streamed: every allocation is in the
// live table while held, and none after the release.
func TestBurst(t *testing.T) {
	const n = 20000
	c := newConcern(t)
	p, pr := work(t, c, dynamic(t), "burst", "20000")
	p.Signal(t)
	for round := range 2 {
		p.Wait(t, "held", 60*time.Second)
		observe(t, c, pr)
		cs := pr.CUDA
		if cs.LiveAllocs != n || cs.LiveBytes != n*64<<10 {
			t.Fatalf("round %d held: %d allocations, %d bytes; want %d, %d", round, cs.LiveAllocs, cs.LiveBytes, n, n*64<<10)
		}
		if len(cs.Sites) != 1 || !stackHas(cs.Sites[0].Stack, "burst_alloc") || len(cs.Sites[0].Allocs) != n {
			t.Fatalf("round %d sites: %+v", round, cs.Sites)
		}
		if got := kernelLive(t, c, pr.PID); got != n*64<<10 || cs.LivePeakBytes != n*64<<10 {
			t.Errorf("round %d held: kernel live sum %d, peak %d; want %d", round, got, cs.LivePeakBytes, n*64<<10)
		}
		p.Signal(t)
		p.Wait(t, "released", 60*time.Second)
		observe(t, c, pr)
		cs = pr.CUDA
		if cs.LiveAllocs != 0 || cs.LiveBytes != 0 {
			t.Fatalf("round %d released: %d allocations, %d bytes left", round, cs.LiveAllocs, cs.LiveBytes)
		}
		// The site holds nothing and keeps what went through it, each
		// free credited to it.
		made := uint64(n * (round + 1))
		if len(cs.Sites) != 1 || cs.Sites[0].Bytes != 0 || cs.Sites[0].AllocCalls != made || cs.Sites[0].FreeCalls != made ||
			cs.Sites[0].AllocBytes != made*64<<10 || cs.Sites[0].FreeBytes != made*64<<10 {
			t.Fatalf("round %d released: sites %+v, want one that allocated and freed %d × 64 KiB", round, cs.Sites, made)
		}
		if got := kernelLive(t, c, pr.PID); got != 0 {
			t.Errorf("round %d released: kernel live sum %d, want 0", round, got)
		}
		if got := cs.AllocCalls["cudaMalloc"]; got != uint64(n*(round+1)) {
			t.Errorf("round %d: %d cudaMalloc calls, want %d", round, got, n*(round+1))
		}
		if cs.AllocBytes["cudaMalloc"] != cs.FreeBytes["cudaFree"] {
			t.Errorf("round %d: allocated %d bytes, freed %d", round, cs.AllocBytes["cudaMalloc"], cs.FreeBytes["cudaFree"])
		}
		p.Signal(t)
	}
	noLoss(t, c)
}

// kernelLive is the kernel's running sum of pid's live device bytes.
func kernelLive(t *testing.T, c *Concern, pid int) int64 {
	t.Helper()
	var v int64
	if err := c.maps.LiveBytes.Lookup(uint32(pid), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Memory taken and released between two polls shows in the peak the kernel
// keeps, and the peak starts over at each poll.
func TestPeakBetweenPolls(t *testing.T) {
	const n = 2000
	c := newConcern(t)
	p, pr := work(t, c, dynamic(t), "burst", "2000")
	p.Signal(t)
	p.Wait(t, "held", 60*time.Second)
	p.Signal(t)
	p.Wait(t, "released", 60*time.Second)
	observe(t, c, pr)
	if cs := pr.CUDA; cs.LiveBytes != 0 || cs.LivePeakBytes != n*64<<10 {
		t.Fatalf("after a burst between polls: live %d, peak %d; want 0, %d", cs.LiveBytes, cs.LivePeakBytes, n*64<<10)
	}
	observe(t, c, pr)
	if cs := pr.CUDA; cs.LivePeakBytes != 0 {
		t.Errorf("next poll, nothing allocated: peak %d, want 0", cs.LivePeakBytes)
	}
	// Held across a poll: the peak of the interval after it includes the
	// bytes live at its start.
	p.Signal(t)
	p.Wait(t, "held", 60*time.Second)
	observe(t, c, pr)
	p.Signal(t)
	p.Wait(t, "released", 60*time.Second)
	observe(t, c, pr)
	if cs := pr.CUDA; cs.LiveBytes != 0 || cs.LivePeakBytes != n*64<<10 {
		t.Errorf("released after a poll: live %d, peak %d; want 0, %d", cs.LiveBytes, cs.LivePeakBytes, n*64<<10)
	}
	noLoss(t, c)
}

// Where the kernel has session uprobes they are what the hooks use; the
// classic pairs (kernels 5.10 to 6.12) pass the same tests on this kernel.
func TestAttachPaths(t *testing.T) {
	testutil.RequireRoot(t)
	if !bpfobj.Probe().UprobeSession {
		if testutil.KernelAtLeast(t, 6, 13) {
			t.Error("kernel 6.13 or later: session uprobes not found")
		}
		t.Log("no session uprobes on this kernel: the classic path only")
	} else if c := newConcern(t); !c.session || c.AttachPath() != "session uprobes" {
		t.Fatalf("session uprobes present but not used: %s", c.AttachPath())
	}
	forceClassic(t)
	if c := newConcern(t); c.session || c.AttachPath() != "uprobe_multi pairs" {
		t.Fatalf("Classic set, hooks attached as %s", c.AttachPath())
	}
	t.Run("every API once", TestRuntimeCountedOnce)
	t.Run("static runtime", TestStaticRuntime)
	t.Run("driver direct", TestDriverDirect)
	t.Run("free then deeper allocation", TestFreeThenDeeperAlloc)
	t.Run("failure", TestFailure)
	t.Run("pitch failure", TestPitchFailure)
	t.Run("leak", TestLeak)
	t.Run("peak between polls", TestPeakBetweenPolls)
	t.Run("steady", TestSteady)
	t.Run("shared hooks", TestSharedHooks)
	t.Run("untrack and close", TestUntrackAndClose)
	t.Run("python", TestPythonFramesAtAllocations)
	t.Run("waits", TestWaits)
	t.Run("launches", TestLaunches)
	t.Run("oom snapshot", TestOOMSnapshot)
	t.Run("oom loop", TestOOMSnapshotLoop)
}

// A shape without a session program (one added to the classic path only)
// keeps its uprobe_multi pair beside the other shapes' session uprobes.
func TestSessionBesidePairs(t *testing.T) {
	testutil.RequireRoot(t)
	if !bpfobj.Probe().UprobeSession {
		t.Skip("no session uprobes on this kernel")
	}
	saved := loadSpec
	loadSpec = func() (*ebpf.CollectionSpec, error) {
		spec, err := saved()
		if err == nil {
			delete(spec.Programs, cudaProgCudaFreeSession)
			delete(spec.Programs, cudaProgCudaCountSession)
		}
		return spec, err
	}
	t.Cleanup(func() { loadSpec = saved })
	c := newConcern(t)
	if c.sessions[shapeAlloc] == nil || c.byShape[shapeAlloc] != nil || c.sessions[shapeFree] != nil || c.byShape[shapeFree] == nil || c.ret[LayerRuntime] == nil {
		t.Fatalf("programs: session %v, classic %v, returns %v", c.sessions, c.byShape, c.ret)
	}
	if got := c.AttachPath(); got != "session uprobes, uprobe_multi pairs for shapes without a session program" {
		t.Errorf("attach path %q", got)
	}
	t.Run("every API once", TestRuntimeCountedOnce)
	t.Run("driver direct", TestDriverDirect)
	t.Run("free then deeper allocation", TestFreeThenDeeperAlloc)
	t.Run("untrack and close", TestUntrackAndClose)
	t.Run("waits", TestWaits)
}

// A free's return is not probed on the session path, and its state stays
// behind: an allocation made after it from a deeper frame is counted (not
// taken for a call nested in the free), and the driver calls nested in
// either are not.
func TestFreeThenDeeperAlloc(t *testing.T) {
	c := newConcern(t)
	p, pr := work(t, c, dynamic(t), "depth")
	p.Signal(t)
	p.Wait(t, "done", 10*time.Second)
	observe(t, c, pr)
	cs := pr.CUDA
	if cs.AllocCalls["cudaMalloc"] != 2 || cs.AllocBytes["cudaMalloc"] != 8*MiB {
		t.Errorf("cudaMalloc: %d calls, %d bytes; want 2 calls, 8 MiB", cs.AllocCalls["cudaMalloc"], cs.AllocBytes["cudaMalloc"])
	}
	if cs.Calls["cudaFree"] != 2 || cs.FreeBytes["cudaFree"] != 8*MiB {
		t.Errorf("cudaFree: %d calls, %d bytes; want 2 calls, 8 MiB", cs.Calls["cudaFree"], cs.FreeBytes["cudaFree"])
	}
	for api, n := range cs.Calls {
		if APIs[apiIndex[api]].Layer != LayerRuntime {
			t.Errorf("driver call %s counted (%d) inside runtime calls", api, n)
		}
	}
	if cs.LiveBytes != 0 || cs.LiveAllocs != 0 {
		t.Errorf("live: %d bytes in %d allocations, want none", cs.LiveBytes, cs.LiveAllocs)
	}
	noLoss(t, c)
}

// The fallbacks of kernels before 5.15 and 6.1, taken on this one: an entry
// program per hooked function (no cookies), per-thread state in an LRU hash
// (no task storage), hash maps preallocated.
func TestOlderKernelFallbacks(t *testing.T) {
	bpfobjtest.OlderKernel(t)
	t.Run("every API once", func(t *testing.T) { runOnce(t, newConcern(t), dynamic(t)) })
	t.Run("leak", TestLeak)
	t.Run("peak between polls", TestPeakBetweenPolls)
	t.Run("failure", TestFailure)
	t.Run("python", TestPythonFramesAtAllocations)
	t.Run("waits", func(t *testing.T) { runWaits(t, newConcern(t), dynamic(t)) })
	t.Run("launches", TestLaunches)
	t.Run("oom snapshot", TestOOMSnapshot)
}

// Balanced allocation and release: live bytes stay within the working set.
func TestSteady(t *testing.T) {
	c := newConcern(t)
	_, pr := work(t, c, dynamic(t), "steady")
	// 32 buffers of 128 KiB at a time; a sample races with the workload by
	// at most one working set.
	const bound = 2 * 32 * 128 << 10
	// Poll until allocations were seen at five polls.
	var calls []uint64
	grew := 0
	testutil.Eventually(t, time.Minute, "allocations seen at five polls", func() bool {
		observe(t, c, pr)
		if pr.CUDA.LiveBytes > bound {
			t.Errorf("live bytes %d above the working set", pr.CUDA.LiveBytes)
		}
		n := pr.CUDA.AllocCalls["cudaMalloc"]
		if len(calls) > 0 && n > calls[len(calls)-1] {
			grew++
		}
		calls = append(calls, n)
		return grew >= 5
	})
	cs := pr.CUDA
	// Either way: a free is counted at its entry, and may be read before
	// the count of its allocation's return on another thread.
	if d := int64(cs.AllocBytes["cudaMalloc"]) - int64(cs.FreeBytes["cudaFree"]); d > bound || d < -bound {
		t.Errorf("allocated %d, freed %d", cs.AllocBytes["cudaMalloc"], cs.FreeBytes["cudaFree"])
	}
	noLoss(t, c)
}

// Processes mapping the same library share its hooks: a process that
// comes or goes attaches or detaches nothing while another one maps it, an
// untracked process that calls it is not counted, and the last one gone
// detaches it.
func TestSharedHooks(t *testing.T) {
	c := newConcern(t)
	tg := dynamic(t)
	_, a := work(t, c, tg, "steady")
	hooks := maps.Clone(c.hooks)
	if len(hooks) != 2 {
		t.Fatalf("%d files hooked, want the runtime and the driver", len(hooks))
	}
	_, b := work(t, c, tg, "steady")
	if !maps.Equal(c.hooks, hooks) {
		t.Fatal("a second process mapping the same files attached them again")
	}
	// Running the same library, never tracked.
	u := testutil.StartProc(t, []string{"CUDAWORK_STEP=1"}, tg.bin, tg.lib, "steady", "60")
	u.Signal(t)
	u.Wait(t, "loaded", 10*time.Second)
	c.Untrack(a.PID)
	if !maps.Equal(c.hooks, hooks) {
		t.Fatal("forgetting one of two processes detached the library")
	}
	start := b.CUDA.AllocCalls["cudaMalloc"]
	waitCalls := func(pr *model.Process, from uint64) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, fmt.Sprintf("pid %d: cudaMalloc calls past %d", pr.PID, from), func() bool {
			observe(t, c, pr)
			return pr.CUDA.AllocCalls["cudaMalloc"] > from
		})
	}
	waitCalls(b, start)
	// The untracked process allocated meanwhile; none of it is kept.
	live, err := c.live.Read(c.tracked)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{a.PID, u.Cmd.Process.Pid} {
		if n := len(live[uint32(pid)]); n != 0 {
			t.Errorf("pid %d (not tracked): %d live allocations kept", pid, n)
		}
	}
	c.Untrack(b.PID)
	if len(c.hooks) != 0 {
		t.Errorf("%d files still hooked after the last process went", len(c.hooks))
	}
	noLoss(t, c)
}

// A tracked process has kernel entries only once it maps a CUDA library:
// in --all most never do.
func TestCountedOnceMapped(t *testing.T) {
	c := newConcern(t)
	tg := dynamic(t)
	p := testutil.StartProc(t, []string{"CUDAWORK_STEP=1"}, tg.bin, tg.lib, "steady", "60")
	pr := &model.Process{PID: p.Cmd.Process.Pid}
	if err := c.Track(pr.PID); err != nil {
		t.Fatal(err)
	}
	observe(t, c, pr)
	var v uint8
	if err := c.maps.TrackedPids.Lookup(uint32(pr.PID), &v); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("kernel entries before the runtime was loaded: %v", err)
	}
	if pr.CUDA.AllocCalls["cudaMalloc"] != 0 || pr.CUDA.LiveBytes != 0 {
		t.Errorf("a process without CUDA: %+v", pr.CUDA)
	}
	p.Signal(t)
	p.Wait(t, "loaded", 10*time.Second)
	observe(t, c, pr)
	if err := c.maps.TrackedPids.Lookup(uint32(pr.PID), &v); err != nil {
		t.Fatalf("no kernel entries once the runtime is loaded: %v", err)
	}
	c.Untrack(pr.PID)
	if err := c.maps.CudaCounters.Lookup(uint32(pr.PID), &[]cudaCudaCounts{}); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("counters left after Untrack: %v", err)
	}
}

// A library unloaded with dlclose is unhooked at the next poll.
func TestUnload(t *testing.T) {
	c := newConcern(t)
	p, pr := work(t, c, dynamic(t), "unload")
	p.Signal(t)
	p.Wait(t, "done", 10*time.Second)
	observe(t, c, pr)
	if len(pr.CUDA.Libraries) != 0 {
		t.Errorf("libraries still hooked after dlclose: %v", pr.CUDA.Libraries)
	}
	if len(c.hooks) != 0 {
		t.Errorf("%d files still hooked after dlclose", len(c.hooks))
	}
}

// After Untrack nothing of the process stays; after Close no program of
// ours stays loaded.
func TestUntrackAndClose(t *testing.T) {
	testutil.RequireRoot(t)
	c, err := New(Config{ProcRoot: "/proc", Classic: classic}, symbolize.New("/proc"))
	if err != nil {
		t.Fatal(err)
	}
	_, pr := work(t, c, dynamic(t), "steady")
	// Untrack must have calls made since the last poll to drop.
	kernelCalls := func() (n uint64) {
		var per []cudaCudaCounts
		if err := c.maps.CudaCounters.Lookup(uint32(pr.PID), &per); err != nil {
			t.Fatal(err)
		}
		for _, cpu := range per {
			for _, k := range cpu.Calls {
				n += k
			}
		}
		return n
	}
	polled := kernelCalls()
	testutil.Eventually(t, 10*time.Second, "calls counted in the kernel since the last poll", func() bool { return kernelCalls() > polled })
	var linkIDs []link.ID
	for _, at := range c.hooks {
		for _, l := range at.links {
			info, err := l.Info()
			if err != nil {
				t.Fatal(err)
			}
			linkIDs = append(linkIDs, info.ID)
		}
	}
	if len(linkIDs) == 0 {
		t.Fatal("no links")
	}
	c.Untrack(pr.PID)
	// Detached at once, whichever way they were attached.
	for _, id := range linkIDs {
		if l, err := link.NewFromID(id); err == nil {
			_ = l.Close()
			t.Errorf("link %d left after Untrack", id)
		}
	}
	// Allocations made since the last poll go at the next.
	if _, err := c.Poll(nil); err != nil {
		t.Fatal(err)
	}
	if libs := c.Libraries(pr.PID); len(libs) != 0 {
		t.Errorf("libraries still hooked after Untrack: %v", libs)
	}
	var sum int64
	var peak []cudaCudaPeak
	if err := c.maps.LiveBytes.Lookup(uint32(pr.PID), &sum); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("live bytes of an untracked process: %d, %v", sum, err)
	}
	if err := c.maps.PeakBytes.Lookup(uint32(pr.PID), &peak); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("peak bytes of an untracked process: %d, %v", peak, err)
	}
	var key cudaCudaAllocKey
	var val cudaCudaAlloc
	it := c.maps.LiveAllocs.Iterate()
	for it.Next(&key, &val) {
		if int(key.Tgid) == pr.PID {
			t.Fatalf("live allocation of an untracked process: %+v", key)
		}
	}
	var ids []ebpf.ProgramID
	for _, p := range c.coll.Programs {
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		ids = append(ids, id)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// The kernel frees a program once the last link's RCU grace period has
	// passed, after Close returns.
	for _, id := range ids {
		testutil.Eventually(t, 10*time.Second, fmt.Sprintf("program %d to be unloaded after Close", id), func() bool {
			p, err := ebpf.NewProgramFromID(id)
			if err != nil {
				return true
			}
			p.Close()
			return false
		})
	}
}

// cudartInstalled reports whether the real CUDA runtime is installed
// (scripts/install-cuda-libs.sh).
func cudartInstalled() bool {
	out, err := exec.Command("ldconfig", "-p").Output()
	return err == nil && strings.Contains(string(out), "libcudart.so.11.0")
}

// The real libcudart: without a GPU cudaMalloc fails, and the failure is
// reported by name with the calling function in its stack. With a GPU it
// succeeds, and the allocation is counted once.
func TestRealRuntime(t *testing.T) {
	if !cudartInstalled() {
		if os.Getenv("CI") != "" {
			t.Fatal("libcudart.so.11.0 is not installed: run scripts/install-cuda-libs.sh")
		}
		t.Skip("libcudart.so.11.0 not installed (scripts/install-cuda-libs.sh)")
	}
	c := newConcern(t)
	bin := testutil.Fixture(t, "realcuda")
	p := testutil.StartProc(t, nil, bin, "30")
	pr := &model.Process{PID: p.Cmd.Process.Pid}
	if err := c.Track(pr.PID); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "a failed cudaMalloc or a cudaFree", func() bool {
		observe(t, c, pr)
		return len(pr.CUDA.Failures) > 0 || pr.CUDA.FreeBytes["cudaFree"] > 0
	})
	cs := pr.CUDA
	// The soname is a link to the versioned file, which is what is mapped.
	if !strings.Contains(strings.Join(cs.Libraries, ","), "libcudart.so.11") {
		t.Errorf("libcudart not among hooked libraries: %v", cs.Libraries)
	}
	if len(cs.Failures) == 0 {
		if cs.FreeBytes["cudaFree"] == 0 {
			t.Fatalf("neither a failure nor an allocation seen: %+v", cs)
		}
		// A GPU is present: the allocation is counted under the runtime only.
		if cs.AllocBytes["cudaMalloc"] < 64*MiB || cs.AllocCalls["cuMemAlloc_v2"] != 0 {
			t.Errorf("allocated %v in %v", cs.AllocBytes, cs.AllocCalls)
		}
		t.Logf("GPU present: %v calls, %v bytes allocated, %v freed", cs.AllocCalls, cs.AllocBytes, cs.FreeBytes)
		noLoss(t, c)
		return
	}
	f := cs.Failures[0]
	// No GPU: cudaErrorNoDevice with a driver, cudaErrorInsufficientDriver
	// without one (libcuda.so.1 absent).
	if f.API != "cudaMalloc" || (f.Error != "cudaErrorNoDevice" && f.Error != "cudaErrorInsufficientDriver") || f.Size != 64*MiB {
		t.Errorf("failure = %+v", f)
	}
	if !stackHas(f.Stack, "allocate_weights") {
		t.Errorf("calling function not in stack: %q", f.Stack)
	}
	t.Logf("real cudaMalloc failed with %d %s; stack %q", f.Code, f.Error, f.Stack)
	noLoss(t, c)
}
