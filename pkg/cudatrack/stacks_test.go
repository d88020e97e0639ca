package cudatrack

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/fdtrack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/stacks"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// The fd and cuda objects loaded over one stack service use its maps, and
// a sweep deletes only what neither view refers to: the fd view, which
// knows nothing of the allocations, does not take the stacks of live
// allocations from the cuda view; once the allocating process is gone,
// its stacks go.
func TestOneStackService(t *testing.T) {
	testutil.RequireRoot(t)
	proc, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	sym := symbolize.New("/proc")
	svc, err := stacks.New(stacks.Config{Proc: proc, Symbolizer: sym})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	c, err := New(Config{ProcRoot: "/proc", Stacks: svc}, sym)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	fd, err := fdtrack.New(fdtrack.Config{ProcRoot: "/proc", Stacks: svc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fd.Close() })

	mapID := func(m interface{ Info() (*ebpf.MapInfo, error) }) ebpf.MapID {
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		return id
	}
	if mapID(c.maps.UnwoundStacks) != mapID(svc.Replacements()["unwound_stacks"]) {
		t.Fatal("the cuda object has a stack map of its own")
	}

	p, pr := work(t, c, dynamic(t), "leak")
	var site stacks.Site
	testutil.Eventually(t, time.Minute, "the leak's site", func() bool {
		observe(t, c, pr)
		if len(pr.CUDA.Sites) > 0 && stackHas(pr.CUDA.Sites[0].Stack, "leak_weights") {
			site = stacks.SiteOf(pr.CUDA.Sites[0].StackID)
		}
		return site != (stacks.Site{})
	})
	// Both views poll; the fd view tracks nothing, so refers to no stack.
	// Three rounds of sweeping pass.
	for range 3 * 2 * bpfobj.StackGCEvery {
		observe(t, c, pr)
		if _, err := fd.Poll(nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := svc.Stack(site.Stack); err != nil {
		t.Fatalf("the stack of live allocations was swept: %v", err)
	}
	if fr := svc.Frames(pr.PID, site); !stackHas(fr, "leak_weights") {
		t.Fatalf("the live allocations' site reads %q", fr)
	}

	_ = p.Cmd.Process.Kill()
	_ = p.Cmd.Wait()
	c.Untrack(pr.PID)
	for range 3 * 2 * bpfobj.StackGCEvery {
		if _, err := c.Fill(time.Now(), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := fd.Poll(nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := svc.Stack(site.Stack); err == nil {
		t.Fatal("the stack of a process gone is still kept")
	}
}
