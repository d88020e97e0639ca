package fdtrack

import (
	"fmt"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/features"
)

// Check loads and attaches the fd object as a run would and reports how
// the fd-creating syscalls are traced, and how the Python frames the
// object carries are captured; up is whether the view loads.
func Check() (rs []features.Result, up bool) {
	r := features.Result{Name: "view fd (raw_syscalls sys_enter/sys_exit)", Required: true}
	t, err := New(Config{})
	if err != nil {
		r.Detail = bpfobj.Summary(err)
		return []features.Result{r, python()}, false
	}
	defer t.Close()
	r.OK, r.Detail = true, t.Mode()
	if t.Mode() == bpfobj.ModeTracepoint {
		r.Detail = "tracepoint (tp_btf unavailable: " + bpfobj.Summary(t.BTFError()) + ")"
		if !bpfobj.Probe().TaskPtRegs {
			r.Detail += "; no opening stacks without bpf_task_pt_regs"
		}
	}
	// What bounds the /proc reads of fd tables (autoglm_fd_descriptions_*).
	r.Detail += fmt.Sprintf("; children of watched processes tracked from fork (task_newtask), their inherited fds from the parent's table; at most %d fds described from /proc a poll (daemon --fd-reads-per-poll), larger tables filled over several", DefaultReadsPerPoll)
	return []features.Result{r, python()}, true
}

// python says how Python frames are captured: inside the fd and cuda
// objects, so they load with those; only the per-thread state differs.
func python() features.Result {
	r := features.Result{Name: "view python (frames in fd and CUDA stacks)", OK: true, Detail: "per-thread state in task storage"}
	if !bpfobj.Probe().TaskStorage {
		r.Detail = "per-thread state in an LRU hash by thread id (no task storage)"
	}
	return r
}
