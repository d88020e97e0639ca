package procinfo

import (
	"bytes"
	"fmt"
	"strconv"

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

// readSmall reads a /proc file of at most a page or so into buf's storage.
// Files under /proc report size 0, so it reads until EOF.
func readSmall(path string, buf []byte) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	n := 0
	for {
		if n == len(buf) {
			buf = append(buf, make([]byte, len(buf))...)
		}
		m, err := unix.Read(fd, buf[n:])
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

// procStat holds the fields of /proc/PID/stat the tool uses.
type procStat struct {
	Comm       string
	State      string
	PPID       int
	Flags      uint64
	NumThreads int64
	Starttime  uint64
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
	)
	if len(fields) < starttime-2 {
		return procStat{}, fmt.Errorf("malformed stat %q: %d fields", b, len(fields)+2)
	}
	field := func(n int) string { return string(fields[n-3]) }
	var errs [4]error
	st.State = field(state)
	st.PPID, errs[0] = strconv.Atoi(field(ppid))
	st.Flags, errs[1] = strconv.ParseUint(field(flags), 10, 64)
	st.NumThreads, errs[2] = strconv.ParseInt(field(numThreads), 10, 64)
	st.Starttime, errs[3] = strconv.ParseUint(field(starttime), 10, 64)
	for _, err := range errs {
		if err != nil {
			return procStat{}, fmt.Errorf("malformed stat %q: %w", b, err)
		}
	}
	return st, nil
}

// fdNums lists the fd numbers in /proc/PID/fd, in the kernel's order.
func (fs FS) fdNums(pid int) ([]int, error) {
	dir, err := unix.Open(fs.path(pid, "fd"), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, procErr(pid, err)
	}
	defer unix.Close(dir)
	var (
		buf   [8192]byte
		names []string
		nums  []int
	)
	for {
		n, err := unix.Getdents(dir, buf[:])
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
