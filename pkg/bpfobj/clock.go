package bpfobj

import "golang.org/x/sys/unix"

// KtimeNow reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns: the time
// the objects stamp events with.
func KtimeNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}
