// Package tracefs makes sure tracefs is mounted, as bpftrace does: attaching a
// BPF program to a tracepoint needs the event id that only tracefs exposes,
// and a fresh machine may not have it mounted.
package tracefs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Candidates are the places cilium/ebpf looks for tracefs, in its order.
var Candidates = []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"}

// Mounted returns the first candidate that holds a mounted tracefs (or the
// debugfs view of it), or "" if none does.
func Mounted() string {
	for _, p := range Candidates {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) != nil {
			continue
		}
		if st.Type == unix.TRACEFS_MAGIC || st.Type == unix.DEBUGFS_MAGIC {
			if _, err := os.Stat(filepath.Join(p, "events")); err == nil {
				return p
			}
		}
	}
	return ""
}

// Ensure returns the tracefs path, mounting tracefs at /sys/kernel/tracing
// when it is not mounted anywhere yet. The mount is left in place afterwards,
// like bpftrace does: it is the kernel's standard location and costs nothing.
func Ensure() (path string, mountedNow bool, err error) {
	if p := Mounted(); p != "" {
		return p, false, nil
	}
	target := Candidates[0]
	if err := unix.Mount("tracefs", target, "tracefs", 0, ""); err != nil {
		if errors.Is(err, unix.EPERM) {
			return "", false, fmt.Errorf("tracefs is not mounted and mounting it at %s was refused: %w (run as root)", target, err)
		}
		return "", false, fmt.Errorf("tracefs is not mounted and mounting it at %s failed: %w", target, err)
	}
	if Mounted() != target {
		return "", true, fmt.Errorf("mounted tracefs at %s but it shows no events", target)
	}
	return target, true, nil
}

// EventExists reports whether the tracepoint group/name exists.
func EventExists(root, group, name string) bool {
	_, err := os.Stat(filepath.Join(root, "events", group, name, "id"))
	return err == nil
}
