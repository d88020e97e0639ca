package tracked

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// A cap over what the maps may hold is refused naming both numbers; none
// given is the default.
func TestCapacity(t *testing.T) {
	_, err := New(Capacity + 1)
	if !errors.Is(err, ErrOverCapacity) || !strings.Contains(err.Error(), strconv.Itoa(Capacity+1)) || !strings.Contains(err.Error(), strconv.Itoa(Capacity)) {
		t.Fatalf("New(%d): %v", Capacity+1, err)
	}
	testutil.RequireRoot(t)
	s, err := New(0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Entries() != DefaultProcesses+ForkHeadroom {
		t.Errorf("%d entries, want %d", s.Entries(), DefaultProcesses+ForkHeadroom)
	}
}

// 5 000 processes fit a set made for them, whatever views track them; one
// view letting a process go leaves the others' bits; past the map's size
// Track fails saying so, never silently.
func TestViewsShareOneEntry(t *testing.T) {
	testutil.RequireRoot(t)
	const n = 5000
	s, err := New(n)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fd, err := Join(s)
	if err != nil {
		t.Fatal(err)
	}
	sched, err := Join(s)
	if err != nil {
		t.Fatal(err)
	}
	for pid := uint32(1); pid <= n; pid++ {
		if err := fd.Track(pid, 0, 0); err != nil {
			t.Fatalf("tracking the %dth process: %v", pid, err)
		}
		if err := sched.Track(pid, 0, 0); err != nil {
			t.Fatalf("tracking the %dth process in a second view: %v", pid, err)
		}
	}
	if got := testutil.Entries(t, s.m); got != n {
		t.Errorf("%d entries for %d processes in two views", got, n)
	}
	fd.Untrack(7, 0)
	if fd.Tracks(7) || !sched.Tracks(7) {
		t.Errorf("after the fd view let 7 go: fd %v, sched %v", fd.Tracks(7), sched.Tracks(7))
	}
	sched.Untrack(7, 0)
	var v uint8
	if err := s.m.Lookup(uint32(7), &v); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("7 still in the map once no view tracks it: %#x, %v", v, err)
	}
	// The fd view's fork marks are set and cleared with its bit.
	const mark = 0x80
	if err := fd.Track(9, mark, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.m.Lookup(uint32(9), &v); err != nil || v != fd.bit|sched.bit|mark {
		t.Errorf("9: %#x, %v", v, err)
	}
	fd.Untrack(9, mark)
	if err := s.m.Lookup(uint32(9), &v); err != nil || v != sched.bit {
		t.Errorf("9 after the fd view let it go: %#x, %v", v, err)
	}
	// Fill the headroom, then one more.
	pid := uint32(n)
	for range s.Entries() - (n - 1) {
		pid++
		if err := fd.Track(pid, 0, 0); err != nil {
			t.Fatalf("entry %d of %d: %v", testutil.Entries(t, s.m)+1, s.Entries(), err)
		}
	}
	if err := fd.Track(pid+1, 0, 0); err == nil || !strings.Contains(err.Error(), "full ("+strconv.Itoa(int(s.Entries()))) {
		t.Errorf("tracking past the map's size: %v", err)
	}
}

// A map has bits for six views; a seventh is refused.
func TestViewBits(t *testing.T) {
	testutil.RequireRoot(t)
	s, err := New(1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	seen := uint8(0)
	for range viewBits {
		v, err := Join(s)
		if err != nil {
			t.Fatal(err)
		}
		if v.bit&seen != 0 || v.bit >= 0x40 {
			t.Errorf("bit %#x (had %#x)", v.bit, seen)
		}
		seen |= v.bit
	}
	if _, err := Join(s); err == nil {
		t.Error("a seventh view joined")
	}
}
