package main

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// neededCaps are the capabilities the tool uses, each with what may stand in
// for it (CAP_SYS_ADMIN held both BPF and perf rights before 5.8): loading
// and reading BPF maps and programs, attaching tracing programs and reading
// user stacks, reading /proc/PID/{fd,maps,root} of processes with other
// credentials, and reading their files through /proc/PID/root. deploy/README
// gives each one's reason; README and the DaemonSet say the same.
var neededCaps = []struct {
	name   string
	bit    uint
	orElse uint // 0: none
}{
	{"CAP_BPF", unix.CAP_BPF, unix.CAP_SYS_ADMIN},
	{"CAP_PERFMON", unix.CAP_PERFMON, unix.CAP_SYS_ADMIN},
	{"CAP_SYS_PTRACE", unix.CAP_SYS_PTRACE, 0},
	{"CAP_DAC_READ_SEARCH", unix.CAP_DAC_READ_SEARCH, 0},
}

// requirePrivileges checks the effective capabilities, not the uid: root
// without them (a container that dropped them) fails here with their names
// rather than later with EPERM, and a user granted them runs.
func requirePrivileges() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading this process's capabilities: %w", err)
	}
	eff := uint64(data[1].Effective)<<32 | uint64(data[0].Effective)
	if missing := missingCaps(eff); len(missing) > 0 {
		return fmt.Errorf("permission denied: missing %s (run as root, e.g. sudo autoglm-ebpf ..., or grant CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH)",
			strings.Join(missing, ", "))
	}
	return nil
}

// missingCaps names the needed capabilities absent from the effective set eff.
func missingCaps(eff uint64) []string {
	has := func(bit uint) bool { return eff&(1<<bit) != 0 }
	var out []string
	for _, c := range neededCaps {
		if !has(c.bit) && (c.orElse == 0 || !has(c.orElse)) {
			out = append(out, c.name)
		}
	}
	return out
}
