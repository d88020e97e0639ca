package bpfobj

import (
	"time"

	"golang.org/x/sys/unix"
)

// KtimeNow reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns: the time
// the objects stamp events with.
func KtimeNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// WallClock returns a converter from bpf_ktime_get_ns (CLOCK_MONOTONIC) to
// wall-clock time, anchored now.
func WallClock() func(uint64) time.Time {
	wall, mono := time.Now(), KtimeNow()
	return func(ns uint64) time.Time { return wall.Add(-time.Duration(mono - ns)) }
}
