package metrics

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

func containerMetrics(t *testing.T) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	return New(reg, "v1", Options{Pods: true, Granularity: PerContainer, Hold: time.Minute}), reg
}

// inPod puts p in container c of pod ns/pod (the pod's UID and container
// id made from their names).
func inPod(p *model.Process, ns, pod, c string) *model.Process {
	p.Pod = model.Pod{Namespace: ns, Name: pod, Container: c,
		UID: fmt.Sprintf("%08x-0000-4000-8000-000000000000", len(pod)), ContainerID: strings.Repeat(c[:1], 64),
		Cgroup: "/kubepods/pod/" + c}
	return p
}

// series counts every series gathered from g as Prometheus stores them.
func series(t *testing.T, g prometheus.Gatherer) int {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if h := m.GetHistogram(); h != nil && len(h.GetBucket()) > 0 {
				n += len(h.GetBucket()) + 3
			} else {
				n++
			}
		}
	}
	return n
}

// A container's processes of one comm are summed into one set of series
// without pid; a healthy process adds none of its own.
func TestContainerSums(t *testing.T) {
	m, reg := containerMetrics(t)
	a := inPod(schedProc(100, "python", 900, 40, false), "ml", "train-0", "trainer")
	b := inPod(schedProc(101, "python", 100, 10, false), "ml", "train-0", "trainer")
	w := inPod(proc(102, "pt_data_worker", 3, 7, 4, false), "ml", "train-0", "trainer")
	m.Update(snap(1, []*model.Process{a, w}, nil, nil))
	before := series(t, reg)
	m.Update(snap(2, []*model.Process{a, b, w}, nil, nil))
	if after := series(t, reg); after != before {
		t.Errorf("a second healthy process took the series from %d to %d", before, after)
	}
	want := `
# HELP autoglm_container_open_fds Summed over the watched processes of a container (outside a pod, a cgroup) with this comm, those gone included for counters: Live file descriptors of the process.
# TYPE autoglm_container_open_fds gauge
autoglm_container_open_fds{cgroup="",comm="pt_data_worker",container="trainer",namespace="ml",pod="train-0"} 3
autoglm_container_open_fds{cgroup="",comm="python",container="trainer",namespace="ml",pod="train-0"} 20
# HELP autoglm_container_context_switches_total Summed over the watched processes of a container (outside a pod, a cgroup) with this comm, those gone included for counters: Context switches of the process's threads since attach, by type (voluntary: blocked; involuntary: preempted).
# TYPE autoglm_container_context_switches_total counter
autoglm_container_context_switches_total{cgroup="",comm="python",container="trainer",namespace="ml",pod="train-0",type="involuntary"} 50
autoglm_container_context_switches_total{cgroup="",comm="python",container="trainer",namespace="ml",pod="train-0",type="voluntary"} 1000
# HELP autoglm_container_processes Watched processes of a container (outside a pod, a cgroup) with this comm.
# TYPE autoglm_container_processes gauge
autoglm_container_processes{cgroup="",comm="pt_data_worker",container="trainer",namespace="ml",pod="train-0"} 1
autoglm_container_processes{cgroup="",comm="python",container="trainer",namespace="ml",pod="train-0"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoglm_container_open_fds", "autoglm_container_context_switches_total", "autoglm_container_processes"); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"autoglm_open_fds", "autoglm_context_switches_total", "autoglm_fd_limit", "autoglm_container_fd_limit"} {
		if n := count(t, reg, name, nil); n != 0 {
			t.Errorf("%d %s series for healthy processes", n, name)
		}
	}
	// The run-queue histograms are merged: 6 waits each.
	h := matching(t, reg, "autoglm_container_runqueue_latency_seconds", map[string]string{"comm": "python"})
	if len(h) != 1 || h[0].GetHistogram().GetSampleCount() != 12 {
		t.Fatalf("merged run-queue histogram: %v", h)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

// A container's counters and histograms never go down when one of its
// processes exits, nor when its last one restarts within the hold.
func TestContainerCountersSurviveExit(t *testing.T) {
	m, reg := containerMetrics(t)
	unit := map[string]string{"comm": "python", "type": "voluntary"}
	a := inPod(schedProc(100, "python", 900, 40, false), "ml", "serve", "model")
	b := inPod(schedProc(101, "python", 100, 10, false), "ml", "serve", "model")
	m.Update(snap(1, []*model.Process{a, b}, nil, nil))
	gone := inPod(schedProc(101, "python", 150, 10, true), "ml", "serve", "model")
	m.Update(snap(2, []*model.Process{a, gone}, nil, nil))
	m.Update(snap(3, []*model.Process{a, gone}, nil, nil)) // the pipeline lists it after its exit
	if v, _ := value(t, reg, "autoglm_container_context_switches_total", unit); v != 1050 {
		t.Errorf("after an exit the container counts %v voluntary switches, want 1050", v)
	}
	if v, _ := value(t, reg, "autoglm_container_processes", map[string]string{"comm": "python"}); v != 1 {
		t.Errorf("%v processes after an exit, want 1", v)
	}
	h := matching(t, reg, "autoglm_container_runqueue_latency_seconds", map[string]string{"comm": "python"})
	if len(h) != 1 || h[0].GetHistogram().GetSampleCount() != 12 {
		t.Fatalf("run-queue histogram after an exit: %v", h)
	}
	// The container restarts: its new process goes on from there.
	m.Update(snap(4, nil, nil, nil))
	if n := count(t, reg, "autoglm_container_processes", nil); n != 0 {
		t.Errorf("an empty container still has %d series", n)
	}
	again := inPod(schedProc(300, "python", 5, 1, false), "ml", "serve", "model")
	m.Update(snap(30, []*model.Process{again}, nil, nil))
	if v, _ := value(t, reg, "autoglm_container_context_switches_total", unit); v != 1055 {
		t.Errorf("after a restart the container counts %v voluntary switches, want 1055", v)
	}
	// After the hold it is a new container.
	m.Update(snap(31, nil, nil, nil))
	m.Update(snap(200, []*model.Process{inPod(schedProc(301, "python", 5, 1, false), "ml", "serve", "model")}, nil, nil))
	if v, _ := value(t, reg, "autoglm_container_context_switches_total", unit); v != 5 {
		t.Errorf("long after its last process the container counts %v voluntary switches, want 5", v)
	}
}

// A process moves to its pod's container once the API server names it:
// neither unit's counter goes down.
func TestContainerNamedLater(t *testing.T) {
	m, reg := containerMetrics(t)
	p := schedProc(100, "python", 900, 40, false)
	p.Pod = model.Pod{UID: "x", Cgroup: "/kubepods/podx/c"}
	m.Update(snap(1, []*model.Process{p}, nil, nil))
	if v, _ := value(t, reg, "autoglm_container_context_switches_total", map[string]string{"cgroup": "/kubepods/podx/c", "type": "voluntary"}); v != 900 {
		t.Fatalf("unnamed: %v voluntary switches", v)
	}
	named := inPod(schedProc(100, "python", 950, 40, false), "ml", "serve", "model")
	m.Update(snap(2, []*model.Process{named}, nil, nil))
	if v, _ := value(t, reg, "autoglm_container_context_switches_total", map[string]string{"pod": "serve", "type": "voluntary"}); v != 950 {
		t.Errorf("named: %v voluntary switches, want 950", v)
	}
	if n := count(t, reg, "autoglm_container_processes", map[string]string{"cgroup": "/kubepods/podx/c"}); n != 0 {
		t.Errorf("the unnamed unit still has a series")
	}
}

// Outside a pod a process's cgroup is its unit.
func TestCgroupUnit(t *testing.T) {
	m, reg := containerMetrics(t)
	a := proc(100, "srun", 4, 4, 0, false)
	a.Pod.Cgroup = "/slurm/uid_1000/job_42/step_0"
	b := proc(101, "srun", 6, 6, 0, false)
	b.Pod.Cgroup = "/slurm/uid_1000/job_42/step_0"
	c := proc(102, "srun", 1, 1, 0, false)
	c.Pod.Cgroup = "/system.slice/other.service"
	m.Update(snap(1, []*model.Process{a, b, c}, nil, nil))
	if v, _ := value(t, reg, "autoglm_container_open_fds", map[string]string{"cgroup": "/slurm/uid_1000/job_42/step_0"}); v != 10 {
		t.Errorf("job step: %v open fds, want 10", v)
	}
	if v, _ := value(t, reg, "autoglm_container_open_fds", map[string]string{"cgroup": "/system.slice/other.service"}); v != 1 {
		t.Errorf("service: %v open fds, want 1", v)
	}
	if n := count(t, reg, "autoglm_container_info", nil); n != 0 {
		t.Errorf("%d info series outside pods", n)
	}
}

// A process has series of its own while a finding of it is active or it
// holds half of a limit, and for the hold after; its container's sums go
// on including it.
func TestInterestingProcesses(t *testing.T) {
	m, reg := containerMetrics(t)
	leaky := inPod(proc(100, "python", 40, 40, 0, false), "ml", "serve", "model")
	full := inPod(proc(101, "python", 600, 600, 0, false), "ml", "serve", "model") // of 1024
	onGPU := inPod(proc(102, "python", 5, 5, 0, false), "ml", "serve", "model")
	healthy := inPod(proc(103, "python", 5, 5, 0, false), "ml", "serve", "model")
	procs := []*model.Process{leaky, full, onGPU, healthy}
	gpu := []model.GPU{{Index: 0, UUID: "GPU-0", MemoryTotal: 80 << 30, Processes: map[int]uint64{102: 41 << 30, 103: 1 << 30}}}
	s := snap(1, procs, []model.Finding{finding(100, "python", true)}, nil)
	s.GPUs = gpu
	m.Update(s)
	for pid, want := range map[string]bool{"100": true, "101": true, "102": true, "103": false} {
		if has := count(t, reg, "autoglm_open_fds", map[string]string{"pid": pid}) == 1; has != want {
			t.Errorf("pid %s has series of its own: %v, want %v", pid, has, want)
		}
	}
	if v, _ := value(t, reg, "autoglm_container_open_fds", map[string]string{"comm": "python"}); v != 650 {
		t.Errorf("the container's sum is %v, want 650 (its interesting processes included)", v)
	}
	if v, _ := value(t, reg, "autoglm_container_gpu_memory_used_bytes", map[string]string{"gpu": "0"}); v != 42<<30 {
		t.Errorf("the container's GPU memory is %v, want 42 GiB", v)
	}
	if count(t, reg, "autoglm_gpu_process_memory_used_bytes", map[string]string{"pid": "103"}) != 0 ||
		count(t, reg, "autoglm_gpu_process_memory_used_bytes", map[string]string{"pid": "102"}) != 1 {
		t.Error("NVML's per-process series are not those of the interesting processes only")
	}
	// The finding ends: the process keeps its series for the hold.
	s = snap(30, procs, []model.Finding{finding(100, "python", false)}, nil)
	s.GPUs = gpu
	m.Update(s)
	if count(t, reg, "autoglm_open_fds", map[string]string{"pid": "100"}) != 1 {
		t.Error("pid 100 lost its series within the hold")
	}
	s = snap(62, procs, []model.Finding{finding(100, "python", false)}, nil)
	s.GPUs = gpu
	m.Update(s)
	if count(t, reg, "autoglm_open_fds", map[string]string{"pid": "100"}) != 0 {
		t.Error("pid 100 kept its series after the hold")
	}
	// Its ended finding stays until the process exits, as it does per process.
	if v, ok := value(t, reg, "autoglm_finding", map[string]string{"pid": "100"}); !ok || v != -2 {
		t.Errorf("ended finding: %v %v", v, ok)
	}
	if count(t, reg, "autoglm_open_fds", map[string]string{"pid": "101"}) != 1 {
		t.Error("pid 101, at 59 % of its fd limit, lost its series")
	}
}

// The series budget: at the daemon's default cap of 256 processes, 32
// containers of 8 processes each with 5 of them leaking, the node serves
// at most 1 500 series. The processes are the richest this tool sees
// without a GPU: fds of three kinds, TCP sockets in two states, context
// switches and the run-queue histogram with classic buckets; the first of
// 8 containers (a node's 8 GPUs) also uses CUDA: allocations, host waits
// on the GPU and kernel launches (--launches).
func TestSeriesBudget(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg, "v1", Options{Pods: true, Granularity: PerContainer, RunqueueClassicBuckets: true})
	var procs []*model.Process
	var findings []model.Finding
	for c := range 32 {
		for i := range 8 {
			pid := 1000 + 8*c + i
			p := inPod(schedProc(pid, "python", 900, 40, false), "ml", fmt.Sprintf("job-%d", c), fmt.Sprintf("c%d", c))
			p.FD.Opened = map[string]uint64{"file": 80, "socket": 500, "pipe": 2}
			p.FD.Closed = map[string]uint64{"file": 70, "socket": 480}
			p.FD.Failed = map[string]uint64{"EMFILE": 0, "ENFILE": 0}
			p.Sock = model.SockStats{TCPByState: map[string]int{"LISTEN": 1, "ESTABLISHED": 19},
				ByKind: map[string]int{"tcp": 20, "udp": 0, "unix": 2, "other": 0}}
			if c < 8 && i == 0 {
				p.CUDA = waitsProc(pid, true).CUDA
			}
			procs = append(procs, p)
			if c < 5 && i == 0 {
				findings = append(findings, finding(pid, "python", true))
			}
		}
	}
	m.Update(snap(1, procs, findings, nil))
	n := series(t, reg)
	t.Logf("%d series for 256 processes in 32 containers, 5 of them with a finding", n)
	if n > 1500 {
		t.Errorf("%d series, over the budget of 1 500", n)
	}
}

// An escalating finding stays one series: its value is its severity, and
// minus that once it ended.
func TestFindingEscalates(t *testing.T) {
	m, reg := containerMetrics(t)
	p := inPod(proc(100, "python", 40, 40, 0, false), "ml", "serve", "model")
	f := finding(100, "python", true)
	for i, step := range []struct {
		severity string
		active   bool
		want     float64
	}{{model.SeverityWarning, true, 2}, {model.SeverityCritical, true, 3}, {model.SeverityCritical, false, -3}} {
		f.Severity, f.Active = step.severity, step.active
		m.Update(snap(i+1, []*model.Process{p}, []model.Finding{f}, nil))
		ms := matching(t, reg, "autoglm_finding", nil)
		if len(ms) != 1 || ms[0].GetGauge().GetValue() != step.want {
			t.Fatalf("%s, active %v: series %v, want one of value %v", step.severity, step.active, ms, step.want)
		}
	}
}
