package deploy

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/open-autoglm/autoglm-ebpf/pkg/metrics"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// The dashboard's queries run over what pkg/metrics itself serves, as the
// daemon configures it (container granularity, classic run-queue buckets):
// a dashboard that sums by a label the code does not set, or reads a
// series it no longer serves, returns nothing and fails
// TestDashboardQueriesReturnData.

// Two agents. agent1 as a ServiceMonitor scrapes it, with the node label,
// and a cluster label as a Prometheus, Thanos or Mimir holding several
// clusters adds; agent2 as a plain scrape job does, with neither. other is
// another exporter on agent1's node: a query meant for the agent's own
// process_* or up series must leave it out.
const (
	agent1Labels = `cluster="gpu-east",instance="10.0.0.5:9464",job="autoglm-ebpf",node="gpu-node-1"`
	agent2Labels = `instance="10.0.0.6:9464",job="autoglm-ebpf"`
	otherLabels  = `cluster="gpu-east",instance="10.0.0.5:9100",job="node-exporter",node="gpu-node-1"`
	// agents is how many agents the data has.
	agents = 2
)

// seriesSteps is the number of 15 s steps the input series span (10
// minutes); the queries are evaluated at the last.
const seriesSteps = 40

var seriesT0 = time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)

// agent1Snapshots: a training pod on a GPU node. Its rank (pid 4242) leaks
// fds (an active fd_leak finding: series of its own) and allocation calls
// fail; a DataLoader worker of the same container is healthy (summed only;
// a finding of it ended);
// GPU 0 raises an XID and a double-bit ECC error halfway through.
func agent1Snapshots() (first, last *model.Snapshot) {
	at := func(sec int, scale uint64, late bool) *model.Snapshot {
		pod := model.Pod{Namespace: "ml", Name: "trainer-0", Container: "trainer",
			UID: "7d3c2a8e-0001-4000-8000-000000000001", ContainerID: strings.Repeat("4f1e", 16),
			Cgroup: "/kubepods/burstable/pod7d3c2a8e-0001-4000-8000-000000000001/" + strings.Repeat("4f1e", 16)}
		rank := process(4242, "trainer", pod, 100+int(scale)*40, scale)
		rank.CUDA = model.CUDAStats{
			LiveBytes: (1 + scale) << 30, AllocBytes: map[string]uint64{"cudaMalloc": (2 + scale) << 30},
			FreeBytes: map[string]uint64{"cudaFree": 1 << 30}, AllocCalls: map[string]uint64{"cudaMalloc": 40 * (1 + scale)},
			HasNVML: true, NVMLUsedBytes: (20 + scale) << 30, UntrackedBytes: 19 << 30,
			Libraries: []string{"/usr/lib/x86_64-linux-gnu/libcudart.so.12"},
			GPUUtil:   []model.GPUUtil{{Device: 0, UUID: "GPU-aaaa", SM: 0.8, Memory: 0.3, Source: model.UtilProcess}},
		}
		if late {
			rank.CUDA.FailedCalls = map[model.CUDAFailureKind]uint64{{API: "cudaMalloc", Error: "cudaErrorMemoryAllocation"}: 3}
		}
		worker := process(4250, "pt_data_worker", pod, 30, scale)
		s := &model.Snapshot{
			Time: seriesT0.Add(time.Duration(sec) * time.Second), Start: seriesT0,
			Processes: []*model.Process{rank, worker},
			Findings: []model.Finding{{
				Kind: model.KindFDLeak, PID: 4242, Comm: "trainer", Severity: model.SeverityWarning, Active: true,
				FirstSeen: seriesT0, LastSeen: seriesT0.Add(time.Duration(sec) * time.Second),
				Stack: []model.Frame{model.ParseFrame("__open64+0x51 (libc.so.6)"), model.ParseFrame("cache_tokenizer+0x1a (trainer)")},
			}, {
				// Ended: its series stays, at minus its severity.
				Kind: model.KindSocketLeak, PID: 4250, Comm: "pt_data_worker", Severity: model.SeverityWarning,
				FirstSeen: seriesT0, LastSeen: seriesT0,
				Stack: []model.Frame{model.ParseFrame("connect+0x10 (libc.so.6)"), model.ParseFrame("fetch_shard+0x2b (pt_data_worker)")},
			}},
			Lost: map[string]uint64{"stack": 10 * scale},
			GPUs: []model.GPU{{Index: 0, UUID: "GPU-aaaa", Name: "H100", MemoryUsed: (21 + scale) << 30, MemoryTotal: 80 << 30,
				Utilization: 0.6, MemoryUtilization: 0.3, PerProcessUtil: true,
				Processes: map[int]uint64{4242: (20 + scale) << 30, 4250: 512 << 20}}},
			GPUEventCounts: map[model.GPUEventKey]uint64{{Device: 0, UUID: "GPU-aaaa", Kind: model.GPUEventPState}: 2 + scale},
			Views:          map[string]model.ViewState{},
			BPFMemory:      map[string]uint64{"fd": 12 << 20, "sched": 4 << 20, "sock": 2 << 20, "cuda": 11 << 20, "stacks": 6 << 20},
			FDReads:        model.FDReads{PerPoll: 8192, Listings: 3 * scale, Described: 100 * scale},
		}
		for _, v := range model.Views {
			s.Views[v] = model.ViewState{}
		}
		if late {
			s.GPUXIDs = map[model.XIDKey]uint64{{Device: 0, UUID: "GPU-aaaa", XID: 79}: 1}
			s.GPUEventCounts[model.GPUEventKey{Device: 0, UUID: "GPU-aaaa", Kind: model.GPUEventXID}] = 1
			s.GPUEventCounts[model.GPUEventKey{Device: 0, UUID: "GPU-aaaa", Kind: model.GPUEventDoubleBitECC}] = 1
			s.TrackFailures = map[model.TrackFailure]uint64{{View: "sched", Reason: "ENOMEM"}: 1}
		}
		return s
	}
	return at(1, 0, false), at(600, 10, true)
}

// agent2Snapshots: a host without NVML (its view down) and a service
// outside Kubernetes, summed by its cgroup, using 70 % of its fd limit
// (series of its own without a finding).
func agent2Snapshots() (first, last *model.Snapshot) {
	at := func(sec int, scale uint64) *model.Snapshot {
		p := process(77, "nginx", model.Pod{Cgroup: "/system.slice/nginx.service"}, 700, scale)
		s := &model.Snapshot{
			Time: seriesT0.Add(time.Duration(sec) * time.Second), Start: seriesT0,
			Processes: []*model.Process{p},
			Lost:      map[string]uint64{"stack": 0},
			// A node without a GPU: nvml and cuda are absent, not down.
			Views: map[string]model.ViewState{
				"nvml": {Down: "NVML not found", Absent: model.AbsentNoGPU},
				"cuda": {Down: "no CUDA library", Absent: model.AbsentNoGPU},
			},
			BPFMemory: map[string]uint64{"fd": 12 << 20, "sched": 4 << 20, "sock": 2 << 20},
		}
		for _, v := range []string{"fd", "sched", "sock", "python"} {
			s.Views[v] = model.ViewState{}
		}
		return s
	}
	return at(1, 0), at(600, 10)
}

// process is a watched process whose counters grow with scale: fds by kind,
// context switches, run-queue waits and TCP sockets.
func process(pid int, comm string, pod model.Pod, open int, scale uint64) *model.Process {
	return &model.Process{
		PID: pid, Comm: comm, Pod: pod, Started: seriesT0,
		FD: model.FDStats{Open: open, Limit: 1024,
			Opened: map[string]uint64{"file": 10 + 40*scale, "socket": 5 + 4*scale},
			Closed: map[string]uint64{"file": 5 + 20*scale}},
		Sched: model.SchedStats{Voluntary: 500 * (1 + scale), Involuntary: 50 * (1 + scale), AllowedCPUs: 8,
			RunqLatency: model.Histogram{Bounds: []float64{0x1p-20, 0x1p-14, 0x1p-10}, Counts: []uint64{10 * (1 + scale), 5 * (1 + scale), 1 + scale}, Count: 17 * (1 + scale), Sum: 0.01 * float64(1+scale)}},
		Sock: model.SockStats{TCPByState: map[string]int{"ESTABLISHED": 5, "CLOSE_WAIT": 1 + 4*int(scale)}, ByKind: map[string]int{"tcp": 6 + 4*int(scale)}},
	}
}

// servedSeries returns 10 minutes of the series pkg/metrics serves for a
// daemon that sees first and then last, labelled with the agent's target
// labels: a series served at both grows linearly from the one to the
// other; one served only at last appears halfway (a counter's first
// events, as an XID's).
func servedSeries(t *testing.T, target string, first, last *model.Snapshot) []map[string]string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m := metrics.New(reg, "v0.1.0", metrics.Options{Pods: true, Granularity: metrics.PerContainer, RunqueueClassicBuckets: true})
	m.Update(first)
	before := gatherSeries(t, reg, target)
	m.Update(last)
	after := gatherSeries(t, reg, target)
	var out []map[string]string
	for _, s := range slices.Sorted(maps.Keys(after)) {
		b, seen := before[s]
		a := after[s]
		var values string
		switch {
		case !seen:
			values = fmt.Sprintf("_x%d %sx%d", seriesSteps/2, num(a), seriesSteps/2)
		case a >= b:
			values = fmt.Sprintf("%s+%sx%d", num(b), num((a-b)/seriesSteps), seriesSteps)
		default:
			values = fmt.Sprintf("%s-%sx%d", num(b), num((b-a)/seriesSteps), seriesSteps)
		}
		out = append(out, map[string]string{"series": s, "values": values})
	}
	return out
}

func num(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// gatherSeries returns what reg serves as Prometheus stores it, series by
// series (a classic histogram as its _bucket, _sum and _count), each with
// target's labels added. Only the agent's own series and its process_*
// series are kept: the go_* runtime series are not read by the dashboard.
func gatherSeries(t *testing.T, reg prometheus.Gatherer, target string) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		name := f.GetName()
		if !strings.HasPrefix(name, "autoglm_") && !strings.HasPrefix(name, "process_") {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				if l.GetValue() != "" { // as Prometheus stores an empty label: absent
					labels = append(labels, l.GetName()+"="+strconv.Quote(l.GetValue()))
				}
			}
			series := func(name string, v float64, extra ...string) {
				ls := append(slices.Clone(labels), extra...)
				ls = append(ls, target)
				out[name+"{"+strings.Join(ls, ",")+"}"] = v
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				series(name, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				series(name, m.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				series(name, m.GetUntyped().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				if len(h.GetBucket()) == 0 {
					continue // native only: promtool's input has no notation for it
				}
				for _, b := range h.GetBucket() {
					if !math.IsInf(b.GetUpperBound(), 1) {
						series(name+"_bucket", float64(b.GetCumulativeCount()), `le="`+num(b.GetUpperBound())+`"`)
					}
				}
				series(name+"_bucket", float64(h.GetSampleCount()), `le="+Inf"`)
				series(name+"_sum", h.GetSampleSum())
				series(name+"_count", float64(h.GetSampleCount()))
			}
		}
	}
	return out
}
