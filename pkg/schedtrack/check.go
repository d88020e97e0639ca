package features

import (
	"slices"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/schedtrack"
)

// sched loads and attaches the scheduler object as a run would, and reports
// what each sched event is traced with: tp_btf, or the classic tracepoint
// where tp_btf does not load or attach. None is required: a run without
// the sched view goes on with the others (the pipeline's views), so
// check's verdict does not hang on it either.
func sched() []Result {
	t, err := schedtrack.New(schedtrack.Config{})
	if err != nil {
		return []Result{{Name: "view sched: sched_switch", Detail: bpfobj.Summary(err)}}
	}
	defer t.Close()
	how := "tp_btf"
	if t.Mode() == schedtrack.ModeTracepoint {
		how = "tracepoint (tp_btf unavailable: " + bpfobj.Summary(t.BTFError()) + ")"
	}
	var rs []Result
	for _, ev := range []string{"sched_switch", "sched_wakeup", "sched_wakeup_new"} {
		r := Result{Name: "view sched: " + ev, OK: true, Detail: how}
		if !slices.Contains(t.Events(), ev) {
			r.OK, r.Detail = false, "not traced with classic tracepoints: a new thread's first run-queue wait is missed"
		}
		rs = append(rs, r)
	}
	return rs
}
