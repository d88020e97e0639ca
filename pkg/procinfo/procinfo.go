// Package procinfo is the one place that reads /proc about a target process:
// its fds, fd limit, name and liveness, plus validation of user-given pids.
// It is built on github.com/prometheus/procfs so that parsing lives there.
package procinfo

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Errors for errors.Is: Check returns them, and the readers return
// ErrNoProcess when the process is gone (or never existed).
var (
	ErrNoProcess    = errors.New("no process")
	ErrKernelThread = errors.New("kernel thread")
)

// pfKthread is PF_KTHREAD from include/linux/sched.h, set in the flags field
// of /proc/PID/stat for kernel threads.
const pfKthread = 0x00200000

// kthreaddPID is the parent of every kernel thread but itself.
const kthreaddPID = 2

// FS reads process information under one proc mount.
type FS struct {
	root  string // kept because procfs.FS does not expose its mount point
	proc  procfs.FS
	cache *PollCache // nil: every Maps call reads /proc
	// self is a procfs.Proc of this mount, copied with another PID for
	// each process read: procfs.FS.Proc stats /proc/PID first, one more
	// syscall for every read, when the read itself says whether pid is
	// there. Unset (PID 0) where the mount has no "self" (test fixtures).
	self procfs.Proc
	// procMount: root is a proc file system, whose fd directories give
	// their fd count as size (FDCount); not a test fixture's folder.
	procMount bool
}

// PollCache shares one read of each process's /proc/PID/maps and fd
// listing among the readers of one poll: the views, the daemon's finder
// and the symbolizer each want them for a process that just started, and
// maps can be thousands of lines for a PyTorch process. What it returns is
// shared: callers must not change it.
type PollCache struct {
	mu   sync.Mutex
	maps map[int]read[[]*procfs.ProcMap]
	nums map[int][]int // fd numbers listed this poll (FDNumsNow)
	// hints outlive a poll: a view sets and clears its own (SetKindHint).
	hints map[int]KindHint
}

// KindHint says the kind of fd num of one process where a view knows it
// without /proc (fdtrack: the fds a child inherited from its parent's
// table); ok is false where it does not.
type KindHint func(num int) (kind uint8, ok bool)

type read[T any] struct {
	val T
	err error
}

// NewPollCache returns an empty cache; call Next at the start of each poll.
func NewPollCache() *PollCache {
	return &PollCache{maps: map[int]read[[]*procfs.ProcMap]{}, nums: map[int][]int{}, hints: map[int]KindHint{}}
}

// Next starts a new poll: what earlier polls read is stale.
func (c *PollCache) Next() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.maps)
	clear(c.nums)
}

// WithPollCache returns fs reading /proc/PID/maps and /proc/PID/fd
// through c (nil: read at every call).
func (fs FS) WithPollCache(c *PollCache) FS {
	fs.cache = c
	return fs
}

// once returns what cache holds for pid, or reads it and keeps it.
func once[T any](c *PollCache, cache map[int]read[T], pid int, readFn func(int) (T, error)) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := cache[pid]; ok {
		return r.val, r.err
	}
	v, err := readFn(pid)
	cache[pid] = read[T]{v, err}
	return v, err
}

// Maps returns the mappings of pid, read once per poll when fs has a cache.
func (fs FS) Maps(pid int) ([]*procfs.ProcMap, error) {
	if fs.cache == nil {
		return fs.readMaps(pid)
	}
	return once(fs.cache, fs.cache.maps, pid, fs.readMaps)
}

// FDs lists the open fds of pid among nums, or all of them when nums is
// nil, with their kinds, sorted by number. A reader that knows which fds
// it wants (the fds of one leaking site) names them: a table of 10 000 is
// not read link by link for the 50 it asks about.
func (fs FS) FDs(pid int, nums []int) ([]FD, error) {
	if nums == nil {
		var err error
		if nums, err = fs.fdNums(pid); err != nil {
			return nil, err
		}
	}
	dir := fs.path(pid, "fd") + "/"
	fds := make([]FD, 0, len(nums))
	for _, num := range nums {
		target, err := os.Readlink(dir + strconv.Itoa(num))
		if errors.Is(err, os.ErrNotExist) {
			continue // closed since the listing: no longer open
		}
		if err != nil {
			return nil, procErr(pid, err)
		}
		fds = append(fds, FD{Num: num, Kind: KindOf(target), Target: target})
	}
	// The kernel lists fds in order, but other directories (fixtures) and
	// callers need not.
	slices.SortFunc(fds, func(a, b FD) int { return cmp.Compare(a.Num, b.Num) })
	return fds, nil
}

// SetKindHint lets the readers of fs's cache know the kinds of pid's fds
// that h knows, until it is set again; nil clears it. Without a cache it
// does nothing.
func (fs FS) SetKindHint(pid int, h KindHint) {
	c := fs.cache
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if h == nil {
		delete(c.hints, pid)
	} else {
		c.hints[pid] = h
	}
}

// ShareFDNums leaves nums, pid's fd numbers as a reader learnt them
// otherwise (fdtrack: the kernel's copy of a child's open-fd bitmap), for
// SocketFDs in the same poll.
func (fs FS) ShareFDNums(pid int, nums []int) {
	if c := fs.cache; c != nil {
		c.mu.Lock()
		c.nums[pid] = nums
		c.mu.Unlock()
	}
}

// SocketFDs lists the socket fds of pid now, with their targets: an fd
// whose kind a hint gives as another is not read. A child holding the
// 10 000 files its parent leaked is not read fd by fd to find its sockets.
func (fs FS) SocketFDs(pid int) ([]FD, error) {
	var (
		hint KindHint
		nums []int
	)
	if c := fs.cache; c != nil {
		c.mu.Lock()
		hint, nums = c.hints[pid], c.nums[pid]
		c.mu.Unlock()
	}
	if nums == nil {
		var err error
		if nums, err = fs.fdNums(pid); err != nil {
			return nil, err
		}
	}
	socket := kindIndex["socket"]
	dir := fs.path(pid, "fd") + "/"
	var out []FD
	for _, num := range nums {
		if hint != nil {
			if kind, ok := hint(num); ok && kind != socket {
				continue
			}
		}
		target, err := os.Readlink(dir + strconv.Itoa(num))
		if errors.Is(err, os.ErrNotExist) {
			continue // closed since the listing
		}
		if err != nil {
			return nil, procErr(pid, err)
		}
		if kind := KindOf(target); kind == socket {
			out = append(out, FD{Num: num, Kind: kind, Target: target})
		}
	}
	return out, nil
}

// FDNumsNow lists the fd numbers of pid now, in the kernel's order,
// without reading where they point: what a reader that knows most of a
// table (fdtrack's reconcile) needs to find what changed. The listing is
// left for SocketFDs in the same poll: a listing of 10 000 fds is ~5 ms.
func (fs FS) FDNumsNow(pid int) ([]int, error) {
	nums, err := fs.fdNums(pid)
	if c := fs.cache; c != nil && err == nil {
		c.mu.Lock()
		c.nums[pid] = nums
		c.mu.Unlock()
	}
	return nums, err
}

// FDKind reads where fd num of pid points and classifies it (KindOf). An
// fd closed meanwhile gives an error that is os.ErrNotExist.
func (fs FS) FDKind(pid, num int) (uint8, error) {
	target, err := os.Readlink(fs.path(pid, "fd") + "/" + strconv.Itoa(num))
	if err != nil {
		return 0, fmt.Errorf("pid %d fd %d: %w", pid, num, err)
	}
	return KindOf(target), nil
}

// Drop forgets this poll's reads of pid, for a reader that found the
// process of no interest: a walk of every process on the node need not
// hold all their mappings until the next poll.
func (fs FS) Drop(pid int) {
	if c := fs.cache; c != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.maps, pid)
		delete(c.nums, pid)
	}
}

// Root is the proc mount fs reads.
func (fs FS) Root() string { return fs.root }

// New opens the proc filesystem mounted at procRoot (normally "/proc"; tests
// pass a fixture directory).
func New(procRoot string) (FS, error) {
	p, err := procfs.NewFS(procRoot)
	if err != nil {
		return FS{}, err
	}
	self, _ := p.Self()
	var sfs unix.Statfs_t
	isProc := unix.Statfs(procRoot, &sfs) == nil && sfs.Type == unix.PROC_SUPER_MAGIC
	return FS{root: procRoot, proc: p, self: self, procMount: isProc}, nil
}

// FD is one open file descriptor of a process.
type FD struct {
	Num    int
	Kind   uint8  // index into model.FDKinds
	Target string // link of /proc/PID/fd/NUM, e.g. "socket:[123]"
}

// anonInodeKinds maps what follows "anon_inode:" in an fd link to its kind.
// inotify is the one the kernel names without brackets.
var anonInodeKinds = map[string]string{
	"[eventfd]":   "eventfd",
	"[eventpoll]": "epoll",
	"[timerfd]":   "timerfd",
	"[signalfd]":  "signalfd",
	"inotify":     "inotify",
	"[pidfd]":     "pidfd",
}

// kindIndex maps a kind name to its position in model.FDKinds, so the numbers
// follow the BPF enum from a single list.
var kindIndex = func() map[string]uint8 {
	m := make(map[string]uint8, len(model.FDKinds))
	for i, name := range model.FDKinds {
		m[name] = uint8(i)
	}
	return m
}()

// KindOf classifies an fd link target into an index of model.FDKinds.
func KindOf(target string) uint8 {
	return kindIndex[kindName(target)]
}

func kindName(target string) string {
	switch {
	case strings.HasPrefix(target, "socket:"):
		return "socket"
	case strings.HasPrefix(target, "pipe:"):
		return "pipe"
	case strings.HasPrefix(target, "/memfd:"):
		// memfds live on an internal tmpfs and show as "/memfd:NAME (deleted)",
		// so they must be told apart before other absolute paths.
		return "memfd"
	case strings.HasPrefix(target, "/"):
		return "file"
	}
	if rest, ok := strings.CutPrefix(target, "anon_inode:"); ok {
		if name, ok := anonInodeKinds[rest]; ok {
			return name
		}
	}
	return "other"
}

// FDCount returns how many fds pid has open.
func (fs FS) FDCount(pid int) (int, error) {
	// Since Linux 6.2 the size of /proc/PID/fd is the count of open fds,
	// kept by the kernel: a process holding 15 000 fds is not listed at
	// every poll. Before, and for a process with none, it is 0: listed.
	if fs.procMount {
		var st unix.Stat_t
		if err := unix.Stat(fs.path(pid, "fd"), &st); err != nil {
			return 0, procErr(pid, err)
		}
		if st.Size > 0 {
			return int(st.Size), nil
		}
	}
	nums, err := fs.fdNums(pid)
	return len(nums), err
}

// NoFileLimit returns the soft RLIMIT_NOFILE of pid; "unlimited" reads as
// math.MaxUint64 (procfs maps it so).
func (fs FS) NoFileLimit(pid int) (uint64, error) {
	return fs.readNoFileLimit(pid)
}

// Comm returns the command name of pid (/proc/PID/comm).
func (fs FS) Comm(pid int) (string, error) {
	p, err := fs.process(pid)
	if err != nil {
		return "", err
	}
	c, err := p.Comm()
	if err != nil {
		return "", procErr(pid, err)
	}
	return c, nil
}

// ThreadComm returns the name of thread tid of pid
// (/proc/PID/task/TID/comm).
func (fs FS) ThreadComm(pid, tid int) (string, error) {
	p, err := fs.process(pid)
	if err != nil {
		return "", err
	}
	t, err := p.Thread(tid)
	if err != nil {
		return "", procErr(pid, err)
	}
	c, err := t.Comm()
	if err != nil {
		return "", procErr(pid, err)
	}
	return c, nil
}

// Check validates a pid given by the user: it must be positive, exist, and
// be a user-space process, since kernel threads have nothing to trace.
func (fs FS) Check(pid int) error {
	_, err := fs.Identify(pid)
	return err
}

// Identity is what names a process: pids are reused, so the pid and its
// start time (clock ticks since boot) identify it.
type Identity struct {
	Comm  string
	Start uint64
	PPID  int
	// Running: not a zombie (or dead, state X); a process in those states
	// holds no fds and runs no code. A leader that called pthread_exit
	// shows Z while its other threads run on ("Zl" in ps): it runs.
	Running bool
}

// Identify checks pid as Check does and returns its identity, from one read
// of its stat: a daemon does this for every process that starts, and for
// every process it watches at each poll.
func (fs FS) Identify(pid int) (Identity, error) {
	if pid <= 0 {
		return Identity{}, fmt.Errorf("pid must be a positive integer, got %d", pid)
	}
	st, err := fs.readStat(pid)
	if err != nil {
		return Identity{}, err
	}
	id := Identity{Comm: st.Comm, Start: st.Starttime, PPID: st.PPID,
		Running: st.State != "X" && (st.State != "Z" || st.NumThreads > 1)}
	if st.Flags&pfKthread != 0 {
		return Identity{}, kernelThreadErr(pid)
	}
	// Fallback for a stat without flags we trust: kernel threads have no
	// command line and kthreadd as parent.
	if st.PPID == kthreaddPID {
		p, err := fs.process(pid)
		if err != nil {
			return Identity{}, err
		}
		cmd, err := p.CmdLine()
		if err != nil {
			return Identity{}, procErr(pid, err)
		}
		if len(cmd) == 0 {
			return Identity{}, kernelThreadErr(pid)
		}
	}
	return id, nil
}

// Layout is where exec put a process's stack and heap (/proc/PID/stat's
// startstack and start_brk). Both are randomized at each exec, so they
// tell one image of a process from the next: the kernel's unwinder names
// an address space by them (bpf/unwind.h).
type Layout struct {
	StartStack, StartBrk uint64
}

// Layout reads pid's Layout; an error where its stat hides it (no mm, or
// no right to read it).
func (fs FS) Layout(pid int) (Layout, error) {
	st, err := fs.readStat(pid)
	if err != nil {
		return Layout{}, err
	}
	if st.StartStack == 0 && st.StartBrk == 0 {
		return Layout{}, fmt.Errorf("pid %d: no address space layout in its stat", pid)
	}
	return Layout{StartStack: st.StartStack, StartBrk: st.StartBrk}, nil
}

func kernelThreadErr(pid int) error {
	return fmt.Errorf("pid %d is a %w (kthreadd child); nothing to trace in user space", pid, ErrKernelThread)
}

// pfExiting is PF_EXITING in a task's flags (include/linux/sched.h): set
// when the task starts to exit, before its fds are released.
const pfExiting = 0x4

// FDsGone reports whether /proc/PID/fd no longer shows pid's fds: its
// leader (whose table the folder lists) is exiting or has exited, or pid is
// gone. The fds of such a process, or of one whose leader called
// pthread_exit, are not the listing's to judge.
func (fs FS) FDsGone(pid int) bool {
	st, err := fs.readStat(pid)
	if err != nil {
		return true
	}
	return st.Flags&pfExiting != 0 || st.State == "Z" || st.State == "X"
}

// process returns pid's procfs handle. Where the mount has "self" it does
// not look for pid: the read that follows fails with ErrNoProcess if pid is
// gone. Elsewhere procfs checks, turning "not there" into ErrNoProcess.
func (fs FS) process(pid int) (procfs.Proc, error) {
	if fs.self.PID != 0 {
		p := fs.self
		p.PID = pid
		return p, nil
	}
	p, err := fs.proc.Proc(pid)
	if err != nil {
		return procfs.Proc{}, procErr(pid, err)
	}
	return p, nil
}

// procErr reports a missing file under /proc/PID (ENOENT) or a task that died
// while being read (ESRCH) as ErrNoProcess, since the process having exited is
// the usual reason; other errors, such as EACCES, keep their cause.
func procErr(pid int, err error) error {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("%w with pid %d", ErrNoProcess, pid)
	}
	return fmt.Errorf("pid %d: %w", pid, err)
}

// ParsePIDs parses a comma-separated pid list such as "12,34". Spaces around
// items are allowed; duplicates are dropped, keeping first-seen order.
func ParsePIDs(s string) ([]int, error) {
	var pids []int
	seen := make(map[int]bool)
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("invalid pid list %q: empty item", s)
		}
		pid, err := strconv.Atoi(item)
		if errors.Is(err, strconv.ErrRange) {
			return nil, fmt.Errorf("invalid pid %q: out of range", item)
		}
		if err != nil {
			return nil, fmt.Errorf("invalid pid %q: not a number", item)
		}
		if pid <= 0 {
			return nil, fmt.Errorf("invalid pid %q: must be a positive integer", item)
		}
		if !seen[pid] {
			seen[pid] = true
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
