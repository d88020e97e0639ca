package procinfo

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// The fixture tests only prove we read what we wrote; these check the same
// code against the running kernel's /proc, using this test process.

func realFS(t *testing.T) FS {
	t.Helper()
	fs, err := New("/proc")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	return fs
}

func TestRealSelf(t *testing.T) {
	fs := realFS(t)
	pid := os.Getpid()

	// 100 more fds than this process had: FDCount (the fd directory's
	// size, on Linux 6.2 and later) agrees with the listing.
	for range 100 {
		f, err := os.Open("/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
	}
	n, err := fs.FDCount(pid)
	if err != nil {
		t.Fatal(err)
	}
	nums, err := fs.fdNums(pid)
	if err != nil {
		t.Fatal(err)
	}
	// Listing this process lists the listing's own directory fd too
	// (where FDCount lists, it is counted too).
	if n < 100 || n != len(nums) && n != len(nums)-1 {
		t.Errorf("FDCount(self) = %d, listed %d, want over 100 and equal", n, len(nums))
	}
	if err := fs.Check(pid); err != nil {
		t.Errorf("Check(self) = %v, want nil", err)
	}
	if id, err := fs.Identify(pid); err != nil || !id.Running {
		t.Errorf("Identify(self) = %+v, %v; want running", id, err)
	}

	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	limit, err := fs.NoFileLimit(pid)
	if err != nil {
		t.Fatal(err)
	}
	if limit != rl.Cur {
		t.Errorf("NoFileLimit(self) = %d, want getrlimit soft %d", limit, rl.Cur)
	}

	comm, err := fs.Comm(pid)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel keeps the first 15 bytes of the executable name.
	want := filepath.Base(os.Args[0])
	want = want[:min(len(want), 15)]
	if comm != want {
		t.Errorf("Comm(self) = %q, want %q", comm, want)
	}
}

// TestRealKinds opens one fd of each kind and checks that FDs classifies the
// kernel's link text for it, which is what the fixture strings assume.
func TestRealKinds(t *testing.T) {
	fs := realFS(t)
	opened := map[int]string{} // fd -> expected kind

	keep := func(kind string, fd int, err error) {
		t.Helper()
		// Sandboxes may lack or forbid some of these syscalls; test the rest.
		if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EINVAL) {
			t.Logf("cannot open %s fd here: %v", kind, err)
			return
		}
		if err != nil {
			t.Fatalf("open %s fd: %v", kind, err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		opened[fd] = kind
	}

	f, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	opened[int(f.Fd())] = "file"

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	opened[int(r.Fd())] = "pipe"

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err == nil {
		t.Cleanup(func() { ln.Close() })
		lf, err := ln.(*net.TCPListener).File() // a dup of the socket fd
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { lf.Close() })
		opened[int(lf.Fd())] = "socket"
	} else {
		t.Logf("cannot open socket here: %v", err)
	}

	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	keep("eventfd", fd, err)
	fd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	keep("epoll", fd, err)
	fd, err = unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC)
	keep("timerfd", fd, err)
	var mask unix.Sigset_t
	fd, err = unix.Signalfd(-1, &mask, unix.SFD_CLOEXEC)
	keep("signalfd", fd, err)
	fd, err = unix.InotifyInit1(unix.IN_CLOEXEC)
	keep("inotify", fd, err)
	fd, err = unix.PidfdOpen(os.Getpid(), 0)
	keep("pidfd", fd, err)
	fd, err = unix.MemfdCreate("procinfo-test", unix.MFD_CLOEXEC)
	keep("memfd", fd, err)

	fds, err := fs.FDs(os.Getpid(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for num, want := range opened {
		i := slices.IndexFunc(fds, func(fd FD) bool { return fd.Num == num })
		if i < 0 {
			t.Errorf("fd %d (%s) missing from FDs", num, want)
			continue
		}
		if got := model.FDKinds[fds[i].Kind]; got != want {
			t.Errorf("fd %d -> %q classified %s, want %s", num, fds[i].Target, got, want)
		}
	}
}

// TestRealKernelThread checks Check against kthreadd when this pid namespace
// shows the kernel's own pid 2.
func TestRealKernelThread(t *testing.T) {
	fs := realFS(t)
	comm, err := fs.Comm(2)
	if err != nil || strings.TrimSpace(comm) != "kthreadd" {
		t.Skip("pid 2 is not kthreadd here (pid namespace)")
	}
	if err := fs.Check(2); !errors.Is(err, ErrKernelThread) {
		t.Errorf("Check(2) = %v, want ErrKernelThread", err)
	}
	if err := fs.Check(1 << 30); !errors.Is(err, ErrNoProcess) {
		t.Errorf("Check(1<<30) = %v, want ErrNoProcess", err)
	}
}

// A process whose main thread has exited while another runs is alive, though
// its leader's state reads Z.
func TestAliveAfterLeaderExit(t *testing.T) {
	bin := testutil.Fixture(t, "leaderexit", "-pthread")
	cmd := testutil.Start(t, bin, "30")
	fs, err := New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the leader's exit: until then the test proves nothing.
	testutil.Eventually(t, 10*time.Second, "the leader to exit", func() bool { return fs.FDsGone(cmd.Process.Pid) })
	if id, err := fs.Identify(cmd.Process.Pid); err != nil || !id.Running {
		t.Fatalf("process with a running thread: %+v, %v; want running", id, err)
	}
	_ = cmd.Process.Kill()
	_, _ = cmd.Process.Wait()
	if _, err := fs.Identify(cmd.Process.Pid); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("reaped process: %v", err)
	}
}

// /proc/PID/fd shows a process's fds while it runs, not once its leader has
// exited (the folder then lists nothing), reaped or not.
func TestFDsGone(t *testing.T) {
	fs, err := New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	if fs.FDsGone(os.Getpid()) {
		t.Fatal("our own fds reported gone")
	}
	bin := testutil.Fixture(t, "leaderexit", "-pthread")
	cmd := testutil.Start(t, bin, "30")
	pid := cmd.Process.Pid
	testutil.Eventually(t, 10*time.Second, "the fds of a process whose leader exited to be reported gone", func() bool { return fs.FDsGone(pid) })
	_ = cmd.Process.Kill()
	_, _ = cmd.Process.Wait()
	if !fs.FDsGone(pid) {
		t.Fatal("fds of a reaped process not reported gone")
	}
}

func TestStartTime(t *testing.T) {
	fs, err := New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	self, err := fs.Identify(os.Getpid())
	if err != nil || self.Start == 0 {
		t.Fatalf("Identify(self) = %+v, %v", self, err)
	}
	init, err := fs.Identify(1)
	if err != nil || init.Start >= self.Start {
		t.Fatalf("Identify(1) = %+v, %v; want started before ours (%d)", init, err, self.Start)
	}
	if _, err := fs.Identify(1 << 30); !errors.Is(err, ErrNoProcess) {
		t.Fatalf("Identify of a missing pid: %v", err)
	}
}

// The readers of read.go parse what procfs parses, without its syscalls:
// they must agree with it on this kernel's files, for every process this
// test can read (all of them as root).
func TestReadersMatchProcfs(t *testing.T) {
	fs := realFS(t)
	pids, err := fs.AllPIDs()
	if err != nil {
		t.Fatal(err)
	}
	compared := 0
	for _, pid := range pids {
		p, err := fs.proc.Proc(pid)
		if err != nil {
			continue
		}
		wantMaps, err1 := p.ProcMaps()
		wantLimits, err2 := p.Limits()
		wantCgroups, err3 := p.Cgroups()
		wantStat, err4 := p.Stat()
		if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
			continue // gone, or not ours to read
		}
		maps, err := fs.readMaps(pid)
		if again, err2 := p.ProcMaps(); err != nil || err2 != nil || !reflect.DeepEqual(again, wantMaps) {
			continue // changed between the reads
		}
		// procfs joins a path's words with one space; the kernel's own
		// spacing is kept here.
		for i, m := range wantMaps {
			if i < len(maps) && strings.Join(strings.Fields(maps[i].Pathname), " ") == m.Pathname {
				m.Pathname = maps[i].Pathname
			}
		}
		if !reflect.DeepEqual(maps, wantMaps) {
			t.Errorf("pid %d: readMaps differs from procfs:\n%v\n%v", pid, maps, wantMaps)
		}
		if n, err := fs.readNoFileLimit(pid); err != nil || n != wantLimits.OpenFiles {
			t.Errorf("pid %d: readNoFileLimit = %d, %v; procfs %d", pid, n, err, wantLimits.OpenFiles)
		}
		if cg, err := fs.Cgroups(pid); err != nil || !reflect.DeepEqual(cg, wantCgroups) {
			t.Errorf("pid %d: Cgroups = %+v, %v; procfs %+v", pid, cg, err, wantCgroups)
		}
		st, err := fs.readStat(pid)
		if again, err2 := p.Stat(); err2 != nil || again.State != wantStat.State || again.NumThreads != wantStat.NumThreads {
			continue // changed between the reads (a running process)
		}
		// procfs stops before start_brk.
		want := procStat{Comm: wantStat.Comm, State: wantStat.State, PPID: wantStat.PPID, Flags: uint64(wantStat.Flags),
			NumThreads: int64(wantStat.NumThreads), Starttime: wantStat.Starttime, StartStack: wantStat.StartStack,
			StartBrk: st.StartBrk}
		if err != nil || st != want {
			t.Errorf("pid %d: readStat = %+v, %v; procfs %+v", pid, st, err, want)
		}
		compared++
	}
	if compared == 0 {
		t.Fatal("no process compared")
	}
	t.Logf("%d processes compared", compared)
}
