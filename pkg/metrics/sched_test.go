package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

func schedProc(pid int, comm string, vol, invol uint64, exited bool) *model.Process {
	p := proc(pid, comm, 10, 1, 0, exited)
	p.Sched = model.SchedStats{
		Voluntary: vol, Involuntary: invol, AllowedCPUs: 2,
		// Powers of two of a second, as the sched concern gives them:
		// 3 waits up to 2^-10 s, 1 in (2^-9, 2^-8], 2 over the last bound.
		RunqLatency: model.Histogram{Bounds: []float64{0x1p-10, 0x1p-9, 0x1p-8}, Counts: []uint64{3, 0, 1}, Count: 6, Sum: 0.5},
	}
	return p
}

func TestSchedValues(t *testing.T) {
	m, reg := newMetrics(t)
	plain := proc(200, "fdwork", 5, 1, 0, false) // not observed by the sched concern: no series
	m.Update(snap(1, []*model.Process{schedProc(100, "schedwork", 900, 40, false), plain}, nil, nil))
	// The text format shows a native histogram's count and sum only.
	want := `
# HELP autoglm_context_switches_total Context switches of the process's threads since attach, by type (voluntary: blocked; involuntary: preempted).
# TYPE autoglm_context_switches_total counter
autoglm_context_switches_total{comm="schedwork",pid="100",type="involuntary"} 40
autoglm_context_switches_total{comm="schedwork",pid="100",type="voluntary"} 900
# HELP autoglm_runqueue_latency_seconds Time the process's threads waited runnable for a CPU, from wake-up or preemption, since attach.
# TYPE autoglm_runqueue_latency_seconds histogram
autoglm_runqueue_latency_seconds_bucket{comm="schedwork",pid="100",le="+Inf"} 6
autoglm_runqueue_latency_seconds_sum{comm="schedwork",pid="100"} 0.5
autoglm_runqueue_latency_seconds_count{comm="schedwork",pid="100"} 6
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoglm_context_switches_total", "autoglm_runqueue_latency_seconds"); err != nil {
		t.Fatal(err)
	}
	h := runq(t, reg, "100")
	if h.GetSchema() != 0 || h.GetZeroThreshold() != 0x1p-10 || h.GetZeroCount() != 3 || len(h.GetBucket()) != 0 {
		t.Fatalf("native histogram %v", h)
	}
	// Bucket i of schema 0 holds (2^(i-1), 2^i]: the wait in (2^-9, 2^-8]
	// is in bucket -8, the two over 2^-8 s in the one above.
	if got := nativeBuckets(h); len(got) != 2 || got[-8] != 1 || got[-7] != 2 {
		t.Errorf("native buckets %v, want {-8: 1, -7: 2}", got)
	}
	if !h.GetCreatedTimestamp().AsTime().Equal(t0) {
		t.Errorf("created %v, want when watching began", h.GetCreatedTimestamp().AsTime())
	}
}

// With the option, a few classic buckets come with the native ones.
func TestSchedClassicBuckets(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg, "v1", Options{RunqueueClassicBuckets: true})
	p := schedProc(100, "schedwork", 900, 40, false)
	p.Sched.RunqLatency = model.Histogram{Bounds: []float64{0x1p-20, 0x1p-13, 0x1p-10, 0x1p-4}, Counts: []uint64{5, 2, 1, 1}, Count: 10, Sum: 1}
	m.Update(snap(1, []*model.Process{p}, nil, nil))
	want := `
# HELP autoglm_runqueue_latency_seconds Time the process's threads waited runnable for a CPU, from wake-up or preemption, since attach.
# TYPE autoglm_runqueue_latency_seconds histogram
autoglm_runqueue_latency_seconds_bucket{comm="schedwork",pid="100",le="0.0001220703125"} 7
autoglm_runqueue_latency_seconds_bucket{comm="schedwork",pid="100",le="0.0009765625"} 8
autoglm_runqueue_latency_seconds_bucket{comm="schedwork",pid="100",le="0.0078125"} 8
autoglm_runqueue_latency_seconds_bucket{comm="schedwork",pid="100",le="0.0625"} 9
autoglm_runqueue_latency_seconds_bucket{comm="schedwork",pid="100",le="0.5"} 9
autoglm_runqueue_latency_seconds_bucket{comm="schedwork",pid="100",le="+Inf"} 10
autoglm_runqueue_latency_seconds_sum{comm="schedwork",pid="100"} 1
autoglm_runqueue_latency_seconds_count{comm="schedwork",pid="100"} 10
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoglm_runqueue_latency_seconds"); err != nil {
		t.Fatal(err)
	}
	h := runq(t, reg, "100")
	if got := nativeBuckets(h); h.GetZeroCount() != 5 || len(got) != 4 || got[-13] != 2 || got[-10] != 1 || got[-4] != 1 || got[-3] != 1 {
		t.Errorf("native buckets %v zero %d", got, h.GetZeroCount())
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// runq returns the run-queue histogram of pid as gathered.
func runq(t *testing.T, g prometheus.Gatherer, pid string) *dto.Histogram {
	t.Helper()
	ms := matching(t, g, "autoglm_runqueue_latency_seconds", map[string]string{"pid": pid})
	if len(ms) != 1 {
		t.Fatalf("%d run-queue histograms for pid %s", len(ms), pid)
	}
	return ms[0].GetHistogram()
}

// nativeBuckets decodes the positive spans and deltas of h into counts by
// bucket index.
func nativeBuckets(h *dto.Histogram) map[int]int64 {
	out := map[int]int64{}
	idx, i := 0, 0
	var count int64
	for _, sp := range h.GetPositiveSpan() {
		idx += int(sp.GetOffset())
		for range sp.GetLength() {
			count += h.GetPositiveDelta()[i]
			if count != 0 {
				out[idx] = count
			}
			idx++
			i++
		}
	}
	return out
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
