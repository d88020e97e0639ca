package pyframes

import "testing"

// A walk that panics (memory the process crafted) costs that stack's
// Python frames and is counted; the next walk of the process runs again.
func TestFramesPanicContained(t *testing.T) {
	walks := 0
	panicHook = func(pid int) {
		walks++
		panic("crafted code object")
	}
	t.Cleanup(func() { panicHook = nil })
	tr := &Tracker{procs: map[int]*proc{42: {in: &interp{}, codes: map[uint64]*code{1: {}}}}}
	for i := range 2 {
		if got := tr.Frames(42, 7); got != nil {
			t.Fatalf("walk %d: frames %v, want none", i, got)
		}
	}
	p := tr.procs[42]
	if walks != 2 || tr.panics.Load() != 2 || !p.panicked || p.codes != nil {
		t.Errorf("walks %d, panics %d, panicked %v, codes %v; want 2, 2, true, none", walks, tr.panics.Load(), p.panicked, p.codes)
	}
}
