package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

func schedProc(pid int, comm string, vol, invol uint64, exited bool) *model.Process {
	p := proc(pid, comm, 10, 1, 0, exited)
	p.Sched = model.SchedStats{
		Voluntary: vol, Involuntary: invol, AllowedCPUs: 2,
		// 3 waits under 1 ms, 1 under 4 ms, 2 over the last bound.
		RunqLatency: model.Histogram{Bounds: []float64{0.001, 0.002, 0.004}, Counts: []uint64{3, 0, 1}, Count: 6, Sum: 0.5},
	}
	return p
}

func TestSchedValues(t *testing.T) {
	m, reg := newMetrics(t)
	plain := proc(200, "fdwork", 5, 1, 0, false) // not observed by the sched concern: no series
	m.Update(snap(1, []*model.Process{schedProc(100, "schedwork", 900, 40, false), plain}, nil, nil))
	want := `
# HELP autoglm_context_switches_total Context switches of the process's threads since attach, by type (voluntary: blocked; involuntary: preempted).
# TYPE autoglm_context_switches_total counter
autoglm_context_switches_total{comm="schedwork",pid="100",type="involuntary"} 40
autoglm_context_switches_total{comm="schedwork",pid="100",type="voluntary"} 900
# HELP autoglm_runqueue_latency_seconds Time the process's threads waited runnable for a CPU, from wake-up or preemption, since attach.
# TYPE autoglm_runqueue_latency_seconds histogram
autoglm_runqueue_latency_seconds_bucket{comm="schedwork",pid="100",le="0.001"} 3
autoglm_runqueue_latency_seconds_bucket{comm="schedwork",pid="100",le="0.002"} 3
autoglm_runqueue_latency_seconds_bucket{comm="schedwork",pid="100",le="0.004"} 4
autoglm_runqueue_latency_seconds_bucket{comm="schedwork",pid="100",le="+Inf"} 6
autoglm_runqueue_latency_seconds_sum{comm="schedwork",pid="100"} 0.5
autoglm_runqueue_latency_seconds_count{comm="schedwork",pid="100"} 6
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoglm_context_switches_total", "autoglm_runqueue_latency_seconds"); err != nil {
		t.Fatal(err)
	}
}

func TestSchedExitedAndMonotonic(t *testing.T) {
	m, reg := newMetrics(t)
	vol := func() float64 {
		v, _ := value(t, reg, "autoglm_context_switches_total", map[string]string{"pid": "100", "type": "voluntary"})
		return v
	}
	m.Update(snap(1, []*model.Process{schedProc(100, "schedwork", 900, 40, false)}, nil, nil))
	// A smaller value from the source must not read as a counter reset.
	m.Update(snap(2, []*model.Process{schedProc(100, "schedwork", 800, 40, false)}, nil, nil))
	if v := vol(); v != 900 {
		t.Errorf("voluntary after a smaller sample = %v, want 900", v)
	}
	// The exiting process's last snapshot is served, then dropped.
	m.Update(snap(3, []*model.Process{schedProc(100, "schedwork", 950, 41, true)}, nil, nil))
	if v := vol(); v != 950 {
		t.Errorf("voluntary in the exit snapshot = %v, want 950", v)
	}
	m.Update(snap(4, nil, nil, nil))
	for _, name := range []string{"autoglm_context_switches_total", "autoglm_runqueue_latency_seconds"} {
		if n := count(t, reg, name, map[string]string{"pid": "100"}); n != 0 {
			t.Errorf("%s{pid=100}: %d series after exit", name, n)
		}
	}
	// A reused pid starts from its own counts.
	m.Update(snap(5, []*model.Process{schedProc(100, "other", 7, 0, false)}, nil, nil))
	if v := vol(); v != 7 {
		t.Errorf("voluntary of the reused pid = %v, want 7", v)
	}
}

func TestSchedLint(t *testing.T) {
	m, _ := newMetrics(t)
	m.Update(snap(1, []*model.Process{schedProc(100, "sched\xffwork", 900, 40, false)}, nil, nil))
	problems, err := testutil.CollectAndLint(collector{m}, "autoglm_context_switches_total", "autoglm_runqueue_latency_seconds")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	if n := testutil.CollectAndCount(collector{m}, "autoglm_runqueue_latency_seconds"); n != 1 {
		t.Errorf("runqueue histograms = %d, want 1", n)
	}
}
