package offcpu

import (
	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/features"
)

// Check loads and attaches the object as a run does when it first suspects
// a straggling NCCL rank, and says whether the rank's threads' stacks can
// be taken. Not a view: nothing else depends on it.
func Check() features.Result {
	r := features.Result{Name: "NCCL straggler stacks (sched_switch, on demand)"}
	t, err := New(Config{})
	if err != nil {
		r.Detail = bpfobj.Summary(err)
		return r
	}
	defer t.Close()
	if why := t.Unavailable(); why != "" {
		r.Detail = "loads; no stacks: " + why
		return r
	}
	r.OK, r.Detail = true, t.obj.Mode
	return r
}
