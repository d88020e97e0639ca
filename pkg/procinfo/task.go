package procinfo

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ThreadName returns the name of thread tid of pid
// (/proc/PID/task/TID/comm); ErrNoProcess once the thread is gone.
func (fs FS) ThreadName(pid, tid int) (string, error) {
	// One read instead of procfs's stat-then-read: this runs for every
	// thread of every target each interval.
	b, err := os.ReadFile(filepath.Join(fs.root, strconv.Itoa(pid), "task", strconv.Itoa(tid), "comm"))
	if err != nil {
		return "", procErr(tid, err)
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}

// AllowedCPUs returns how many CPUs the affinity mask of pid (its main
// thread) allows. It asks the kernel, not /proc, so it ignores ProcRoot.
func AllowedCPUs(pid int) (int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(pid, &set); err != nil {
		return 0, procErr(pid, err)
	}
	return set.Count(), nil
}
