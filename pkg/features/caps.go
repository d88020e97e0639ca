package features

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// neededCaps are the capabilities the tool uses, each with what may stand in
// for it (CAP_SYS_ADMIN held both BPF and perf rights before 5.8). Each one
// is needed on every node, not by one view alone: deploy/README.md,
// "Security", has the calls that need each one and what fails without it,
// each tested (cmd/autoglm-ebpf's TestEachCapabilityNeeded).
//   - CAP_BPF: creating maps, loading programs, reading maps.
//   - CAP_PERFMON: loading tracing programs, attaching them
//     (perf_event_open), bpf_probe_read_user and user stacks from BPF.
//   - CAP_SYS_PTRACE: the ptrace read check on /proc/PID/fd/N, root and exe
//     of processes with other credentials (every other container's: their
//     capabilities are no subset of ours) and process_vm_readv.
//   - CAP_DAC_READ_SEARCH: listing /proc/PID/fd of a process of another
//     user (mode 0500, owned by it), and its files through /proc/PID/root
//     whatever their mode.
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

// MissingCaps names the needed capabilities absent from this process's
// effective set: the set, not the uid, says what the kernel allows (root in
// a container that dropped them has none; a user granted them has all).
func MissingCaps() ([]string, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return nil, fmt.Errorf("reading this process's capabilities: %w", err)
	}
	return missingCaps(uint64(data[1].Effective)<<32 | uint64(data[0].Effective)), nil
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

// capsResult is check's line for the capabilities.
func capsResult() Result {
	r := Result{Name: "capabilities", Required: true}
	missing, err := MissingCaps()
	switch {
	case err != nil:
		r.Detail = err.Error()
	case len(missing) > 0:
		r.Detail = "missing " + strings.Join(missing, ", ") + " (effective set; run as root or grant them)"
	default:
		r.OK = true
		r.Detail = "CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH effective"
	}
	return r
}
