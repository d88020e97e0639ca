// Package bpfobjtest lets tests load the BPF objects as an older kernel would.
package bpfobjtest

import (
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
)

// OlderKernel makes the BPF objects loaded by the rest of the test take
// every fallback of the oldest kernel supported (5.10): no task storage, no
// bpf_task_pt_regs, no uprobe cookies, preallocated hash maps, no session
// uprobes. The fallback
// code then runs on the test machine's kernel too, not only in the kernel
// matrix (make kernels).
func OlderKernel(t testing.TB) {
	t.Helper()
	saved := bpfobj.Probe
	k := saved()
	k.TaskStorage, k.TaskPtRegs, k.Cookies, k.RuntimeAlloc, k.UprobeSession = false, false, false, false, false
	bpfobj.Probe = func() bpfobj.Kernel { return k }
	t.Cleanup(func() { bpfobj.Probe = saved })
}
