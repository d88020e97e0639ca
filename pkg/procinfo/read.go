package procinfo

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// The reads in this file run for every process that starts on a node (the
// daemon identifies each) and for every watched process at each poll. They
// go to the kernel directly rather than through os.Open, as procfs does:
// os.Open tries to register each /proc file with the netpoller, which costs
// four fcntl calls and a failing epoll_ctl per file, five syscalls besides
// open, read and close. procfs also stats /proc/PID before every read and
// parses stat with fmt.Fscan. With ~100 process starts a second, those were
// a third of the daemon's syscalls and most of its stat parsing (issue 20).

// readSmall reads a /proc file into buf's storage, grown as needed. Files
// under /proc report size 0, so it reads until EOF.
func readSmall(path string, buf []byte) ([]byte, error) {
	fd, err := rawOpen(path, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return nil, err
	}
	defer rawClose(fd)
	n := 0
	for {
		if n == len(buf) {
			buf = append(buf, make([]byte, len(buf))...)
		}
		m, err := rawRead(unix.SYS_READ, fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if m == 0 {
			return buf[:n], nil
		}
		n += m
	}
}

// The calls below go to the kernel without telling the Go scheduler
// (RawSyscall): /proc answers from memory, in microseconds, and a syscall
// the scheduler hears of costs its bookkeeping and, when it lasts over
// 20 µs, a hand-off of the thread's P that sysmon wakes up for. A hundred
// process starts a second made sysmon a tenth of the daemon's CPU.

func rawOpen(path string, flags int) (int, error) {
	p, err := unix.BytePtrFromString(path)
	if err != nil {
		return -1, err
	}
	atCWD := unix.AT_FDCWD // a variable: the constant is negative
	fd, _, e := unix.RawSyscall6(unix.SYS_OPENAT, uintptr(atCWD), uintptr(unsafe.Pointer(p)), uintptr(flags), 0, 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

// rawRead is read(2) or getdents64(2) (nr) into b.
func rawRead(nr uintptr, fd int, b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	n, _, e := unix.RawSyscall(nr, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func rawClose(fd int) {
	_, _, _ = unix.RawSyscall(unix.SYS_CLOSE, uintptr(fd), 0, 0)
}

// procStat holds the fields of /proc/PID/stat the tool uses.
type procStat struct {
	Comm       string
	State      string
	PPID       int
	Flags      uint64
	NumThreads int64
	Starttime  uint64
	// Where exec put the stack and the heap; 0 where the stat does not
	// say (no mm, or not ours to read).
	StartStack, StartBrk uint64
}

// readStat reads and parses /proc/PID/stat.
func (fs FS) readStat(pid int) (procStat, error) {
	var buf [512]byte
	b, err := readSmall(fs.path(pid, "stat"), buf[:])
	if err != nil {
		return procStat{}, procErr(pid, err)
	}
	st, err := parseStat(b)
	if err != nil {
		return procStat{}, fmt.Errorf("pid %d: %w", pid, err)
	}
	return st, nil
}

// parseStat parses a stat line: "PID (COMM) STATE PPID ...". The command
// name may hold spaces and parentheses, so the fields start after the last
// ')'. Field numbers below are proc(5)'s.
func parseStat(b []byte) (procStat, error) {
	l, r := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if l < 0 || r < l || r+2 > len(b) {
		return procStat{}, fmt.Errorf("malformed stat %q", b)
	}
	st := procStat{Comm: string(b[l+1 : r])}
	fields := bytes.Fields(b[r+2:]) // fields[0] is field 3, state
	const (
		state      = 3
		ppid       = 4
		flags      = 9
		numThreads = 20
		starttime  = 22
		startStack = 28
		startBrk   = 47
	)
	if len(fields) < starttime-2 {
		return procStat{}, fmt.Errorf("malformed stat %q: %d fields", b, len(fields)+2)
	}
	field := func(n int) string { return string(fields[n-3]) }
	var errs [6]error
	st.State = field(state)
	st.PPID, errs[0] = strconv.Atoi(field(ppid))
	st.Flags, errs[1] = strconv.ParseUint(field(flags), 10, 64)
	st.NumThreads, errs[2] = strconv.ParseInt(field(numThreads), 10, 64)
	st.Starttime, errs[3] = strconv.ParseUint(field(starttime), 10, 64)
	// Kernels before 3.5 end the line before start_brk.
	if len(fields) >= startBrk-2 {
		st.StartStack, errs[4] = strconv.ParseUint(field(startStack), 10, 64)
		st.StartBrk, errs[5] = strconv.ParseUint(field(startBrk), 10, 64)
	}
	for _, err := range errs {
		if err != nil {
			return procStat{}, fmt.Errorf("malformed stat %q: %w", b, err)
		}
	}
	return st, nil
}

// fdNums lists the fd numbers in /proc/PID/fd, in the kernel's order.
func (fs FS) fdNums(pid int) ([]int, error) {
	dir, err := rawOpen(fs.path(pid, "fd"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return nil, procErr(pid, err)
	}
	defer rawClose(dir)
	var (
		buf   [8192]byte
		names []string
		nums  []int
	)
	for {
		n, err := rawRead(unix.SYS_GETDENTS64, dir, buf[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, procErr(pid, err)
		}
		if n <= 0 {
			return nums, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names[:0])
		for _, name := range names {
			num, err := strconv.Atoi(name)
			if err != nil {
				return nil, fmt.Errorf("pid %d: fd entry %q: %w", pid, name, err)
			}
			nums = append(nums, num)
		}
	}
}

// path is /proc/PID/NAME under fs's mount.
func (fs FS) path(pid int, name string) string {
	return fs.root + "/" + strconv.Itoa(pid) + "/" + name
}

// mapsBufs holds read buffers for /proc/PID/maps, which runs from a few KiB
// (a small tool) to hundreds (a PyTorch process).
var mapsBufs = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// maxPooled bounds the buffers kept for reuse: one huge process must not
// pin its maps' size for the rest of the run.
const maxPooled = 1 << 20

// readMaps reads and parses /proc/PID/maps.
func (fs FS) readMaps(pid int) ([]*procfs.ProcMap, error) {
	buf := mapsBufs.Get().(*[]byte)
	b, err := readSmall(fs.path(pid, "maps"), (*buf)[:cap(*buf)])
	if err == nil && cap(b) <= maxPooled {
		*buf = b[:0]
	}
	defer mapsBufs.Put(buf)
	if err != nil {
		return nil, procErr(pid, err)
	}
	maps, err := parseMaps(b)
	if err != nil {
		return nil, fmt.Errorf("pid %d: %w", pid, err)
	}
	return maps, nil
}

// parseMaps parses the lines of a maps file, "START-END PERMS OFFSET
// MAJ:MIN INODE [PATH]", into procfs's type, which the readers share. The
// entries and their permissions are allocated in two blocks, and a path
// repeated on consecutive lines (a library's segments) is one string.
func parseMaps(b []byte) ([]*procfs.ProcMap, error) {
	n := bytes.Count(b, []byte{'\n'}) + 1
	vals := make([]procfs.ProcMap, 0, n)
	perms := make([]procfs.ProcMapPermissions, 0, n)
	out := make([]*procfs.ProcMap, 0, n)
	var path []byte
	var pathStr string
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		if len(line) == 0 {
			continue
		}
		var f [5][]byte
		rest := line
		for i := range f {
			rest = bytes.TrimLeft(rest, " ")
			f[i], rest, _ = bytes.Cut(rest, []byte{' '})
		}
		start, end, ok1 := bytes.Cut(f[0], []byte{'-'})
		major, minor, ok2 := bytes.Cut(f[3], []byte{':'})
		if !ok1 || !ok2 || len(f[1]) < 4 {
			return nil, fmt.Errorf("malformed maps line %q", line)
		}
		var nums [6]uint64
		var errs [6]error
		nums[0], errs[0] = strconv.ParseUint(string(start), 16, 64)
		nums[1], errs[1] = strconv.ParseUint(string(end), 16, 64)
		nums[2], errs[2] = strconv.ParseUint(string(f[2]), 16, 63)
		nums[3], errs[3] = strconv.ParseUint(string(major), 16, 32)
		nums[4], errs[4] = strconv.ParseUint(string(minor), 16, 32)
		nums[5], errs[5] = strconv.ParseUint(string(f[4]), 10, 64)
		for _, err := range errs {
			if err != nil {
				return nil, fmt.Errorf("malformed maps line %q: %w", line, err)
			}
		}
		if p := bytes.TrimLeft(rest, " "); !bytes.Equal(p, path) {
			path, pathStr = p, string(p)
		}
		perms = append(perms, procfs.ProcMapPermissions{
			Read: f[1][0] == 'r', Write: f[1][1] == 'w', Execute: f[1][2] == 'x',
			Private: f[1][3] == 'p', Shared: f[1][3] == 's'})
		vals = append(vals, procfs.ProcMap{
			StartAddr: uintptr(nums[0]), EndAddr: uintptr(nums[1]), Perms: &perms[len(perms)-1],
			Offset: int64(nums[2]), Dev: unix.Mkdev(uint32(nums[3]), uint32(nums[4])), Inode: nums[5],
			Pathname: pathStr})
		out = append(out, &vals[len(vals)-1])
	}
	return out, nil
}

// readNoFileLimit reads the soft "Max open files" of /proc/PID/limits;
// "unlimited" reads as math.MaxUint64, as procfs has it.
func (fs FS) readNoFileLimit(pid int) (uint64, error) {
	var buf [2048]byte
	b, err := readSmall(fs.path(pid, "limits"), buf[:])
	if err != nil {
		return 0, procErr(pid, err)
	}
	const name = "Max open files"
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		rest, ok := bytes.CutPrefix(line, []byte(name))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) == 0 {
			break
		}
		if string(f[0]) == "unlimited" {
			return math.MaxUint64, nil
		}
		n, err := strconv.ParseUint(string(f[0]), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("pid %d: limits: %q: %w", pid, line, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("pid %d: limits: no %q line", pid, name)
}

// Cgroups reads /proc/PID/cgroup: "ID:CONTROLLERS:PATH" per line, in
// procfs's type.
func (fs FS) Cgroups(pid int) ([]procfs.Cgroup, error) {
	var buf [4096]byte
	b, err := readSmall(fs.path(pid, "cgroup"), buf[:])
	if err != nil {
		return nil, procErr(pid, err)
	}
	var out []procfs.Cgroup
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte{'\n'})
		if len(line) == 0 {
			continue
		}
		id, rest, ok1 := bytes.Cut(line, []byte{':'})
		ctrls, path, ok2 := bytes.Cut(rest, []byte{':'})
		n, err := strconv.Atoi(string(id))
		if !ok1 || !ok2 || err != nil {
			return nil, fmt.Errorf("malformed cgroup line %q", line)
		}
		cg := procfs.Cgroup{HierarchyID: n, Path: string(path)}
		if len(ctrls) > 0 {
			cg.Controllers = strings.Split(string(ctrls), ",")
		}
		out = append(out, cg)
	}
	return out, nil
}
