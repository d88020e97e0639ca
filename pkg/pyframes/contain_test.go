package pyframes

import (
	"os"
	"runtime"
	"testing"
)

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

// A mapped file whose parsing panics is no interpreter's, and counted.
func TestParsePythonPanicContained(t *testing.T) {
	parseHook = func(*os.File) { panic("crafted ELF") }
	t.Cleanup(func() { parseHook = nil })
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	before := elfPanics.Load()
	if ep := parsePython(f); ep != nil {
		t.Errorf("parsePython = %+v, want none", ep)
	}
	if got := elfPanics.Load() - before; got != 1 {
		t.Errorf("%d panics counted, want 1", got)
	}
	// Closed all the same.
	if _, err := f.Stat(); err == nil {
		t.Error("the file is still open")
	}
}

// glibc publishes sizeof(struct pthread) for libthread_db, which places
// pthread_self() below an arm64 thread's pointer: found in the libc of the
// agent's own architecture (in the ELF machine parsePython accepts).
func TestSizeofPthread(t *testing.T) {
	path := map[string]string{"amd64": "/usr/lib/x86_64-linux-gnu/libc.so.6", "arm64": "/usr/lib/aarch64-linux-gnu/libc.so.6"}[runtime.GOARCH]
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("no glibc of %s here: %v", runtime.GOARCH, err)
	}
	ep := parsePython(f)
	if ep == nil || ep.sizeofPthread == 0 || ep.runtime != 0 {
		t.Fatalf("%s: %+v, want _thread_db_sizeof_pthread and no interpreter", path, ep)
	}
	t.Logf("%s: sizeof(struct pthread) %d", path, ep.sizeofPthread)
}
