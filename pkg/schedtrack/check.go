package schedtrack

import (
	"slices"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/features"
)

// Check loads and attaches the scheduler object as a run would, and
// reports what each sched event is traced with: tp_btf, or the classic
// tracepoint where tp_btf does not load or attach. None is required: a run
// without the sched view goes on with the others (the pipeline's views),
// so check's verdict does not hang on it either. up is whether the view
// loads.
func Check() (rs []features.Result, up bool) {
	t, err := New(Config{})
	if err != nil {
		return []features.Result{{Name: "view sched: sched_switch", Detail: bpfobj.Summary(err)}}, false
	}
	defer t.Close()
	how := "tp_btf"
	if t.Mode() == ModeTracepoint {
		how = "tracepoint (tp_btf unavailable: " + bpfobj.Summary(t.BTFError()) + ")"
	}
	for _, ev := range []string{"sched_switch", "sched_wakeup", "sched_wakeup_new"} {
		r := features.Result{Name: "view sched: " + ev, OK: true, Detail: how}
		if !slices.Contains(t.Events(), ev) {
			r.OK, r.Detail = false, "not traced with classic tracepoints: a new thread's first run-queue wait is missed"
		}
		rs = append(rs, r)
	}
	return rs, true
}
