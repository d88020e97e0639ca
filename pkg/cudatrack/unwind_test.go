package cudatrack

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// waitStopped waits until pid is stopped by a signal.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("pid %d to stop", pid), func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		// The state follows the command name's closing parenthesis.
		i := bytes.LastIndexByte(b, ')')
		return i > 0 && len(b) > i+2 && b[i+2] == 'T'
	})
}

// A six-deep chain of calls to cudaMalloc in code built -O2
// -fomit-frame-pointer, in C and in C++: the stack recorded for the
// allocation is eu-stack's, frame for frame, from cudaMalloc's caller to
// _start, with the process stopped inside cudaMalloc. The first allocation of the site is unwound in user space from
// the kernel's stack copy, the next ones in the kernel with the rules
// learnt from it: all are one site, with nothing lost.
func TestUnwindWithoutFramePointers(t *testing.T) {
	for _, tc := range []struct {
		lang string
		want []string // frames named, from cudaMalloc's caller
	}{
		{"c", []string{"alloc_weights", "build_layer", "build_block", "build_model", "load_checkpoint", "serve", "main"}},
		{"c++", []string{"engine::alloc_weights", "engine::Layer<long>::build", "engine::Block::build",
			"engine::build_model(engine::Block&, long)::{lambda(long)#1}::operator()", "engine::build_model",
			"engine::load_checkpoint", "main"}},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			c := newConcern(t)
			bin := testutil.CUDAChain(t, tc.lang)
			p := testutil.StartProc(t, []string{"CUDA_STUB_STOP=1"}, bin)
			pid := p.Cmd.Process.Pid
			// eu-stack first, untracked: a uretprobe replaces the return
			// address on the stack with its trampoline, which eu-stack
			// cannot unwind through. The tracked call comes from the same
			// site of the same process, at the same addresses.
			p.Signal(t)
			waitStopped(t, pid)
			eu := testutil.EUStack(t, pid)
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			p.Wait(t, "done", 10*time.Second)
			pr := &model.Process{PID: pid}
			if err := c.Track(pid); err != nil {
				t.Fatal(err)
			}
			observe(t, c, pr)
			p.Signal(t)
			p.Wait(t, "done", 10*time.Second)

			i := 0
			for i < len(eu) && eu[i].Name != "cudaMalloc" {
				i++
			}
			if i == len(eu) {
				t.Fatalf("eu-stack shows no cudaMalloc frame: %v", eu)
			}
			want := eu[i+1:]
			samples, err := c.Poll([]int{pid})
			if err != nil {
				t.Fatal(err)
			}
			allocs := samples[pid].Allocs
			if len(allocs) != 1 {
				t.Fatalf("live allocations = %d, want 1", len(allocs))
			}
			pcs, err := c.Stack(allocs[0].StackID)
			if err != nil {
				t.Fatalf("stack %d: %v", allocs[0].StackID, err)
			}
			testutil.MatchEUStack(t, pid, pcs, want)
			frames := c.sym.Frames(pid, pcs)
			t.Logf("stack: %v", frames)
			for j, fn := range tc.want {
				if j >= len(frames) || !frameIs(frames[j], fn) {
					t.Errorf("frame %d = %v, want %s", j, frames[j], fn)
				}
			}

			// Three more from the same site: unwound in the kernel now.
			for range 3 {
				p.Signal(t)
				p.Wait(t, "done", 10*time.Second)
			}
			observe(t, c, pr)
			if len(pr.CUDA.Sites) != 1 || len(pr.CUDA.Sites[0].Allocs) != 4 {
				t.Fatalf("sites = %+v, want one with 4 allocations", pr.CUDA.Sites)
			}
			noLoss(t, c)
		})
	}
}

func frameIs(f model.Frame, fn string) bool {
	return f.Function == fn
}
