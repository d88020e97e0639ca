package stacks

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// Pids above the kernel's largest pid_max (1<<22): no process has them, so
// tracking them reads nothing of a real process.
const (
	sweepPid1 = 1<<22 + 1001
	sweepPid2 = 1<<22 + 1002
	sweepPid3 = 1<<22 + 1003
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

func putRule(t *testing.T, s *Service, tgid uint32) {
	t.Helper()
	if err := s.um.SetRule(0xabc000, tgid, 0x401000, symbolize.Rule{CFAOffset: 16}); err != nil {
		t.Fatalf("storing a rule of %d: %v", tgid, err)
	}
}

func hasRule(t *testing.T, s *Service, tgid uint32) bool {
	t.Helper()
	var r stacksUnwindRule
	err := s.maps[stacksMapUnwindRules].Lookup(stacksUnwindKey{Mm: 0xabc000, Pc: 0x401000, Tgid: tgid}, &r)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return false
	}
	if err != nil {
		t.Fatalf("looking up the rule of %d: %v", tgid, err)
	}
	if r.CfaOff != 16 {
		t.Fatalf("the rule of %d holds %+v, not what was stored", tgid, r)
	}
	return true
}

// wantRules checks, pid by pid, which unwind rules the map holds.
func wantRules(t *testing.T, s *Service, when string, want map[uint32]bool) {
	t.Helper()
	wantIn(t, when, "the rule of pid", want, func(tgid uint32) bool { return hasRule(t, s, tgid) })
}

// The unwind rules of a process no view tracks go when the round ends,
// and not before; a process one of two views still tracks keeps its rules
// (tracking is counted per view), until the last view untracks it, here
// by leaving.
func TestSweepDropsRulesOfUntrackedProcesses(t *testing.T) {
	s := sweepService(t)
	a, b := s.Join("a"), s.Join("b")
	a.Track(sweepPid1)
	b.Track(sweepPid1)
	b.Track(sweepPid1) // again: still one view
	b.Track(sweepPid2)
	for _, pid := range []uint32{sweepPid1, sweepPid2, sweepPid3} {
		putRule(t, s, pid)
	}
	a.Sweep(nil) // begins round 1
	wantRules(t, s, "after the round began", map[uint32]bool{sweepPid1: true, sweepPid2: true, sweepPid3: true})

	// Mid-round: pid2 is gone, a stops tracking pid1, and a view that
	// never tracked pid1 untracking it changes nothing.
	b.Untrack(sweepPid2)
	a.Untrack(sweepPid1)
	a.Untrack(sweepPid1)
	a.Untrack(sweepPid3)
	if got := s.tracked; len(got) != 1 || got[sweepPid1] != 1 {
		t.Fatalf("tracked mid-round = %v, want only %d by one view", got, sweepPid1)
	}
	a.Sweep(nil)
	wantRules(t, s, "before the round ended", map[uint32]bool{sweepPid1: true, sweepPid2: true, sweepPid3: true})
	b.Sweep(nil) // ends round 1
	wantRules(t, s, "after round 1", map[uint32]bool{sweepPid1: true, sweepPid2: false, sweepPid3: false})

	b.Leave() // untracks pid1: no view tracks it now
	if len(s.tracked) != 0 {
		t.Fatalf("tracked after the last view of %d left = %v", sweepPid1, s.tracked)
	}
	wantRules(t, s, "when b left", map[uint32]bool{sweepPid1: true})
	a.Sweep(nil) // ends round 2
	wantRules(t, s, "after round 2", map[uint32]bool{sweepPid1: false})
}
