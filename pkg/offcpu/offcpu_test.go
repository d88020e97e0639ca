package offcpu

import (
	"slices"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// A watched process that waits in a loop of short sleeps is seen leaving
// the CPU from the function it waits in, by the user stack of its thread;
// an unwatched one is not seen at all. Both attach modes.
func TestWhereThreadsWait(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Fixture(t, "offcpuwait")
	for _, mode := range []struct {
		name string
		tp   bool
	}{{"tp_btf", false}, {"tracepoint", true}} {
		t.Run(mode.name, func(t *testing.T) {
			tr, err := New(Config{ProcRoot: "/proc", Tracepoint: mode.tp})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tr.Close() })
			watched := testutil.Start(t, bin, "60").Process.Pid
			other := testutil.Start(t, bin, "60").Process.Pid
			if err := tr.Watch(time.Now(), []int{watched}); err != nil {
				t.Fatal(err)
			}
			if why := tr.Unavailable(); why != "" {
				// No registers (before 5.15): the threads are seen, with
				// no stack, and the reason is given.
				testutil.Eventually(t, 10*time.Second, "the watched thread seen leaving the CPU", func() bool {
					th, ok := tr.Threads(watched)[watched]
					return ok && th.Stack == nil
				})
				return
			}
			var last map[int]Thread
			testutil.Eventually(t, 20*time.Second, "the watched thread's stack at load_next_batch", func() bool {
				last = tr.Threads(watched)
				th, ok := last[watched]
				return ok && slices.ContainsFunc(th.Stack, func(f model.Frame) bool { return f.Function == "load_next_batch" })
			})
			th := last[watched]
			if age := time.Since(th.At); age < 0 || age > 10*time.Second {
				t.Errorf("taken %s ago", age)
			}
			if got := tr.Threads(other); got != nil {
				t.Errorf("an unwatched process's threads: %+v", got)
			}
			// Unwatched: the kernel no longer takes its threads.
			if err := tr.Watch(time.Now(), nil); err != nil {
				t.Fatal(err)
			}
			var key uint32
			var v uint8
			if it := tr.maps.OffcpuProcs.Iterate(); it.Next(&key, &v) {
				t.Errorf("after Watch(nil) the kernel still takes process %d", key)
			}
			lost, err := tr.Lost()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("stack %v, lost %v", th.Stack, lost)
		})
	}
}

// Nothing is loaded until a process is named.
func TestLazy(t *testing.T) {
	testutil.RequireRoot(t)
	l := NewLazy(Config{ProcRoot: "/proc"})
	t.Cleanup(func() { _ = l.Close() })
	l.Watch(time.Now(), nil)
	if _, why := l.Stacks(1); why != "the off-CPU tracer is not loaded" {
		t.Errorf("before any process: %q", why)
	}
	pid := testutil.Start(t, testutil.Fixture(t, "offcpuwait"), "60").Process.Pid
	l.Watch(time.Now(), []int{pid})
	testutil.Eventually(t, 10*time.Second, "the named process's thread's stack, or why there is none", func() bool {
		stacks, why := l.Stacks(pid)
		return len(stacks[pid]) > 0 || why == NoRegisters
	})
}
