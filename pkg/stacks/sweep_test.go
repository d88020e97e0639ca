package stacks

import (
	"errors"
	"math/bits"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
	"github.com/open-autoglm/autoglm-ebpf/pkg/unwind"
)

// sweepService is a real service with no object loaded over it: only the
// test writes its maps.
func sweepService(t *testing.T) *Service {
	t.Helper()
	testutil.RequireRoot(t)
	proc, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Proc: proc, Symbolizer: symbolize.New("/proc")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("closing the service: %v", err)
		}
	})
	return s
}

// putStack stores a stack under id, as the kernel side would.
func putStack(t *testing.T, s *Service, id uint32) {
	t.Helper()
	st := stacksUnwoundStack{Hash: 0x5eed0000 + uint64(id), N: 1}
	st.Pcs[0] = 0x400000 + uint64(id)
	if err := s.maps[stacksMapUnwoundStacks].Update(id, st, ebpf.UpdateNoExist); err != nil {
		t.Fatalf("storing stack %d: %v", id, err)
	}
}

// hasStack reports whether the stack map holds id, with what putStack stored.
func hasStack(t *testing.T, s *Service, id uint32) bool {
	t.Helper()
	var st stacksUnwoundStack
	err := s.maps[stacksMapUnwoundStacks].Lookup(id, &st)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return false
	}
	if err != nil {
		t.Fatalf("looking up stack %d: %v", id, err)
	}
	if st.Hash != 0x5eed0000+uint64(id) || st.N != 1 || st.Pcs[0] != 0x400000+uint64(id) {
		t.Fatalf("stack %d holds %+v, not what was stored", id, st)
	}
	return true
}

// wantIn checks, key by key, which of want the map holds (has), what
// naming the map's entries in the messages.
func wantIn(t *testing.T, when, what string, want map[uint32]bool, has func(uint32) bool) {
	t.Helper()
	for k, w := range want {
		if got := has(k); got != w {
			if w {
				t.Errorf("%s: %s %d was deleted", when, what, k)
			} else {
				t.Errorf("%s: %s %d is still there", when, what, k)
			}
		}
	}
}

// wantStacks checks, id by id, which stacks the map holds.
func wantStacks(t *testing.T, s *Service, when string, want map[uint32]bool) {
	t.Helper()
	wantIn(t, when, "stack", want, func(id uint32) bool { return hasStack(t, s, id) })
}

func keep(ids ...uint32) map[uint32]bool {
	m := map[uint32]bool{}
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// A round ends only once every joined view has swept after it began (the
// sweep that begins it is not one); then the ids of the round no view
// kept go, and those either view kept stay. A view that misses a round
// holds its deletions back, and what a view kept in one round is not kept
// in the next.
func TestSweepRoundWaitsForEveryView(t *testing.T) {
	s := sweepService(t)
	a, b := s.Join("a"), s.Join("b")
	for _, id := range []uint32{1, 2, 3} {
		putStack(t, s, id)
	}

	a.Sweep(keep(2)) // begins round 1 over {1, 2, 3}; a's keep is not in it
	wantStacks(t, s, "after the sweep that began the round", map[uint32]bool{1: true, 2: true, 3: true})
	b.Sweep(keep(3))
	b.Sweep(keep(3))
	wantStacks(t, s, "after only b swept in round 1", map[uint32]bool{1: true, 2: true, 3: true})
	a.Sweep(keep(2)) // ends round 1, begins round 2 over {2, 3}
	wantStacks(t, s, "after round 1", map[uint32]bool{1: false, 2: true, 3: true})

	for range 5 {
		a.Sweep(nil)
	}
	wantStacks(t, s, "after b missed round 2", map[uint32]bool{2: true, 3: true})
	b.Sweep(keep(3)) // ends round 2, begins round 3 over {3}
	wantStacks(t, s, "after round 2", map[uint32]bool{2: false, 3: true})

	b.Sweep(nil)
	wantStacks(t, s, "after only b swept in round 3", map[uint32]bool{3: true})
	a.Sweep(nil) // ends round 3
	wantStacks(t, s, "after round 3", map[uint32]bool{3: false})
}

// A stack made after a round began is not in it: the round spares it even
// though no view keeps it (the views may not have read it yet), and a
// later round deletes it if still no view refers to it.
func TestSweepSparesStacksMadeDuringRound(t *testing.T) {
	s := sweepService(t)
	a, b := s.Join("a"), s.Join("b")
	putStack(t, s, 10)
	a.Sweep(nil) // begins round 1 over {10}
	putStack(t, s, 11)
	a.Sweep(nil)
	b.Sweep(nil) // ends round 1, begins round 2 over {11}
	wantStacks(t, s, "after round 1", map[uint32]bool{10: false, 11: true})

	putStack(t, s, 12)
	a.Sweep(nil)
	b.Sweep(nil) // ends round 2, begins round 3 over {12}
	wantStacks(t, s, "after round 2", map[uint32]bool{11: false, 12: true})

	a.Sweep(keep(12))
	b.Sweep(nil) // ends round 3: a kept 12
	wantStacks(t, s, "after round 3", map[uint32]bool{12: true})
}

// A view that leaves mid-round, having swept in it or not, does not hold
// the round back: the next sweep of a view still joined ends it.
func TestSweepLeaveMidRound(t *testing.T) {
	s := sweepService(t)
	a, b, c := s.Join("a"), s.Join("b"), s.Join("c")
	putStack(t, s, 20)
	putStack(t, s, 21)
	a.Sweep(nil) // begins round 1 over {20, 21}
	a.Sweep(nil)
	c.Sweep(keep(21))
	wantStacks(t, s, "before b left", map[uint32]bool{20: true, 21: true})
	b.Leave() // had not swept in round 1
	wantStacks(t, s, "when b left", map[uint32]bool{20: true, 21: true})
	a.Sweep(nil) // ends round 1, begins round 2 over {21}
	wantStacks(t, s, "after round 1", map[uint32]bool{20: false, 21: true})

	a.Sweep(nil)
	c.Leave()    // had not swept in round 2 either; a has
	a.Sweep(nil) // ends round 2
	wantStacks(t, s, "after round 2", map[uint32]bool{21: false})
	if len(s.views) != 1 || !s.views[a] {
		t.Errorf("views after b and c left: %v", s.views)
	}
}

// codeProc is a process of bin tracked by the test, with its code mappings
// as the unwinder keys them, once its loader has mapped libc.
type codeProc struct {
	pid  int
	cmd  *exec.Cmd
	code []symbolize.CodeMapping
}

func startCode(t *testing.T, bin string, args ...string) *codeProc {
	t.Helper()
	c := exec.Command(bin, args...)
	if _, err := c.StdinPipe(); err != nil { // cat waits on it
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	p := &codeProc{pid: c.Process.Pid, cmd: c}
	sym := symbolize.New("/proc")
	testutil.Eventually(t, 10*time.Second, bin+" to map libc", func() bool {
		var err error
		p.code, err = sym.CodeMappings(p.pid)
		return err == nil && p.file("libc.so.6") != 0
	})
	return p
}

// file is the id of the mapped file named name (by its base name).
func (p *codeProc) file(name string) uint64 {
	maps, _ := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/maps")
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.Contains(f[1], "x") || filepath.Base(f[5]) != name {
			continue
		}
		start, _, _ := strings.Cut(f[0], "-")
		for _, m := range p.code {
			if strconv.FormatUint(m.Start, 16) == start {
				return m.File
			}
		}
	}
	return 0
}

// blocksOf counts the blocks of the trie that are pid's.
func blocksOf(t *testing.T, s *Service, pid int) int {
	t.Helper()
	var k stacksUnwindMappingKey
	var v stacksUnwindMapping
	n := 0
	it := s.maps[stacksMapUnwindMappings].Iterate()
	for it.Next(&k, &v) {
		if bits.ReverseBytes32(k.Tgid) == uint32(pid) {
			n++
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

func putRule(t *testing.T, s *Service, file uint64) {
	t.Helper()
	if err := s.um.SetRule(file, 0x1234, symbolize.Rule{CFAOffset: 16}); err != nil {
		t.Fatalf("storing a rule of %#x: %v", file, err)
	}
}

func hasRule(t *testing.T, s *Service, file uint64) bool {
	t.Helper()
	var r stacksUnwindRule
	err := s.maps[stacksMapUnwindRules].Lookup(stacksUnwindKey{File: file, At: 0x1234}, &r)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return false
	}
	if err != nil {
		t.Fatalf("looking up the rule of %#x: %v", file, err)
	}
	if r.CfaOff != 16 {
		t.Fatalf("the rule of %#x holds %+v, not what was stored", file, r)
	}
	return true
}

// wantRules checks, file by file (named), which unwind rules the map holds.
func wantRules(t *testing.T, s *Service, when string, files map[string]uint64, want map[string]bool) {
	t.Helper()
	for name, w := range want {
		if got := hasRule(t, s, files[name]); got != w {
			if w {
				t.Errorf("%s: the rule of %s was deleted", when, name)
			} else {
				t.Errorf("%s: the rule of %s is still there", when, name)
			}
		}
	}
}

// A process a view starts tracking has its code mappings entered in the
// trie. When it has exited and no view tracks it any more, its mappings
// go when the round ends, and not before; so do the rules of the files
// no process left maps (sleep's, the process's own code's), while those
// of a file another tracked process maps (libc) stay. A process one of two
// views still tracks keeps its mappings (tracking is counted per view),
// until the last view untracks it, here by leaving: then the trie is
// empty and no rule is left.
func TestSweepDropsMappingsAndRules(t *testing.T) {
	s := sweepService(t)
	a, b := s.Join("a"), s.Join("b")
	sleep, cat := startCode(t, "sleep", "60"), startCode(t, "cat")
	a.Track(sleep.pid)
	b.Track(sleep.pid)
	b.Track(sleep.pid) // again: still one view
	a.Track(cat.pid)
	b.Track(cat.pid)
	for _, p := range []*codeProc{sleep, cat} {
		if blocksOf(t, s, p.pid) == 0 {
			t.Fatalf("pid %d tracked has no mappings in the trie", p.pid)
		}
	}
	proc, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	l, err := proc.Layout(sleep.pid)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]uint64{"libc": sleep.file("libc.so.6"), "sleep": sleep.file("sleep"), "cat": cat.file("cat"),
		// unwind_own_code of bpf/unwind.h
		"sleep's own code": 1<<63 | unwind.ASID(l)&0x7fffffff00000000 | uint64(sleep.pid)}
	if files["libc"] != cat.file("libc.so.6") || files["sleep"] == 0 || files["cat"] == 0 {
		t.Fatalf("file ids %v: want libc's the same in both", files)
	}
	for _, f := range files {
		putRule(t, s, f)
	}
	all := map[string]bool{"libc": true, "sleep": true, "cat": true, "sleep's own code": true}
	a.Sweep(nil) // begins round 1
	wantRules(t, s, "after the round began", files, all)

	// Mid-round: sleep exits and both views untrack it; cat is untracked
	// by one view only.
	_ = sleep.cmd.Process.Kill()
	_ = sleep.cmd.Wait()
	a.Untrack(sleep.pid)
	b.Untrack(sleep.pid)
	a.Untrack(cat.pid)
	a.Untrack(cat.pid)
	if got := s.tracked; len(got) != 1 || got[cat.pid] != 1 {
		t.Fatalf("tracked mid-round = %v, want only %d by one view", got, cat.pid)
	}
	a.Sweep(nil)
	wantRules(t, s, "before the round ended", files, all)
	if blocksOf(t, s, sleep.pid) == 0 {
		t.Error("before the round ended: the mappings of the process gone are gone")
	}
	b.Sweep(nil) // ends round 1
	wantRules(t, s, "after round 1", files, map[string]bool{"libc": true, "sleep": false, "cat": true, "sleep's own code": false})
	if n := blocksOf(t, s, sleep.pid); n != 0 {
		t.Errorf("after round 1: %d blocks of the process gone are left", n)
	}
	if blocksOf(t, s, cat.pid) == 0 {
		t.Error("after round 1: a process a view tracks lost its mappings")
	}

	b.Leave() // untracks cat: no view tracks it now
	if len(s.tracked) != 0 {
		t.Fatalf("tracked after the last view of %d left = %v", cat.pid, s.tracked)
	}
	wantRules(t, s, "when b left", files, map[string]bool{"libc": true, "cat": true})
	a.Sweep(nil) // ends round 2
	wantRules(t, s, "after round 2", files, map[string]bool{"libc": false, "cat": false})
	if n := testutil.Entries(t, s.maps[stacksMapUnwindMappings]); n != 0 {
		t.Errorf("after round 2: %d blocks left in the trie", n)
	}
	if n := testutil.Entries(t, s.maps[stacksMapUnwindRules]); n != 0 {
		t.Errorf("after round 2: %d rules left", n)
	}
}
