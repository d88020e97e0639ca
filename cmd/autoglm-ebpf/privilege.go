package main

import (
	"fmt"
	"strings"

	"github.com/open-autoglm/autoglm-ebpf/pkg/features"
)

// requirePrivileges checks the effective capabilities, not the uid: root
// without them (a container that dropped them) fails here with their names
// rather than later with EPERM, and a user granted them runs. Each is needed
// by every view or by the fd view, which every watched process needs
// (features.MissingCaps): without one the tool would watch nothing.
func requirePrivileges() error {
	missing, err := features.MissingCaps()
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("permission denied: missing %s (run as root, e.g. sudo autoglm-ebpf ..., or grant CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH)",
			strings.Join(missing, ", "))
	}
	return nil
}
