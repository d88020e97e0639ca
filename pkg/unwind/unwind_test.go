package unwind

import (
	"errors"
	"maps"
	"os"
	"slices"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
)

// fakeTables keeps an object's unwind maps in memory.
type fakeTables struct {
	rules  map[uint64]symbolize.Rule
	stacks map[int32][]uint64
	done   []uint64
	reads  int
}

func newFake() *fakeTables {
	return &fakeTables{rules: map[uint64]symbolize.Rule{}, stacks: map[int32][]uint64{}}
}

func (f *fakeTables) Decode([]byte) (Request, error) { return Request{}, errors.New("not used") }

func (f *fakeTables) SetRule(_ uint64, _ uint32, addr uint64, r symbolize.Rule) error {
	f.rules[addr] = r
	return nil
}

func (f *fakeTables) SetStack(id int32, pcs []uint64, _ bool) error {
	f.stacks[id] = slices.Clone(pcs)
	return nil
}

func (f *fakeTables) Stack(id int32) ([]uint64, error) {
	f.reads++
	pcs, ok := f.stacks[id]
	if !ok {
		return nil, errors.New("no such stack")
	}
	return pcs, nil
}

func (f *fakeTables) Done(_, hash uint64) error {
	f.done = append(f.done, hash)
	return nil
}

// A site's first event (a request's id) and its later ones (the kernel's
// id for the same frames) are one site; other frames are another; an id
// whose stack is gone is kept as it is, and forgotten ids are looked at
// afresh.
func TestCanonical(t *testing.T) {
	f := newFake()
	s := &Server{tables: f, canon: map[int32]int32{}, byFrames: map[string]int32{}, waited: map[int32]bool{}}
	req, hashed, other := int32(RequestIDs+7), int32(1234), int32(99)
	f.stacks[req] = []uint64{0x401000, 0x402000}
	f.stacks[hashed] = []uint64{0x401000, 0x402000}
	f.stacks[other] = []uint64{0x401000, 0x403000}
	if got := s.Canonical(req); got != req {
		t.Errorf("first id: %d, want itself", got)
	}
	if got := s.Canonical(hashed); got != req {
		t.Errorf("same frames: %d, want %d", got, req)
	}
	if got := s.Canonical(other); got != other {
		t.Errorf("other frames: %d, want itself", got)
	}
	if got := s.Canonical(5); got != 5 {
		t.Errorf("unknown id: %d, want itself", got)
	}
	// A request never answered is waited for once, not at every poll:
	// later looks read the map once each.
	lost := int32(RequestIDs + 8)
	s.Canonical(lost)
	before := f.reads
	for range 4 {
		if got := s.Canonical(lost); got != lost {
			t.Errorf("unanswered request: %d, want itself", got)
		}
	}
	if n := f.reads - before; n != 4 {
		t.Errorf("four more looks read the stack %d times, want 4", n)
	}
	if got := s.Canonical(-1); got != -1 {
		t.Errorf("no stack: %d", got)
	}
	// The request's stack is collected; the kernel's id names the site now.
	delete(f.stacks, req)
	present := func(id uint32) bool { _, ok := f.stacks[int32(id)]; return ok }
	s.Forget(present, func(id uint32) bool { return id != uint32(lost) && present(id) })
	if got := s.Canonical(hashed); got != hashed {
		t.Errorf("after the first id is gone: %d, want %d", got, hashed)
	}
	// The request waited for in vain, referred to no more, is forgotten.
	if s.waited[lost] {
		t.Error("an id nothing refers to is still remembered as waited for")
	}
}

// A request is answered from its stack copy: the stack is finished under the
// request's id, the rules used are stored, and the request is done. The copy
// here is a fake stack of this process whose only frame's return address is
// outside any mapping: the walk ends there, with an end rule for it.
func TestAnswer(t *testing.T) {
	f := newFake()
	s := &Server{tables: f, sym: symbolize.New("/proc"), canon: map[int32]int32{}, byFrames: map[string]int32{}, waited: map[int32]bool{}}
	const unmapped = 0x10 // below any mapping
	s.answer(Request{MM: 1, Hash: 42, TGID: uint32(os.Getpid()), StackID: RequestIDs, SP: 0x7000, Max: 16,
		PCs: []uint64{unmapped}, Stack: make([]byte, 64)})
	if got := f.stacks[RequestIDs]; !slices.Equal(got, []uint64{unmapped}) {
		t.Errorf("stack %#x, want just the frame it had", got)
	}
	if r, ok := f.rules[unmapped-1]; !ok || r.CFA != symbolize.CFAEnd {
		t.Errorf("rules %v: want an end rule at %#x", maps.Collect(maps.All(f.rules)), unmapped-1)
	}
	if !slices.Equal(f.done, []uint64{42}) {
		t.Errorf("done %v, want the request's hash", f.done)
	}
}
