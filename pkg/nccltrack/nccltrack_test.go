package nccltrack

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

func newConcern(t testing.TB) *Concern {
	t.Helper()
	testutil.RequireRoot(t)
	c, err := New(Config{ProcRoot: "/proc"}, symbolize.New("/proc"))
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

// ranks starts testdata/ncclrank in mode with the stand-in library, tracks
// its four ranks before they set up their communicator, lets them go and
// returns the ranks' processes, by rank.
func ranks(t *testing.T, c *Concern, mode ...string) (*testutil.Proc, []*model.Process) {
	t.Helper()
	lib := testutil.NCCLStub(t)
	p := testutil.StartProc(t, []string{"NCCLRANK_START=signal"}, testutil.Fixture(t, "ncclrank"), append([]string{lib, mode[0], "60"}, mode[1:]...)...)
	procs := make([]*model.Process, 4)
	for r := range procs {
		// Printed after "ready", which StartProc waited for.
		var rank, pid int
		l := p.Wait(t, fmt.Sprintf("rank %d pid ", r), 5*time.Second)
		if _, err := fmt.Sscanf(l, "rank %d pid %d", &rank, &pid); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		procs[r] = &model.Process{PID: pid}
		if err := c.Track(pid); err != nil {
			t.Fatal(err)
		}
	}
	p.Signal(t)
	p.Wait(t, "communicator of 4 ranks set up", 10*time.Second)
	return p, procs
}

func fill(t *testing.T, c *Concern, procs []*model.Process) {
	t.Helper()
	if _, err := c.Fill(time.Now(), procs); err != nil {
		t.Fatal(err)
	}
}

// only is the one communicator of a rank, or nil.
func only(p *model.Process) *model.NCCLComm {
	if len(p.NCCL.Comms) != 1 {
		return nil
	}
	return &p.NCCL.Comms[0]
}

// Four healthy ranks: one communicator id in all four, their own rank
// numbers, four ranks; counts that grow; bytes of count x element size; the
// last call's site in the fixture's train_step.
func TestFourRanksHealthy(t *testing.T) {
	c := newConcern(t)
	_, procs := ranks(t, c, "healthy")
	lib := testutil.NCCLStub(t)
	var first []uint64
	testutil.Eventually(t, 10*time.Second, "four ranks of one communicator, each past 10 all-reduces", func() bool {
		fill(t, c, procs)
		first = first[:0]
		for _, p := range procs {
			if cm := only(p); cm == nil || cm.Calls["allreduce"] < 10 {
				return false
			}
			first = append(first, only(p).Collectives())
		}
		return true
	})
	id := only(procs[0]).ID
	for r, p := range procs {
		cm := only(p)
		if p.NCCL.Library != lib {
			t.Errorf("rank %d: library %q, want %q", r, p.NCCL.Library, lib)
		}
		if cm.ID != id || cm.ID == "" || cm.Rank != r || cm.NRanks != 4 || cm.Destroyed {
			t.Errorf("rank %d: communicator %q rank %d of %d (destroyed %v), want %q rank %d of 4", r, cm.ID, cm.Rank, cm.NRanks, cm.Destroyed, id, r)
		}
		// The fixture broadcasts 1000 doubles once and all-reduces
		// 262144 floats a step.
		if cm.Calls["broadcast"] != 1 || cm.Bytes["broadcast"] != 8000 {
			t.Errorf("rank %d: broadcast %d calls %d bytes, want 1 call of 8000 bytes", r, cm.Calls["broadcast"], cm.Bytes["broadcast"])
		}
		if n := cm.Calls["allreduce"]; cm.Bytes["allreduce"] != n*(1<<20) {
			t.Errorf("rank %d: %d all-reduces of %d bytes, want 1 MiB each", r, n, cm.Bytes["allreduce"])
		}
		if cm.LastOp != "allreduce" || time.Since(cm.LastTime) > 5*time.Second {
			t.Errorf("rank %d: last call %s at %v", r, cm.LastOp, cm.LastTime)
		}
	}
	testutil.Eventually(t, 10*time.Second, "every rank's count to grow, and the last call's site named", func() bool {
		fill(t, c, procs)
		for r, p := range procs {
			if only(p).Collectives() <= first[r] || !slices.ContainsFunc(testutil.Texts(only(p).LastStack), func(s string) bool { return strings.Contains(s, "train_step") }) {
				return false
			}
		}
		return true
	})
	t.Logf("rank 0's last call site: %v", testutil.Texts(only(procs[0]).LastStack))
}

// A straggler: its count stops below its peers', which stand one ahead.
func TestStraggler(t *testing.T) {
	c := newConcern(t)
	p, procs := ranks(t, c, "straggler", "2", "20")
	for range procs {
		p.Wait(t, "rank ", 10*time.Second)
	}
	// Every rank has stopped: what the kernel counted is final.
	fill(t, c, procs)
	counts := map[int]uint64{}
	for r, pr := range procs {
		if only(pr) == nil {
			t.Fatalf("rank %d: communicators %+v", r, pr.NCCL.Comms)
		}
		counts[r] = only(pr).Collectives()
	}
	// 1 broadcast + 20 all-reduces; the others one more all-reduce.
	want := map[int]uint64{0: 22, 1: 22, 2: 21, 3: 22}
	if !maps.Equal(counts, want) {
		t.Errorf("collectives by rank = %v, want %v", counts, want)
	}
	testutil.Eventually(t, 3*time.Second, "the counts to stand still", func() bool {
		fill(t, c, procs)
		for r, pr := range procs {
			if only(pr).Collectives() != want[r] {
				t.Fatalf("rank %d moved to %d", r, only(pr).Collectives())
			}
		}
		return time.Since(only(procs[2]).LastTime) > time.Second
	})
}

// Torn down: the communicator is marked, its counts kept; a process that
// goes leaves nothing in the kernel's tables.
func TestForget(t *testing.T) {
	c := newConcern(t)
	p, procs := ranks(t, c, "hang", "5")
	for range procs {
		p.Wait(t, "rank ", 10*time.Second)
	}
	fill(t, c, procs)
	for r, pr := range procs {
		if cm := only(pr); cm == nil || cm.Collectives() != 6 {
			t.Fatalf("rank %d: communicators %+v, want one of 6 collectives", r, pr.NCCL.Comms)
		}
		c.Untrack(pr.PID)
	}
	tables, err := c.read()
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 0 {
		t.Errorf("tables after untracking: %v", tables)
	}
	for m, em := range map[string]*ebpf.Map{"comms": c.maps.Comms, "nccl_counters": c.maps.NcclCounters} {
		if n := testutil.Entries(t, em); n != 0 {
			t.Errorf("%s: %d entries left", m, n)
		}
	}
}
