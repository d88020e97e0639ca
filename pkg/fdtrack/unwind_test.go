package fdtrack

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
	"github.com/open-autoglm/autoglm-ebpf/pkg/unwind"
)

// waitInSyscall waits until pid's main thread is blocked in syscall nr.
func waitInSyscall(t *testing.T, pid, nr int) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("pid %d to enter syscall %d", pid, nr), func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/syscall")
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		return len(f) > 0 && f[0] == strconv.Itoa(nr)
	})
}

// A file opened six calls deep in code built -O2 -fomit-frame-pointer, in C
// and C++, through glibc (no frame pointers either): the opening stack is
// eu-stack's, frame for frame from the syscall to _start, read while the
// process is blocked in that very open (of a FIFO). The site's first open
// is finished in user space, a second one from the same code in the kernel
// with the rules learnt: one site.
func TestOpenStackWithoutFramePointers(t *testing.T) {
	for _, lang := range []string{"c", "c++"} {
		t.Run(lang, func(t *testing.T) {
			tr := newTracker(t)
			fifo := filepath.Join(t.TempDir(), "weights")
			if err := syscall.Mkfifo(fifo, 0o600); err != nil {
				t.Fatal(err)
			}
			p := testutil.StartProc(t, nil, testutil.CUDAChain(t, lang), fifo)
			pid := p.Cmd.Process.Pid
			if err := tr.Track(pid); err != nil {
				t.Fatal(err)
			}
			var stacks []int32
			for i := range 2 {
				p.Signal(t)
				waitInSyscall(t, pid, syscall.SYS_OPENAT)
				var eu []testutil.EUFrame
				if i == 0 {
					eu = testutil.EUStack(t, pid)
				}
				w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				p.Wait(t, "done", 10*time.Second)
				w.Close()
				fd := fdOn(t, tr, pid, fifo)
				stacks = append(stacks, fd.StackID)
				if i > 0 {
					break
				}
				pcs, err := tr.Stack(fd.StackID)
				if err != nil {
					t.Fatalf("stack %d: %v", fd.StackID, err)
				}
				t.Logf("stack: %v", symbolize.New("/proc").Frames(pid, pcs))
				testutil.MatchEUStack(t, pid, pcs, eu)
			}
			if stacks[0] != stacks[1] {
				t.Errorf("two opens from one site have stacks %d and %d", stacks[0], stacks[1])
			}
			lost, err := tr.Lost()
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range lost {
				if v != 0 {
					t.Errorf("lost %s = %d", k, v)
				}
			}
		})
	}
}

// On arm64, the chains built to sign their return addresses (pointer
// authentication) unwind to the same functions, frame for frame, as the
// unsigned builds, which TestOpenStackWithoutFramePointers holds to
// eu-stack: elfutils 0.188 cannot unwind signed return addresses, so the
// unsigned build of the same source is the oracle.
func TestOpenStackPAC(t *testing.T) {
	if runtime.GOARCH != "arm64" {
		t.Skip("pointer authentication is arm64's")
	}
	for _, lang := range []string{"c", "c++"} {
		t.Run(lang, func(t *testing.T) {
			tr := newTracker(t)
			want := openStackFunctions(t, tr, testutil.CUDAChain(t, lang))
			got := openStackFunctions(t, tr, testutil.CUDAChainPAC(t, lang))
			if !slices.Equal(got, want) {
				t.Errorf("signed chain's stack %v, unsigned chain's %v", got, want)
			}
			if !slices.Contains(got, "load_checkpoint") && !slices.Contains(got, "engine::load_checkpoint") {
				t.Errorf("stack %v: no load_checkpoint, five calls above the open", got)
			}
		})
	}
}

// openStackFunctions runs the chain bin, tracked by tr, until it opens a
// FIFO, and returns the functions of the open's stack.
func openStackFunctions(t *testing.T, tr *Tracker, bin string) []string {
	t.Helper()
	fifo := filepath.Join(t.TempDir(), "weights")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	p := testutil.StartProc(t, nil, bin, fifo)
	pid := p.Cmd.Process.Pid
	if err := tr.Track(pid); err != nil {
		t.Fatal(err)
	}
	p.Signal(t)
	waitInSyscall(t, pid, syscall.SYS_OPENAT)
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	p.Wait(t, "done", 10*time.Second)
	w.Close()
	fd := fdOn(t, tr, pid, fifo)
	pcs, err := tr.Stack(fd.StackID)
	if err != nil {
		t.Fatalf("stack %d: %v", fd.StackID, err)
	}
	frames := symbolize.New("/proc").Frames(pid, pcs)
	t.Logf("%s: stack %v", filepath.Base(bin), frames)
	var fns []string
	for _, f := range frames {
		fns = append(fns, f.Function)
	}
	return fns
}

// Two processes of one binary (the six-deep chain in C, and glibc, both
// without frame pointers) open a file from the same site. The first
// teaches the kernel the site's rules (a request); the second, whose code
// mappings were entered when it was tracked, is unwound in the kernel
// alone: its stack id is the kernel's, not a request's, and not one rule
// is added, though its addresses are its own (ASLR). Both stacks are
// eu-stack's, frame for frame, read while each process is blocked in that
// very open.
func TestOpenStackRulesSharedByFile(t *testing.T) {
	tr := newTracker(t)
	bin := testutil.CUDAChain(t, "c")
	rules := tr.Stacks().Replacements()[fdMapUnwindRules]
	var first []uint64
	for i := range 2 {
		fifo := filepath.Join(t.TempDir(), "weights")
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Fatal(err)
		}
		p := testutil.StartProc(t, nil, bin, fifo)
		pid := p.Cmd.Process.Pid
		if err := tr.Track(pid); err != nil {
			t.Fatal(err)
		}
		before := testutil.Entries(t, rules)
		p.Signal(t)
		waitInSyscall(t, pid, syscall.SYS_OPENAT)
		eu := testutil.EUStack(t, pid)
		w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		p.Wait(t, "done", 10*time.Second)
		w.Close()
		fd := fdOn(t, tr, pid, fifo)
		pcs, err := tr.Stack(fd.StackID)
		if err != nil {
			t.Fatalf("stack %d: %v", fd.StackID, err)
		}
		t.Logf("process %d: stack %d: %v", i+1, fd.StackID, symbolize.New("/proc").Frames(pid, pcs))
		testutil.MatchEUStack(t, pid, pcs, eu)
		after := testutil.Entries(t, rules)
		if i == 0 {
			if fd.StackID < unwind.RequestIDs || after == before {
				t.Fatalf("the first process's open: stack %d, rules %d -> %d: want a request that taught rules", fd.StackID, before, after)
			}
			first = pcs
			continue
		}
		if fd.StackID >= unwind.RequestIDs {
			t.Errorf("the second process's open has a request's stack id %d: not unwound in the kernel", fd.StackID)
		}
		if after != before {
			t.Errorf("the second process's open added %d rules", after-before)
		}
		if slices.Equal(pcs, first) {
			t.Errorf("both processes have the same addresses %#x: the test wants them apart (ASLR)", pcs)
		}
	}
	lost, err := tr.Lost()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range lost {
		if v != 0 {
			t.Errorf("lost %s = %d", k, v)
		}
	}
}

// fdOn is pid's fd open on path.
func fdOn(t *testing.T, tr *Tracker, pid int, path string) FD {
	t.Helper()
	for _, fd := range poll(t, tr, pid).FDs {
		if l, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + strconv.Itoa(int(fd.Num))); err == nil && l == path {
			return fd
		}
	}
	t.Fatalf("no fd of pid %d open on %s", pid, path)
	return FD{}
}
