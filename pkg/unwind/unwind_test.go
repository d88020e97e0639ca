package unwind

import (
	"errors"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// fakeTables keeps an object's unwind maps in memory.
type fakeTables struct {
	rules  map[ruleKey]symbolize.Rule
	trie   map[Block]symbolize.CodeMapping
	stacks map[int32][]uint64
	done   []uint64
	reads  int
}

type ruleKey struct{ file, at uint64 }

func newFake() *fakeTables {
	return &fakeTables{rules: map[ruleKey]symbolize.Rule{}, trie: map[Block]symbolize.CodeMapping{}, stacks: map[int32][]uint64{}}
}

func (f *fakeTables) Decode([]byte) (Request, error) { return Request{}, errors.New("not used") }

func (f *fakeTables) SetRule(file, at uint64, r symbolize.Rule) error {
	f.rules[ruleKey{file, at}] = r
	return nil
}

func (f *fakeTables) DropRules(live func(file uint64) bool) error {
	for k := range f.rules {
		if !live(k.file) {
			delete(f.rules, k)
		}
	}
	return nil
}

func (f *fakeTables) SetMapping(b Block, m symbolize.CodeMapping) error {
	f.trie[b] = m
	return nil
}

func (f *fakeTables) DeleteMapping(b Block) error {
	if _, ok := f.trie[b]; !ok {
		return errors.New("no such block")
	}
	delete(f.trie, b)
	return nil
}

// lookup is the kernel's search of the trie: the longest block holding
// addr in tgid's address space asid.
func (f *fakeTables) lookup(tgid uint32, asid, addr uint64) (symbolize.CodeMapping, bool) {
	best, found := -1, symbolize.CodeMapping{}
	for b, m := range f.trie {
		if b.TGID == tgid && b.ASID == asid && b.Bits > best && (b.Addr^addr)>>(64-b.Bits) == 0 {
			best, found = b.Bits, m
		}
	}
	return found, best >= 0
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
	s := newServer(f, nil, procinfo.FS{})
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
// outside any mapping: the walk ends there, with an end rule for it, the
// process's own.
func TestAnswer(t *testing.T) {
	f := newFake()
	s := newServer(f, symbolize.New("/proc"), procFS(t))
	pid := os.Getpid()
	asid := layoutOf(t, pid)
	const unmapped = 0x10 // below any mapping
	s.answer(Request{MM: 1, ASID: asid, Hash: 42, TGID: uint32(pid), StackID: RequestIDs, SP: 0x7000, Max: 16,
		PCs: []uint64{unmapped}, Stack: make([]byte, 64)})
	if got := f.stacks[RequestIDs]; !slices.Equal(got, []uint64{unmapped}) {
		t.Errorf("stack %#x, want just the frame it had", got)
	}
	if r, ok := f.rules[ruleKey{ownCode(uint32(pid), asid), unmapped - 1}]; !ok || r.CFA != symbolize.CFAEnd {
		t.Errorf("rules %v: want an end rule at %#x of the process's own code", maps.Collect(maps.All(f.rules)), unmapped-1)
	}
	if !slices.Equal(f.done, []uint64{42}) {
		t.Errorf("done %v, want the request's hash", f.done)
	}
	// Its first request entered the process's mappings.
	if len(f.trie) == 0 {
		t.Error("the trie is empty after the process's first request")
	}
}

func procFS(t *testing.T) procinfo.FS {
	t.Helper()
	fs, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// layoutOf is pid's address space as the kernel names it.
func layoutOf(t *testing.T, pid int) uint64 {
	t.Helper()
	l, err := procFS(t).Layout(pid)
	if err != nil {
		t.Fatal(err)
	}
	return ASID(l)
}

// The blocks of a range cover it exactly, each aligned to its own size,
// in order; ranges a mapping can have (pages, to the top of the address
// space, from 0) and odd ones.
func TestBlocks(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ranges := [][2]uint64{{0, 1}, {0, 1 << 63}, {0x1000, 0x2000}, {0x7f0000001000, 0x7f00001a6000},
		{0xffffffffff600000, 0xffffffffff601000}, {1<<63 - 1, 1<<63 + 1}, {3, 0xffffffffffffffff}}
	for range 1000 {
		a, b := rng.Uint64(), rng.Uint64()
		if a > b {
			a, b = b, a
		}
		ranges = append(ranges, [2]uint64{a, b}, [2]uint64{a &^ 0xfff, a&^0xfff + rng.Uint64N(1<<30)<<12})
	}
	for _, r := range ranges {
		at := r[0]
		bs := blocks(r[0], r[1])
		for _, b := range bs {
			if b.Bits < 1 || b.Bits > 64 {
				t.Fatalf("[%#x, %#x): block %+v", r[0], r[1], b)
			}
			size := uint64(1) << (64 - b.Bits)
			if b.Addr != at || b.Addr&(size-1) != 0 || b.Addr+size-1 > r[1]-1 {
				t.Fatalf("[%#x, %#x): block %+v does not follow %#x within the range, aligned", r[0], r[1], b, at)
			}
			at += size
		}
		if at != r[1] {
			t.Fatalf("[%#x, %#x): blocks %+v end at %#x", r[0], r[1], bs, at)
		}
		if len(bs) > 2*64 {
			t.Fatalf("[%#x, %#x): %d blocks", r[0], r[1], len(bs))
		}
	}
}

// A process tracked has its code mappings in the trie, the kernel's
// lookup of any address in them finding the mapping; the rules a request
// teaches are keyed by file and offset where the trie has a file, so that
// a second process of the same binary finds them under its own addresses.
// Processes no longer tracked leave the trie, and rules of files no
// process left maps go with them.
func TestMappingsShareRules(t *testing.T) {
	f := newFake()
	s := newServer(f, symbolize.New("/proc"), procFS(t))
	var pids []int
	for range 2 {
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
		pid := c.Process.Pid
		testutil.Eventually(t, 10*time.Second, "sleep to map libc", func() bool { return libcAddr(pid) != 0 })
		pids = append(pids, pid)
	}
	for _, pid := range pids {
		s.Learn(pid)
	}
	sym := symbolize.New("/proc")
	var libc [2]symbolize.CodeMapping
	for i, pid := range pids {
		ms, err := sym.CodeMappings(pid)
		if err != nil {
			t.Fatal(err)
		}
		asid := layoutOf(t, pid)
		for _, m := range ms {
			for _, addr := range []uint64{m.Start, m.Start + (m.End-m.Start)/2, m.End - 1} {
				got, ok := f.lookup(uint32(pid), asid, addr)
				if !ok || got != m {
					t.Errorf("pid %d: the trie has %+v (%v) at %#x, want %+v", pid, got, ok, addr, m)
				}
			}
			if _, ok := f.lookup(uint32(pid), asid^1, m.Start); ok {
				t.Errorf("pid %d: another address space finds %#x", pid, m.Start)
			}
			if m.File != 0 && m.Start <= libcAddr(pid) && libcAddr(pid) < m.End {
				libc[i] = m
			}
		}
	}
	if libc[0].File == 0 || libc[0].File != libc[1].File {
		t.Fatalf("libc's mappings %+v: want one file", libc)
	}
	if s.files[libc[0].File] != 2 {
		t.Errorf("libc is mapped by %d known processes, want 2", s.files[libc[0].File])
	}
	// A rule learnt in the first process is the second's at its own address.
	p0, p1 := s.procs[uint32(pids[0])], s.procs[uint32(pids[1])]
	addr0 := libc[0].Start + 0x123
	file, at, ok := p0.key(uint32(pids[0]), addr0, symbolize.CodeRule{File: libc[0].File, Offset: addr0 - libc[0].Bias})
	if !ok || file != libc[0].File {
		t.Fatalf("key of libc in pid %d: %#x %#x %v", pids[0], file, at, ok)
	}
	f.rules[ruleKey{file, at}] = symbolize.Rule{CFA: symbolize.CFARSP, CFAOffset: 16}
	addr1 := at + libc[1].Bias
	if m, ok := f.lookup(uint32(pids[1]), p1.asid, addr1); !ok || m.File != file || addr1-m.Bias != at {
		t.Errorf("pid %d finds %+v at %#x, want file %#x offset %#x", pids[1], m, addr1, file, at)
	}
	// A rule of the symbolizer that is not the trie's file is not stored.
	if _, _, ok := p0.key(uint32(pids[0]), addr0, symbolize.CodeRule{File: libc[0].File + 1, Offset: addr0 - libc[0].Bias}); ok {
		t.Error("a rule of another file keyed by libc's")
	}
	own := ownCode(uint32(pids[0]), p0.asid)
	f.rules[ruleKey{own, 0x10}] = symbolize.Rule{}

	// The first process goes: its blocks and own rules go, libc's rules
	// stay (the second maps it).
	if err := s.Drop(func(tgid uint32) bool { return tgid != uint32(pids[0]) }); err != nil {
		t.Fatal(err)
	}
	for b := range f.trie {
		if b.TGID == uint32(pids[0]) {
			t.Fatalf("a block of the process dropped is left: %+v", b)
		}
	}
	if _, ok := f.rules[ruleKey{own, 0x10}]; ok {
		t.Error("the own rules of the process dropped are left")
	}
	if _, ok := f.rules[ruleKey{file, at}]; !ok {
		t.Error("libc's rule went with a process while another maps libc")
	}
	if s.files[libc[0].File] != 1 {
		t.Errorf("libc is mapped by %d known processes, want 1", s.files[libc[0].File])
	}
	// The second goes too: nothing is left.
	if err := s.Drop(func(uint32) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if len(f.trie) != 0 || len(f.rules) != 0 || len(s.files) != 0 || len(s.procs) != 0 {
		t.Errorf("after the last process: trie %d blocks, %d rules, files %v, processes %d", len(f.trie), len(f.rules), s.files, len(s.procs))
	}
}

// libcAddr is the start of libc's code in pid; 0 before the loader has
// mapped it.
func libcAddr(pid int) uint64 {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 6 && strings.Contains(f[1], "x") && strings.Contains(filepath.Base(f[5]), "libc.so") {
			start, _, _ := strings.Cut(f[0], "-")
			a, _ := strconv.ParseUint(start, 16, 64)
			return a
		}
	}
	return 0
}

// Entering a process's mappings again changes the trie by what changed:
// a mapping gone leaves it, a new one enters it, one whose file changed at
// the same addresses (a file readable now that was not) is the new file's,
// and the files' counts follow.
func TestEnterChanges(t *testing.T) {
	f := newFake()
	s := newServer(f, nil, procinfo.FS{})
	p := &proc{asid: 7}
	s.procs[1] = p
	lib := symbolize.CodeMapping{Start: 0x7f0000001000, End: 0x7f0000005000, File: 11, Bias: 0x7f0000000000}
	own := symbolize.CodeMapping{Start: 0x7f0000010000, End: 0x7f0000011000}
	exe := symbolize.CodeMapping{Start: 0x555555555000, End: 0x555555556000, File: 12, Bias: 0x555555554000}
	s.enter(1, p, []symbolize.CodeMapping{exe, own})
	libNow := lib
	libNow.File = 13
	s.enter(1, p, []symbolize.CodeMapping{exe, own, lib})
	s.enter(1, p, []symbolize.CodeMapping{exe, libNow})
	for _, c := range []struct {
		addr uint64
		want symbolize.CodeMapping
		ok   bool
	}{{exe.Start, exe, true}, {lib.End - 1, libNow, true}, {own.Start, symbolize.CodeMapping{}, false}} {
		if m, ok := f.lookup(1, 7, c.addr); ok != c.ok || m != c.want {
			t.Errorf("at %#x the trie has %+v (%v), want %+v (%v)", c.addr, m, ok, c.want, c.ok)
		}
	}
	if want := map[uint64]int{12: 1, 13: 1}; !maps.Equal(s.files, want) {
		t.Errorf("files %v, want %v", s.files, want)
	}
	if n := len(blocks(exe.Start, exe.End)) + len(blocks(lib.Start, lib.End)); len(f.trie) != n {
		t.Errorf("the trie has %d blocks, want %d", len(f.trie), n)
	}
}
