package report

import (
	"bytes"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

func TestSchedFields(t *testing.T) {
	w, buf := toStdout()
	p := proc(100, "schedwork", 5, false)
	p.Sched = model.SchedStats{
		Voluntary: 900, Involuntary: 40,
		RunqLatency: model.Histogram{Bounds: []float64{0.001, 0.002, 0.004}, Counts: []uint64{90, 9, 1}, Count: 100},
	}
	idle := proc(200, "idle", 5, false) // no run-queue waits seen
	if err := w.Close(&model.Snapshot{Time: t0, Start: t0, Processes: []*model.Process{p, idle}}); err != nil {
		t.Fatal(err)
	}
	r := decode(t, buf.Bytes())
	got := r.Processes[0]
	if got.ContextSwitches != (ContextSwitches{Voluntary: 900, Involuntary: 40}) || got.RunqueueP99Seconds == nil || *got.RunqueueP99Seconds != 0.002 {
		t.Errorf("pid 100: switches %+v, p99 %v; want 900/40, 0.002", got.ContextSwitches, got.RunqueueP99Seconds)
	}
	if r.Processes[1].RunqueueP99Seconds != nil {
		t.Errorf("pid 200: p99 %v, want null", *r.Processes[1].RunqueueP99Seconds)
	}
	for _, key := range []string{`"context_switches": {`, `"voluntary": 900`, `"runqueue_p99_seconds": 0.002`, `"runqueue_p99_seconds": null`} {
		if !bytes.Contains(buf.Bytes(), []byte(key)) {
			t.Errorf("report lacks %s:\n%s", key, buf.Bytes())
		}
	}
}
