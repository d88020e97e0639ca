package procinfo

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// fakeProc describes one process directory of a fixture proc root.
type fakeProc struct {
	pid     int
	comm    string
	state   string // stat field 3: R, S, Z, ...
	ppid    int
	flags   uint // stat field 9
	cmdline []string
	nofile  string // soft "Max open files" in limits
	fds     map[int]string
	net     map[string]string // files of net/ (tcp, unix, ...), by name
}

// statFmt is a real /proc/PID/stat line (kernel 6.x, 52 fields) with pid,
// comm, state, ppid and flags left open; procfs needs the fields after them.
const statFmt = "%d (%s) %s %d 3635 2380 0 -1 %d 100 0 0 0 0 0 0 0 20 0 1 0 18083 3133440 412 " +
	"18446744073709551615 93921883197440 93921883217321 140727842612960 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 " +
	"93921883233328 93921883234944 93922343264256 140727842617847 140727842617867 140727842617867 140727842619371 0\n"

// limitsFmt is /proc/PID/limits as the kernel writes it, with the soft open
// files limit left open.
const limitsFmt = `Limit                     Soft Limit           Hard Limit           Units     
Max cpu time              unlimited            unlimited            seconds   
Max file size             unlimited            unlimited            bytes     
Max data size             unlimited            unlimited            bytes     
Max stack size            8388608              unlimited            bytes     
Max core file size        0                    unlimited            bytes     
Max resident set          unlimited            unlimited            bytes     
Max processes             96365                96365                processes 
Max open files            %-20s 1048576              files     
Max locked memory         8388608              8388608              bytes     
Max address space         unlimited            unlimited            bytes     
Max file locks            unlimited            unlimited            locks     
Max pending signals       96365                96365                signals   
Max msgqueue size         819200               819200               bytes     
Max nice priority         0                    0                    
Max realtime priority     0                    0                    
Max realtime timeout      unlimited            unlimited            us        
`

// newFixture writes procs under a temporary proc root and opens it.
func newFixture(t *testing.T, procs ...fakeProc) FS {
	t.Helper()
	root := t.TempDir()
	for _, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(p.pid))
		if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		var cmdline string
		for _, arg := range p.cmdline {
			cmdline += arg + "\x00"
		}
		files := map[string]string{
			"stat":    fmt.Sprintf(statFmt, p.pid, p.comm, p.state, p.ppid, p.flags),
			"comm":    p.comm + "\n",
			"cmdline": cmdline,
			"limits":  fmt.Sprintf(limitsFmt, p.nofile),
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if len(p.net) > 0 {
			if err := os.Mkdir(filepath.Join(dir, "net"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for name, content := range p.net {
			if err := os.WriteFile(filepath.Join(dir, "net", name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		for num, target := range p.fds {
			// Symlinks may point at names that do not exist, as /proc's do.
			if err := os.Symlink(target, filepath.Join(dir, "fd", strconv.Itoa(num))); err != nil {
				t.Fatal(err)
			}
		}
	}
	fs, err := New(root)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// worker is an ordinary user process with one fd of several kinds.
var worker = fakeProc{
	pid: 100, comm: "worker", state: "S", ppid: 1,
	cmdline: []string{"worker", "--serve"}, nofile: "1024",
	fds: map[int]string{
		0:  "/dev/null",
		1:  "pipe:[4001]",
		3:  "socket:[4002]",
		5:  "anon_inode:[eventpoll]",
		12: "/memfd:jit (deleted)",
	},
}

func TestKindOf(t *testing.T) {
	tests := []struct {
		target, want string
	}{
		{"socket:[123]", "socket"},
		{"pipe:[456]", "pipe"},
		{"anon_inode:[eventfd]", "eventfd"},
		{"anon_inode:[eventpoll]", "epoll"},
		{"anon_inode:[timerfd]", "timerfd"},
		{"anon_inode:[signalfd]", "signalfd"},
		{"anon_inode:inotify", "inotify"},
		{"anon_inode:[pidfd]", "pidfd"},
		{"/memfd:x (deleted)", "memfd"},
		{"/memfd:", "memfd"},
		{"/etc/passwd", "file"},
		{"/dev/null", "file"},
		{"/tmp/gone (deleted)", "file"},
		{"anon_inode:[io_uring]", "other"},
		{"anon_inode:bpf-map", "other"},
		{"anon_inode:[inotify]", "other"}, // the kernel writes inotify without brackets
		{"net:[4026531840]", "other"},
		{"memfd:x", "other"}, // not absolute: not the memfd form
		{"", "other"},
	}
	for _, tt := range tests {
		got := KindOf(tt.target)
		if int(got) >= len(model.FDKinds) || model.FDKinds[got] != tt.want {
			t.Errorf("KindOf(%q) = %d, want %d (%s)", tt.target, got, slices.Index(model.FDKinds, tt.want), tt.want)
		}
	}
}

func TestFDs(t *testing.T) {
	fs := newFixture(t, worker)
	got, err := fs.FDs(worker.pid, nil)
	if err != nil {
		t.Fatal(err)
	}
	kind := func(name string) uint8 { return uint8(slices.Index(model.FDKinds, name)) }
	want := []FD{
		{0, kind("file"), "/dev/null"},
		{1, kind("pipe"), "pipe:[4001]"},
		{3, kind("socket"), "socket:[4002]"},
		{5, kind("epoll"), "anon_inode:[eventpoll]"},
		{12, kind("memfd"), "/memfd:jit (deleted)"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("FDs = %v, want %v", got, want)
	}

	if _, err := fs.FDs(999, nil); !errors.Is(err, ErrNoProcess) {
		t.Errorf("FDs(missing) error = %v, want ErrNoProcess", err)
	}
}

func TestFDCount(t *testing.T) {
	fs := newFixture(t, worker)
	n, err := fs.FDCount(worker.pid)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(worker.fds) {
		t.Errorf("FDCount = %d, want %d", n, len(worker.fds))
	}
	if _, err := fs.FDCount(999); !errors.Is(err, ErrNoProcess) {
		t.Errorf("FDCount(missing) error = %v, want ErrNoProcess", err)
	}
}

func TestNoFileLimit(t *testing.T) {
	unlimited := worker
	unlimited.pid, unlimited.nofile = 101, "unlimited"
	fs := newFixture(t, worker, unlimited)
	tests := []struct {
		pid  int
		want uint64
	}{
		{worker.pid, 1024},
		{unlimited.pid, math.MaxUint64},
	}
	for _, tt := range tests {
		got, err := fs.NoFileLimit(tt.pid)
		if err != nil {
			t.Errorf("NoFileLimit(%d): %v", tt.pid, err)
			continue
		}
		if got != tt.want {
			t.Errorf("NoFileLimit(%d) = %d, want %d", tt.pid, got, tt.want)
		}
	}
	if _, err := fs.NoFileLimit(999); !errors.Is(err, ErrNoProcess) {
		t.Errorf("NoFileLimit(missing) error = %v, want ErrNoProcess", err)
	}
}

func TestComm(t *testing.T) {
	fs := newFixture(t, worker)
	got, err := fs.Comm(worker.pid)
	if err != nil {
		t.Fatal(err)
	}
	if got != "worker" {
		t.Errorf("Comm = %q, want %q", got, "worker")
	}
	if _, err := fs.Comm(999); !errors.Is(err, ErrNoProcess) {
		t.Errorf("Comm(missing) error = %v, want ErrNoProcess", err)
	}
}

func TestCheck(t *testing.T) {
	// kthreadd as the kernel shows it: PF_KTHREAD set, no cmdline, parent 0,
	// so only the flags can tell.
	kthreadd := fakeProc{pid: 200, comm: "kthreadd", state: "S", ppid: 0, flags: 0x208040, nofile: "1024"}
	// A kernel thread without the flag, so only the cmdline + ppid rule can catch it.
	noFlag := fakeProc{pid: 201, comm: "kworker/0:1", state: "I", ppid: 2, nofile: "1024"}
	// A user process whose parent is pid 2 (possible in a pid namespace).
	childOf2 := worker
	childOf2.pid, childOf2.ppid = 202, 2
	fs := newFixture(t, worker, kthreadd, noFlag, childOf2)

	tests := []struct {
		name    string
		pid     int
		wantErr error  // for errors.Is; nil with wantMsg "" means success
		wantMsg string // exact message
	}{
		{"user process", worker.pid, nil, ""},
		{"child of pid 2 with cmdline", childOf2.pid, nil, ""},
		{"missing", 999, ErrNoProcess, "no process with pid 999"},
		{"kernel thread by flags", kthreadd.pid, ErrKernelThread,
			"pid 200 is a kernel thread (kthreadd child); nothing to trace in user space"},
		{"kernel thread by cmdline and ppid", noFlag.pid, ErrKernelThread,
			"pid 201 is a kernel thread (kthreadd child); nothing to trace in user space"},
		{"zero", 0, nil, "pid must be a positive integer, got 0"},
		{"negative", -7, nil, "pid must be a positive integer, got -7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := fs.Check(tt.pid)
			if tt.wantMsg == "" {
				if err != nil {
					t.Fatalf("Check(%d) = %v, want nil", tt.pid, err)
				}
				return
			}
			if err == nil || err.Error() != tt.wantMsg {
				t.Fatalf("Check(%d) = %v, want %q", tt.pid, err, tt.wantMsg)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("Check(%d) = %v, want errors.Is %v", tt.pid, err, tt.wantErr)
			}
		})
	}
}

func TestRunning(t *testing.T) {
	zombie := worker
	zombie.pid, zombie.state = 300, "Z"
	fs := newFixture(t, worker, zombie)
	tests := []struct {
		pid  int
		want bool
	}{
		{worker.pid, true},
		{zombie.pid, false},
		{999, false},
	}
	for _, tt := range tests {
		id, err := fs.Identify(tt.pid)
		if got := err == nil && id.Running; got != tt.want {
			t.Errorf("Identify(%d) = %+v, %v: running %v, want %v", tt.pid, id, err, got, tt.want)
		}
	}
}

func TestParsePIDs(t *testing.T) {
	tests := []struct {
		in      string
		want    []int
		wantErr string // substring; "" means success
	}{
		{"12", []int{12}, ""},
		{"12,34", []int{12, 34}, ""},
		{"34,12", []int{34, 12}, ""},
		{" 12 , 34 ", []int{12, 34}, ""},
		{"12,34,12,56,34", []int{12, 34, 56}, ""},
		{"", nil, "empty item"},
		{"12,,34", nil, "empty item"},
		{"12,", nil, "empty item"},
		{"abc", nil, `invalid pid "abc": not a number`},
		{"12,3x", nil, `invalid pid "3x": not a number`},
		{"1.5", nil, `invalid pid "1.5": not a number`},
		{"0", nil, `invalid pid "0": must be a positive integer`},
		{"12,-3", nil, `invalid pid "-3": must be a positive integer`},
		{"99999999999999999999", nil, "out of range"},
	}
	for _, tt := range tests {
		got, err := ParsePIDs(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParsePIDs(%q) error = %v, want containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParsePIDs(%q): %v", tt.in, err)
			continue
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("ParsePIDs(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

// Within one poll every reader gets the first read of /proc/PID/maps and
// /proc/PID/fd, but FDsNow; the next poll reads them again.
func TestPollCache(t *testing.T) {
	fs := newFixture(t, worker)
	path := filepath.Join(fs.Root(), "100", "maps")
	write := func(lines string) {
		if err := os.WriteFile(path, []byte(lines), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	one := "00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/worker\n"
	two := one + "7f0000000000-7f0000100000 r-xp 00000000 08:02 173522 /usr/lib/libcudart.so.12\n"
	write(one)
	c := NewPollCache()
	cached := fs.WithPollCache(c)
	count := func(f FS) int {
		m, err := f.Maps(100)
		if err != nil {
			t.Fatal(err)
		}
		return len(m)
	}
	if n := count(cached); n != 1 {
		t.Fatalf("%d mappings, want 1", n)
	}
	write(two) // a library loaded within the poll
	if n, m := count(cached), count(fs); n != 1 || m != 2 {
		t.Errorf("same poll: cached %d mappings (want the first read: 1), uncached %d (want 2)", n, m)
	}
	c.Next()
	if n := count(cached); n != 2 {
		t.Errorf("next poll: %d mappings, want 2", n)
	}
	// Dropped (a process of no interest): the next reader reads the file.
	write(one)
	cached.Drop(100)
	if n := count(cached); n != 1 {
		t.Errorf("after Drop: %d mappings, want the file's 1", n)
	}
	if _, err := cached.Maps(999); !errors.Is(err, ErrNoProcess) {
		t.Errorf("missing process: %v", err)
	}

	fdDir := filepath.Join(fs.Root(), "100", "fd")
	open := func(num int) {
		if err := os.Symlink("/dev/null", filepath.Join(fdDir, strconv.Itoa(num))); err != nil {
			t.Fatal(err)
		}
	}
	all, err := cached.FDs(100, nil)
	if err != nil {
		t.Fatal(err)
	}
	n0 := len(all)
	open(50)
	// FDs, FDNumsNow and FDKind read now, whatever the poll's cache holds.
	if nums, err := cached.FDNumsNow(100); err != nil || len(nums) != n0+1 {
		t.Errorf("FDNumsNow: %v fds (%v), want %d", nums, err, n0+1)
	}
	if kind, err := cached.FDKind(100, 50); err != nil || kind != KindOf("/dev/null") {
		t.Errorf("FDKind of fd 50: %d, %v; want %d", kind, err, KindOf("/dev/null"))
	}
	if _, err := cached.FDKind(100, 49); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("FDKind of a closed fd: %v, want os.ErrNotExist", err)
	}
	open(51)
	if l, err := cached.FDs(100, nil); err != nil || len(l) != n0+2 {
		t.Errorf("FDs: %d fds (%v), want %d", len(l), err, n0+2)
	}
	// Named fds: only those read, a closed one left out, in number order.
	want := []FD{{50, KindOf("/dev/null"), "/dev/null"}, {51, KindOf("/dev/null"), "/dev/null"}}
	if l, err := cached.FDs(100, []int{51, 49, 50}); err != nil || !slices.Equal(l, want) {
		t.Errorf("FDs of 51, 49 (closed), 50 = %v, %v; want %v", l, err, want)
	}
}

func TestParseStat(t *testing.T) {
	line := []byte(fmt.Sprintf(statFmt, 42, "a) (b c", "Zl", 7, 0x400104) + "\n")
	st, err := parseStat(line)
	if err != nil {
		t.Fatal(err)
	}
	want := procStat{Comm: "a) (b c", State: "Zl", PPID: 7, Flags: 0x400104, NumThreads: 1, Starttime: 18083,
		StartStack: 140727842612960, StartBrk: 93922343264256}
	if st != want {
		t.Errorf("parseStat = %+v, want %+v", st, want)
	}
	// A kernel before 3.5 ends the line before start_brk: no layout.
	short := bytes.Fields(line)[:44]
	want.StartStack, want.StartBrk = 0, 0
	if st, err := parseStat(bytes.Join(short, []byte{' '})); err != nil || st != want {
		t.Errorf("parseStat of 44 fields = %+v, %v; want %+v", st, err, want)
	}
	for _, bad := range []string{"", "42 (x", "42 (x) S 1 2", "42 (x) S one 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
}
