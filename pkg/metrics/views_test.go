package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// A view up is 1, one down or loading 0; a view absent (not expected on
// this node) has no autoglm_view_up, which AutoglmViewDown reads, but
// autoglm_view_absent with its reason.
func TestViewSeries(t *testing.T) {
	m, reg := newMetrics(t)
	s := snap(1, nil, nil, nil)
	s.Views = map[string]model.ViewState{
		"fd": {}, "python": {},
		"sched": {Down: "loading"},
		"sock":  {Down: "loading sock BPF programs: refused"},
		"cuda":  {Down: "loading cuda BPF programs: map live_allocs: argument list too long", Absent: model.AbsentNoGPU},
		"nvml":  {Down: "NVML unavailable: libnvidia-ml.so.1 not found", Absent: model.AbsentNoNVML},
	}
	m.Update(s)
	want := `
# HELP autoglm_view_absent 1 for a view that does not run because it is not expected on this node, which is no fault; it has no autoglm_view_up. reason: no_gpu (the node has no NVIDIA GPU), no_nvml (NVML was not given to the agent: no libnvidia-ml or no GPU device nodes in its container).
# TYPE autoglm_view_absent gauge
autoglm_view_absent{reason="no_gpu",view="cuda"} 1
autoglm_view_absent{reason="no_nvml",view="nvml"} 1
# HELP autoglm_view_up 1 when the view runs, 0 when it is down (failed to load, or still loading): fd, sched, sock, cuda, nccl, python, nvml. The log says why. A view not expected on this node has autoglm_view_absent instead.
# TYPE autoglm_view_up gauge
autoglm_view_up{view="fd"} 1
autoglm_view_up{view="python"} 1
autoglm_view_up{view="sched"} 0
autoglm_view_up{view="sock"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoglm_view_up", "autoglm_view_absent"); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.CollectAndLint(collector{m}, "autoglm_view_up", "autoglm_view_absent")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
