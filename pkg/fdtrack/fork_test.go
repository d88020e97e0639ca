package fdtrack

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// newFollowing loads the programs of mode (the fork program of tp_btf
// sees the child's task; the classic tracepoint's copies the parent's
// table) and follows children.
func newFollowing(t *testing.T, perPoll int, mode string) *Tracker {
	t.Helper()
	return newTrackerConfig(t, Config{Follow: true, ReadsPerPoll: perPoll}, mode)
}

// forkedChild starts fdwork with args (a parent that forks one child a
// second after it is ready), tracks the parent and returns both pids once
// the kernel has marked the child. It must be taken before the next
// Forked, which lets it go.
func forkedChild(t *testing.T, tr *Tracker, args ...string) (parent, child int) {
	t.Helper()
	cmd := testutil.Start(t, testutil.Fixture(t, "fdwork"), args...)
	parent = cmd.Process.Pid
	if err := tr.Track(parent); err != nil {
		t.Fatal(err)
	}
	poll(t, tr, parent)
	testutil.Eventually(t, 10*time.Second, "the kernel to mark the child at its fork", func() bool {
		if kids := tr.Forked(); len(kids) > 0 {
			child = kids[0]
		}
		return child != 0
	})
	return parent, child
}

// fdsOf is the oracle: pid's fds and kinds as /proc links say.
func fdsOf(t *testing.T, pid int) map[int32]uint8 {
	t.Helper()
	fs, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	nums, err := fs.FDNumsNow(pid)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int32]uint8{}
	for _, n := range nums {
		if k, err := fs.FDKind(pid, n); err == nil {
			out[int32(n)] = k
		}
	}
	return out
}

// A child tracked from its fork starts from its parent's table: its fds
// and kinds are what /proc says (what a listing gave before), the fds it
// inherited are not described one by one, and what it did between its
// fork and being taken (a close, a dup2 of an inherited pipe, an open) is
// in its table, the dup with the pipe's kind.
func TestChildInheritsParentTable(t *testing.T) {
	for _, mode := range []string{bpfobj.ModeBTF, bpfobj.ModeTracepoint} {
		t.Run(mode, func(t *testing.T) { testChildInherits(t, mode) })
	}
}

func testChildInherits(t *testing.T, mode string) {
	tr := newFollowing(t, 0, mode)
	const files = 300
	parent, child := forkedChild(t, tr, "family", fmt.Sprint(files), "30")
	// Its last step opens /dev/zero; taken before the next Forked.
	testutil.Eventually(t, 5*time.Second, "the child's own fds", func() bool {
		dir := fmt.Sprintf("/proc/%d/fd/", child)
		if l, err := os.Readlink(dir + "200"); err != nil || !strings.HasPrefix(l, "pipe:") {
			return false
		}
		entries, _ := os.ReadDir(dir)
		return slices.ContainsFunc(entries, func(e os.DirEntry) bool {
			l, _ := os.Readlink(dir + e.Name())
			return l == "/dev/zero"
		})
	})
	before := tr.Reads()
	if err := tr.Track(child); err != nil {
		t.Fatal(err)
	}
	after := tr.Reads()
	if got := after.Inherited - before.Inherited; got < files {
		t.Errorf("%d fds taken from the parent's table, want at least %d", got, files)
	}
	// At most the child's own fds and the numbers nobody knew: not its
	// inherited ones.
	if got := after.Described - before.Described; got > 4 {
		t.Errorf("%d fds described from /proc for the child, want at most 4", got)
	}
	if got := after.Listings - before.Listings; got != 1 {
		t.Errorf("%d listings of the child's fds, want 1", got)
	}
	s := poll(t, tr, child)
	want := fdsOf(t, child)
	got := map[int32]uint8{}
	for _, fd := range s.FDs {
		got[fd.Num] = fd.Kind
		if fd.Known() {
			t.Errorf("fd %d of the child has a stack (none before it was taken)", fd.Num)
		}
	}
	for num, kind := range want {
		if g, ok := got[num]; !ok || g != kind {
			t.Errorf("fd %d: kind %d in the table (present %v), %d in /proc", num, g, ok, kind)
		}
	}
	for num := range got {
		if _, ok := want[num]; !ok {
			t.Errorf("fd %d in the table, not in /proc", num)
		}
	}
	if got[200] != uint8(kindIndex("pipe")) {
		t.Errorf("the dup2 of an inherited pipe has kind %d, want pipe", got[200])
	}
	// The parent's table is its own still.
	if p := poll(t, tr, parent); len(p.FDs) != procCount(t, parent) {
		t.Errorf("parent: %d fds in the table, %d in /proc", len(p.FDs), procCount(t, parent))
	}
}

// A child that exec'd before it was taken: which fds it holds comes from
// the kernel's copy of its open-fd bitmap at exec (the close-on-exec half
// gone), with no listing of /proc, and equals /proc's links.
func TestExecedChildFromKernelCopy(t *testing.T) {
	for _, mode := range []string{bpfobj.ModeBTF, bpfobj.ModeTracepoint} {
		t.Run(mode, func(t *testing.T) { testExecedChild(t, mode) })
	}
}

func testExecedChild(t *testing.T, mode string) {
	tr := newFollowing(t, 0, mode)
	const files = 200
	_, child := forkedChild(t, tr, "spawn", fmt.Sprint(files), "30")
	testutil.Eventually(t, 5*time.Second, "the child's exec", func() bool {
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", child))
		return strings.TrimSpace(string(comm)) == "sleep"
	})
	before := tr.Reads()
	if err := tr.Track(child); err != nil {
		t.Fatal(err)
	}
	after := tr.Reads()
	if after.Copied-before.Copied != 1 || after.Listings != before.Listings {
		t.Errorf("%d copies and %d listings for the child, want 1 and 0", after.Copied-before.Copied, after.Listings-before.Listings)
	}
	if got := after.Inherited - before.Inherited; got < files/2 {
		t.Errorf("%d fds taken from the parent's table, want at least %d", got, files/2)
	}
	if got := after.Described - before.Described; got > 4 {
		t.Errorf("%d fds described from /proc for the child, want at most 4", got)
	}
	s := poll(t, tr, child)
	want := fdsOf(t, child)
	if len(s.FDs) != len(want) {
		t.Errorf("%d fds in the child's table, %d in /proc", len(s.FDs), len(want))
	}
	for _, fd := range s.FDs {
		if k, ok := want[fd.Num]; !ok || k != fd.Kind {
			t.Errorf("fd %d: kind %d in the table, %d in /proc (present %v)", fd.Num, fd.Kind, k, ok)
		}
	}
}

// A child marked at fork is taken only once Forked has offered it, at the
// second poll that sees it: found earlier (the daemon's exec events, the
// --children walk of /proc), Track refuses it, and the Untrack that
// follows a refusal leaves its marking for Forked to offer.
func TestChildTakenWhenOffered(t *testing.T) {
	tr := newFollowing(t, 0, bpfobj.ModeBTF)
	cmd := testutil.Start(t, testutil.Fixture(t, "fdwork"), "family", "10", "30")
	parent := cmd.Process.Pid
	if err := tr.Track(parent); err != nil {
		t.Fatal(err)
	}
	poll(t, tr, parent)
	var child uint32
	testutil.Eventually(t, 10*time.Second, "the kernel to mark the child at its fork", func() bool {
		var fi fdForkInfo
		it := tr.maps.Forks.Iterate()
		for it.Next(&child, &fi) {
			return true
		}
		return false
	})
	if err := tr.Track(int(child)); !errors.Is(err, errNotOffered) {
		t.Fatalf("Track of a child not offered: %v, want errNotOffered", err)
	}
	tr.Untrack(int(child))
	if first := tr.Forked(); len(first) != 0 {
		t.Fatalf("offered %v at the first poll that saw it", first)
	}
	if second := tr.Forked(); !slices.Equal(second, []int{int(child)}) {
		t.Fatalf("offered %v at the second poll, want [%d]", second, child)
	}
	if err := tr.Track(int(child)); err != nil {
		t.Fatal(err)
	}
	if s := poll(t, tr, int(child)); len(s.FDs) < 10 {
		t.Errorf("the child taken holds %d fds, want its parent's 10 files and more", len(s.FDs))
	}
}

// Children forked and gone between two polls are counted with what they
// opened, never listed, and leave nothing in the kernel.
func TestShortLivedChildrenCounted(t *testing.T) {
	tr := newFollowing(t, 0, bpfobj.ModeBTF)
	bin := testutil.Fixture(t, "fdwork")
	cmd := testutil.Start(t, bin, "forker", "50", "0", "5", "30")
	parent := cmd.Process.Pid
	if err := tr.Track(parent); err != nil {
		t.Fatal(err)
	}
	listings := tr.Reads().Listings
	// Each poll leaves the children offered at the last: those gone by
	// now (each lives 0.3 s) are counted.
	testutil.Eventually(t, 15*time.Second, "five short-lived children counted", func() bool {
		tr.Forked()
		if _, err := tr.Poll([]int{parent}); err != nil {
			t.Fatal(err)
		}
		// Measurement window: a poll interval, longer than the 0.3 s the
		// children offered at this poll live, so they are gone at the next.
		time.Sleep(time.Second)
		return tr.Reads().ShortLived >= 5
	})
	r := tr.Reads()
	if r.ShortLivedOpens == 0 {
		t.Error("no fd opened by the short-lived children counted (exec opens the loader's files)")
	}
	if r.Listings != listings {
		t.Errorf("%d listings of fds for children never taken", r.Listings-listings)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	tr.Untrack(parent)
	// The parent gone, a few more polls let its last children go, once
	// they have exited (0.3 s each): nothing of them stays in the kernel.
	left := func() (marked, tracked []uint32) {
		var (
			k   uint32
			fi  fdForkInfo
			how uint8
		)
		for it := tr.maps.Forks.Iterate(); it.Next(&k, &fi); {
			marked = append(marked, k)
		}
		for it := tr.maps.TrackedPids.Iterate(); it.Next(&k, &how); {
			tracked = append(tracked, k)
		}
		return marked, tracked
	}
	testutil.Eventually(t, 10*time.Second, "the last children to be let go", func() bool {
		tr.Forked()
		marked, tracked := left()
		return len(marked) == 0 && len(tracked) == 0
	})
}

// The fds described from /proc are bounded per poll: a table larger than
// the bound fills over several polls, the rest counted as deferred, and
// ends equal to /proc.
func TestDescriptionsBoundedPerPoll(t *testing.T) {
	const bound, files = 100, 450
	tr := newFollowing(t, bound, bpfobj.ModeBTF)
	bin := testutil.Fixture(t, "fdwork")
	cmd := testutil.Start(t, bin, "startup", fmt.Sprint(files), "30")
	pid := cmd.Process.Pid
	if err := tr.Track(pid); err != nil {
		t.Fatal(err)
	}
	r := tr.Reads()
	if r.Described != bound || r.Deferred == 0 {
		t.Fatalf("after Track: %d described, %d deferred; want %d and some", r.Described, r.Deferred, bound)
	}
	var lens []int
	for range 10 {
		prev := tr.Reads().Described
		m, err := tr.Poll([]int{pid})
		if err != nil {
			t.Fatal(err)
		}
		if d := tr.Reads().Described - prev; d > bound {
			t.Fatalf("%d fds described in one poll, bound %d", d, bound)
		}
		lens = append(lens, len(m[pid].FDs))
		if len(m[pid].FDs) == procCount(t, pid) {
			break
		}
	}
	if got, want := lens[len(lens)-1], procCount(t, pid); got != want {
		t.Fatalf("table sizes by poll %v, /proc has %d", lens, want)
	}
	if !slices.IsSorted(lens) || len(lens) < files/bound {
		t.Errorf("table sizes by poll %v: want it filled over at least %d polls", lens, files/bound)
	}
}

// Children forked faster than polls take them, past what the fork tables
// hold: each one not kept is counted as fd_forks (its fds are read from
// /proc at its first poll), not as a full live fd table.
func TestForkStormCounted(t *testing.T) {
	tr := newFollowing(t, 0, bpfobj.ModeBTF)
	// Children that live past the test's polls: more than fork_fds holds
	// (1024) are alive before the first is taken, however slowly the
	// machine forks.
	t.Setenv("FDWORK_CHILD_SECONDS", "60")
	cmd := testutil.Start(t, testutil.Fixture(t, "fdwork"), "forker", "3", "0", "3000", "60")
	parent := cmd.Process.Pid
	t.Cleanup(func() { _ = exec.Command("pkill", "-KILL", "-P", strconv.Itoa(parent)).Run() })
	if err := tr.Track(parent); err != nil {
		t.Fatal(err)
	}
	poll(t, tr, parent)
	// No poll meanwhile: the children pile up in the fork tables.
	testutil.Eventually(t, 50*time.Second, "children not kept from their fork counted as fd_forks", func() bool {
		lost, err := tr.Lost()
		if err != nil {
			t.Fatal(err)
		}
		return lost["fd_forks"] > 0
	})
	lost, err := tr.Lost()
	if err != nil {
		t.Fatal(err)
	}
	if lost["fd_table_full"] != 0 {
		t.Errorf("a fork storm counted as a full live fd table: %v", lost)
	}
}
