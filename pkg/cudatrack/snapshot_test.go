package cudatrack

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// oomMemory is the stand-in's device memory in the oom scenarios: 1 GiB
// asked for never fits.
const oomMemory = "CUDA_STUB_MEMORY=536870912"

// An allocation fails for want of memory with oom_weights' 64 MiB and
// oom_activations' 100 MiB live, and the activations are freed right
// after: the snapshot has both sites as they were at the failure, the
// activations freed after it, and not the failed call's own site. Taken
// whether the process is still there at the poll or has exited.
func TestOOMSnapshot(t *testing.T) {
	for _, exited := range []bool{false, true} {
		t.Run(fmt.Sprintf("exited=%v", exited), func(t *testing.T) {
			c := newConcern(t)
			p, pr := workEnv(t, c, dynamic(t), []string{oomMemory}, "oom")
			p.Signal(t)
			p.Wait(t, "done", 10*time.Second)
			if exited {
				if err := p.Cmd.Process.Kill(); err != nil {
					t.Fatal(err)
				}
				_ = p.Cmd.Wait()
			}
			observe(t, c, pr)
			checkOOMSnapshot(t, c, pr)
		})
	}
}

func checkOOMSnapshot(t *testing.T, c *Concern, pr *model.Process) {
	t.Helper()
	cs := pr.CUDA
	if len(cs.Snapshots) != 1 {
		t.Fatalf("snapshots = %+v, want one", cs.Snapshots)
	}
	s := cs.Snapshots[0]
	if s.Why != model.SnapshotOutOfMemory || s.API != "cudaMalloc" || s.Code != 2 || s.Error != "cudaErrorMemoryAllocation" || s.SizeBytes != 1024*MiB {
		t.Errorf("snapshot's failure: why %s, %s %s (%d), %d bytes", s.Why, s.API, s.Error, s.Code, s.SizeBytes)
	}
	if len(cs.Failures) != 1 || !s.Time.Equal(cs.Failures[0].Time) {
		t.Errorf("snapshot at %v, failures %+v", s.Time, cs.Failures)
	}
	if !stackHas(s.Stack, "oom_grow") {
		t.Errorf("failed call's stack: %q", s.Stack)
	}
	if s.LiveBytes != 164*MiB || s.LiveAllocations != 104 || s.FreedAfterBytes != 100*MiB || s.MissedFrees != 0 || s.OtherSitesBytes != 0 {
		t.Errorf("snapshot: %d bytes live in %d allocations, %d freed after, %d frees missed, %d in other sites; want 164 MiB in 104, 100 MiB, 0, 0",
			s.LiveBytes, s.LiveAllocations, s.FreedAfterBytes, s.MissedFrees, s.OtherSitesBytes)
	}
	want := []struct {
		fn         string
		bytes      uint64
		n          int
		freedAfter uint64
	}{{"oom_activations", 100 * MiB, 100, 100 * MiB}, {"oom_weights", 64 * MiB, 4, 0}}
	if len(s.Sites) != len(want) {
		t.Fatalf("sites = %+v, want oom_activations and oom_weights", s.Sites)
	}
	for i, w := range want {
		got := s.Sites[i]
		if !stackHas(got.Stack, w.fn) || got.Bytes != w.bytes || got.Allocations != w.n || got.FreedAfterBytes != w.freedAfter {
			t.Errorf("site %d = %d bytes in %d, %d freed after, at %q; want %s: %d in %d, %d", i, got.Bytes, got.Allocations, got.FreedAfterBytes, got.Stack, w.fn, w.bytes, w.n, w.freedAfter)
		}
		if got.OldestAgeSeconds <= 0 || got.OldestAgeSeconds > 10 {
			t.Errorf("site %s: oldest allocation %v s old at the failure", w.fn, got.OldestAgeSeconds)
		}
	}
	// Now: only the weights; the activations went after the failure.
	if cs.LiveBytes != 64*MiB {
		t.Errorf("live bytes at the poll %d, want 64 MiB", cs.LiveBytes)
	}
	snapClosed(t, c, pr.PID, true)
	noLoss(t, c)
}

// snapClosed checks that pid's snapshot is closed in the kernel, no other
// to open for a minute when kept, and that nothing is left of it in
// freed_allocs.
func snapClosed(t *testing.T, c *Concern, pid int, kept bool) {
	t.Helper()
	var st cudaCudaSnap
	if err := c.maps.OomSnaps.Lookup(uint32(pid), &st); err != nil {
		t.Fatal(err)
	}
	if st.OpenNs != 0 || (st.NotBeforeNs != 0) != kept {
		t.Errorf("snapshot state after the poll: %+v", st)
	}
	var (
		k cudaCudaAllocKey
		v cudaCudaFreed
		n int
	)
	for it := c.maps.FreedAllocs.Iterate(); it.Next(&k, &v); {
		n++
	}
	if n != 0 {
		t.Errorf("%d allocations left in freed_allocs", n)
	}
}

// A thousand failures a second for three seconds, the agent polling
// through them: one snapshot, the allocations and frees between the
// failures all counted, nothing lost, and the agent's heap as it was.
func TestOOMSnapshotLoop(t *testing.T) {
	c := newConcern(t)
	p, pr := workEnv(t, c, dynamic(t), []string{oomMemory}, "oomloop", "1000", "3")
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	p.Signal(t)
	observe(t, c, pr)
	before := heap()
	var line string
	for ok := false; !ok; {
		line, ok = p.TryWait(t, "fails", 200*time.Millisecond)
		observe(t, c, pr)
	}
	after := heap()
	t.Logf("heap %d bytes before the failure loop, %d after", before, after)
	var fails, pairs uint64
	if _, err := fmt.Sscanf(line, "fails %d pairs %d", &fails, &pairs); err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	cs := pr.CUDA
	if len(cs.Snapshots) != 1 {
		t.Fatalf("%d snapshots, want one", len(cs.Snapshots))
	}
	if s := cs.Snapshots[0]; s.LiveBytes != 64*MiB || len(s.Sites) != 1 || !stackHas(s.Sites[0].Stack, "oom_weights") {
		t.Errorf("snapshot: %d bytes live, sites %+v; want oom_weights' 64 MiB", s.LiveBytes, s.Sites)
	}
	kind := model.CUDAFailureKind{API: "cudaMalloc", Error: "cudaErrorMemoryAllocation"}
	if cs.FailedCalls[kind] != fails {
		t.Errorf("%d failures counted, want %d", cs.FailedCalls[kind], fails)
	}
	if cs.Calls["cudaMalloc"] != 4+pairs+fails || cs.Calls["cudaFree"] != pairs {
		t.Errorf("calls %v, want %d cudaMalloc and %d cudaFree", cs.Calls, 4+pairs+fails, pairs)
	}
	if cs.LiveBytes != 64*MiB {
		t.Errorf("live bytes %d, want 64 MiB", cs.LiveBytes)
	}
	snapClosed(t, c, pr.PID, true)
	noLoss(t, c)
}

// The allocations live at a failure: made at or before it, live at the
// read or freed since it, each once; pinned host memory left out. By site,
// most bytes first, cut at MaxSnapshotSites.
func TestGatherAt(t *testing.T) {
	const at = 1000
	key := func(addr uint64) cudaCudaAllocKey { return cudaCudaAllocKey{Tgid: 7, Addr: addr} }
	alloc := func(size, ns uint64, stack int32, api int) cudaCudaAlloc {
		return cudaCudaAlloc{Size: size, TimeNs: ns, StackId: stack, Api: uint16(api)}
	}
	malloc, host := apiIndex["cudaMalloc"], apiIndex["cudaMallocHost"]
	live := []bpfobj.Entry[cudaCudaAllocKey, cudaCudaAlloc]{
		{Key: key(1), Val: alloc(10, 100, 1, malloc)},
		{Key: key(2), Val: alloc(20, at, 1, malloc)},    // at the failure's instant: in
		{Key: key(3), Val: alloc(40, at+1, 2, malloc)},  // after: out
		{Key: key(4), Val: alloc(80, 200, 2, host)},     // host: out
		{Key: key(5), Val: alloc(160, 300, 3, malloc)},  // also in freed (freed after the read): once, live
		{Key: key(6), Val: alloc(320, at+5, 3, malloc)}, // a new block at a freed address: out
	}
	freed := []bpfobj.Entry[cudaCudaAllocKey, cudaCudaFreed]{
		{Key: key(5), Val: cudaCudaFreed{Alloc: alloc(160, 300, 3, malloc), FreedNs: at + 10}},
		{Key: key(6), Val: cudaCudaFreed{Alloc: alloc(640, 400, 2, malloc), FreedNs: at + 3}}, // in, freed after
		{Key: key(7), Val: cudaCudaFreed{Alloc: alloc(1280, 50, 4, malloc), FreedNs: at}},     // freed at the instant: in
		{Key: key(8), Val: cudaCudaFreed{Alloc: alloc(2560, 60, 4, malloc), FreedNs: at - 1}}, // an earlier snapshot's: out
		{Key: key(9), Val: cudaCudaFreed{Alloc: alloc(5120, 70, 4, host), FreedNs: at + 1}},   // host: out
	}
	canon := func(id int32) int32 {
		if id == 4 {
			return 1 // a stack finished in user space, known under another id
		}
		return id
	}
	held := gatherAt(at, live, freed, canon)
	var s model.GPUMemorySnapshot
	var symbolized []int32
	fillSnapshot(&s, held, at, func(site stacks.Site) []model.Frame {
		symbolized = append(symbolized, site.Stack)
		return []model.Frame{{Function: fmt.Sprintf("site%d", site.Stack)}}
	})
	if s.LiveBytes != 10+20+160+640+1280 || s.LiveAllocations != 5 || s.FreedAfterBytes != 640+1280 || s.OtherSitesBytes != 0 {
		t.Errorf("totals: %d bytes in %d, %d freed after, %d other", s.LiveBytes, s.LiveAllocations, s.FreedAfterBytes, s.OtherSitesBytes)
	}
	want := []model.SnapshotSite{
		{Bytes: 10 + 20 + 1280, Allocations: 3, OldestAgeSeconds: float64(at-50) / 1e9, FreedAfterBytes: 1280, Stack: []model.Frame{{Function: "site1"}}},
		{Bytes: 640, Allocations: 1, OldestAgeSeconds: float64(at-400) / 1e9, FreedAfterBytes: 640, Stack: []model.Frame{{Function: "site2"}}},
		{Bytes: 160, Allocations: 1, OldestAgeSeconds: float64(at-300) / 1e9, Stack: []model.Frame{{Function: "site3"}}},
	}
	if !slices.EqualFunc(s.Sites, want, func(a, b model.SnapshotSite) bool {
		return a.Bytes == b.Bytes && a.Allocations == b.Allocations && a.FreedAfterBytes == b.FreedAfterBytes &&
			a.OldestAgeSeconds == b.OldestAgeSeconds && slices.Equal(a.Stack, b.Stack)
	}) {
		t.Errorf("sites\n%+v\nwant\n%+v", s.Sites, want)
	}

	// More sites than kept: the smallest summed apart, not symbolized.
	live = nil
	n := model.MaxSnapshotSites + 3
	for i := range n {
		live = append(live, bpfobj.Entry[cudaCudaAllocKey, cudaCudaAlloc]{Key: key(uint64(i)), Val: alloc(uint64(1000+i), 1, int32(i), malloc)})
	}
	symbolized = nil
	same := func(id int32) int32 { return id }
	fillSnapshot(&s, gatherAt(at, live, nil, same), at, func(site stacks.Site) []model.Frame {
		symbolized = append(symbolized, site.Stack)
		return nil
	})
	if len(s.Sites) != model.MaxSnapshotSites || len(symbolized) != model.MaxSnapshotSites || s.Sites[0].Bytes != uint64(1000+n-1) {
		t.Errorf("%d sites kept, %d symbolized, the first of %d bytes", len(s.Sites), len(symbolized), s.Sites[0].Bytes)
	}
	if s.OtherSitesBytes != 1000+1001+1002 || s.LiveAllocations != n {
		t.Errorf("other sites' bytes %d, %d allocations; want 3003, %d", s.OtherSitesBytes, s.LiveAllocations, n)
	}
}

// After the first, one snapshot a SnapshotEvery: a failure loop of four
// seconds with a second between snapshots makes a few, each at least a
// second after the one before, each of what was live then.
func TestOOMSnapshotEvery(t *testing.T) {
	testutil.RequireRoot(t)
	c, err := New(Config{ProcRoot: "/proc", Classic: classic, SnapshotEvery: time.Second}, symbolize.New("/proc"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	p, pr := workEnv(t, c, dynamic(t), []string{oomMemory}, "oomloop", "1000", "4")
	p.Signal(t)
	for ok := false; !ok; {
		_, ok = p.TryWait(t, "fails", 200*time.Millisecond)
		observe(t, c, pr)
	}
	snaps := pr.CUDA.Snapshots
	if len(snaps) < 2 {
		t.Fatalf("%d snapshots in 4 s, one a second: want several", len(snaps))
	}
	for i, s := range snaps {
		if s.LiveBytes != 64*MiB {
			t.Errorf("snapshot %d: %d bytes live, want oom_weights' 64 MiB", i, s.LiveBytes)
		}
		// The gate is on the kernel clock; Time is its stamp converted to
		// wall time by each poll's anchor (bpfobj.WallClock: time.Now and
		// CLOCK_MONOTONIC read one after the other), so two polls'
		// conversions differ slightly (999.999708 ms between two
		// snapshots a second apart in the 6.1-rt guest): a millisecond
		// is allowed.
		if i > 0 && s.Time.Sub(snaps[i-1].Time) < time.Second-time.Millisecond {
			t.Errorf("snapshot %d at %v, %v after the one before: want at least a second", i, s.Time, s.Time.Sub(snaps[i-1].Time))
		}
	}
	snapClosed(t, c, pr.PID, true)
	noLoss(t, c)
}
