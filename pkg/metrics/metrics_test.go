package metrics

import (
	"fmt"
	"io"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func proc(pid int, comm string, open int, opened, closed uint64, exited bool) *model.Process {
	return &model.Process{
		PID: pid, Comm: comm, Started: t0, Exited: exited,
		FD: model.FDStats{
			Open: open, Limit: 1024,
			Opened: map[string]uint64{"file": opened},
			Closed: map[string]uint64{"file": closed},
		},
	}
}

func snap(sec int, procs []*model.Process, findings []model.Finding, lost map[string]uint64) *model.Snapshot {
	return &model.Snapshot{
		Time: t0.Add(time.Duration(sec) * time.Second), Start: t0, Targets: []int{100},
		Processes: procs, Findings: findings, Lost: lost,
	}
}

func finding(pid int, comm string, active bool) model.Finding {
	return model.Finding{
		Kind: model.KindFDLeak, PID: pid, Comm: comm, Severity: model.SeverityWarning,
		FirstSeen: t0.Add(time.Second), LastSeen: t0.Add(2 * time.Second), Active: active,
		Summary: "open fds grew", Stack: []model.Frame{model.ParseFrame("__open64+0x51 (libc.so.6)"), model.ParseFrame("main.leak+0x1a (fdwork)")},
	}
}

func newMetrics(t *testing.T) (*Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	return New(reg, "v1.2.3"), reg
}

func TestValues(t *testing.T) {
	m, reg := newMetrics(t)
	s := snap(1,
		[]*model.Process{proc(100, "fdwork", 57, 80, 23, false)},
		[]model.Finding{finding(100, "fdwork", true)},
		map[string]uint64{"fd_events": 3})
	s.Refused = map[string]uint64{"symbolize": 2, "python": 0}
	m.Update(s)

	want := `
# HELP autoglm_open_fds Live file descriptors of the process.
# TYPE autoglm_open_fds gauge
autoglm_open_fds{comm="fdwork",pid="100"} 57
# HELP autoglm_fd_limit Soft RLIMIT_NOFILE of the process.
# TYPE autoglm_fd_limit gauge
autoglm_fd_limit{comm="fdwork",pid="100"} 1024
# HELP autoglm_fds_opened_total File descriptors created since attach, by kind.
# TYPE autoglm_fds_opened_total counter
autoglm_fds_opened_total{comm="fdwork",kind="file",pid="100"} 80
# HELP autoglm_fds_closed_total File descriptors released since attach, by kind.
# TYPE autoglm_fds_closed_total counter
autoglm_fds_closed_total{comm="fdwork",kind="file",pid="100"} 23
# HELP autoglm_finding A finding's severity while it is active (1 info, 2 warning, 3 critical), and once it no longer holds, minus the severity it ended with; site is the function at the finding's call site. The severity is the value, not a label, so that an escalating finding stays one series.
# TYPE autoglm_finding gauge
autoglm_finding{comm="fdwork",kind="fd_leak",pid="100",site="main.leak"} 2
# HELP autoglm_bpf_events_lost_total Lost BPF events and failed map updates, by source.
# TYPE autoglm_bpf_events_lost_total counter
autoglm_bpf_events_lost_total{source="fd_events"} 3
# HELP autoglm_inputs_refused_total What watched processes presented over a parser's bounds and was not read, by parser: symbolize (a mapped file's symbol table over 64 MiB, a name over 64 KiB, a call-frame program malformed or nested too deep, line tables over their bound), python (a code object's name, file name or line table over its bound). Their frames are left unsymbolized; not losses: any process can make them.
# TYPE autoglm_inputs_refused_total counter
autoglm_inputs_refused_total{parser="python"} 0
autoglm_inputs_refused_total{parser="symbolize"} 2
# HELP autoglm_build_info Always 1; labelled with the version of autoglm-ebpf, the VCS revision it was built from, and the Go version and architecture it was built with.
# TYPE autoglm_build_info gauge
autoglm_build_info{goarch="` + runtime.GOARCH + `",goversion="` + runtime.Version() + `",revision="` + Revision() + `",version="v1.2.3"} 1
`
	names := []string{"autoglm_open_fds", "autoglm_fd_limit", "autoglm_fds_opened_total", "autoglm_fds_closed_total",
		"autoglm_finding", "autoglm_bpf_events_lost_total", "autoglm_inputs_refused_total", "autoglm_build_info"}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
}

func TestFindingsTotal(t *testing.T) {
	m, reg := newMetrics(t)
	// Every kind exists before any finding.
	if n := testutil.CollectAndCount(collector{m}, "autoglm_findings_total"); n != len(model.Kinds) {
		t.Fatalf("findings_total series = %d, want %d", n, len(model.Kinds))
	}
	f := finding(100, "fdwork", true)
	second := f
	second.FirstSeen = t0.Add(10 * time.Second)
	inactive := finding(100, "fdwork", false)
	inactive.Kind = model.KindSocketLeak

	p := []*model.Process{proc(100, "fdwork", 57, 80, 23, false)}
	m.Update(snap(1, p, []model.Finding{f, inactive}, nil))
	m.Update(snap(2, p, []model.Finding{f, inactive}, nil)) // same finding again: not counted twice
	f.Active = false
	m.Update(snap(3, p, []model.Finding{f, second, inactive}, nil))

	// Every kind has its series, 0 but for the two fd leaks.
	want := `
# HELP autoglm_findings_total Distinct findings that became active, by kind; those explained by another finding are not counted.
# TYPE autoglm_findings_total counter
`
	for _, k := range slices.Sorted(slices.Values(model.Kinds)) {
		n := 0
		if k == model.KindFDLeak {
			n = 2
		}
		want += fmt.Sprintf("autoglm_findings_total{kind=%q} %d\n", k, n)
	}
	want += `# HELP autoglm_finding A finding's severity while it is active (1 info, 2 warning, 3 critical), and once it no longer holds, minus the severity it ended with; site is the function at the finding's call site. The severity is the value, not a label, so that an escalating finding stays one series.
# TYPE autoglm_finding gauge
autoglm_finding{comm="fdwork",kind="fd_leak",pid="100",site="main.leak"} 2
autoglm_finding{comm="fdwork",kind="socket_leak",pid="100",site="main.leak"} -2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoglm_findings_total", "autoglm_finding"); err != nil {
		t.Fatal(err)
	}

	// Once the only active one ends, the shared series reads minus its
	// severity.
	second.Active = false
	m.Update(snap(4, p, []model.Finding{f, second, inactive}, nil))
	if v, ok := value(t, reg, "autoglm_finding", map[string]string{"kind": "fd_leak", "pid": "100"}); !ok || v != -2 {
		t.Errorf("autoglm_finding fd_leak = %v (present %v), want -2", v, ok)
	}
	if v, _ := value(t, reg, "autoglm_findings_total", map[string]string{"kind": "fd_leak"}); v != 2 {
		t.Errorf("findings_total fd_leak = %v after both ended, want 2", v)
	}
}

func TestExitedProcessSeriesDeleted(t *testing.T) {
	m, reg := newMetrics(t)
	alive := proc(100, "fdwork", 57, 80, 23, false)
	m.Update(snap(1,
		[]*model.Process{alive, proc(200, "sockwork", 5, 9, 4, false)},
		[]model.Finding{finding(100, "fdwork", true), finding(200, "sockwork", true)}, nil))

	// pid 200 exits: its last snapshot is still served.
	findings := []model.Finding{finding(100, "fdwork", true), finding(200, "sockwork", false)}
	m.Update(snap(2, []*model.Process{alive, proc(200, "sockwork", 3, 9, 6, true)}, findings, nil))
	if v, ok := value(t, reg, "autoglm_open_fds", map[string]string{"pid": "200"}); !ok || v != 3 {
		t.Fatalf("open_fds of the exiting process = %v (present %v), want 3", v, ok)
	}
	if _, ok := value(t, reg, "autoglm_finding", map[string]string{"pid": "200"}); !ok {
		t.Fatal("finding of the exiting process missing in its last snapshot")
	}

	// Afterwards every series of pid 200 is gone, although the snapshot
	// still lists its finding; pid 100 is untouched.
	m.Update(snap(3, []*model.Process{alive}, findings, nil))
	for _, name := range []string{"autoglm_open_fds", "autoglm_fd_limit", "autoglm_fds_opened_total", "autoglm_fds_closed_total", "autoglm_finding"} {
		if _, ok := value(t, reg, name, map[string]string{"pid": "200"}); ok {
			t.Errorf("%s{pid=200} still exported after exit", name)
		}
		if _, ok := value(t, reg, name, map[string]string{"pid": "100"}); !ok {
			t.Errorf("%s{pid=100} missing", name)
		}
	}

	// A reused pid is a new process: its counters start from its own
	// counts, and its findings (newer than the exit) are exported.
	reused := finding(200, "other", true)
	reused.FirstSeen = t0.Add(4 * time.Second)
	m.Update(snap(4, []*model.Process{alive, proc(200, "other", 2, 1, 0, false)}, append(findings, reused), nil))
	if v, _ := value(t, reg, "autoglm_fds_opened_total", map[string]string{"pid": "200"}); v != 1 {
		t.Errorf("opened_total of the reused pid = %v, want 1", v)
	}
	if n := count(t, reg, "autoglm_finding", map[string]string{"pid": "200"}); n != 1 {
		t.Errorf("finding series of the reused pid = %d, want 1", n)
	}
}

func TestCountersMonotonic(t *testing.T) {
	m, reg := newMetrics(t)
	for i, c := range []struct {
		opened, lost, wantOpened, wantLost uint64
	}{
		{opened: 10, lost: 1, wantOpened: 10, wantLost: 1},
		{opened: 15, lost: 4, wantOpened: 15, wantLost: 4},
		// A smaller value from a source must not read as a reset.
		{opened: 12, lost: 2, wantOpened: 15, wantLost: 4},
		{opened: 20, lost: 5, wantOpened: 20, wantLost: 5},
	} {
		m.Update(snap(i, []*model.Process{proc(100, "fdwork", 1, c.opened, 0, false)}, nil, map[string]uint64{"fd_events": c.lost}))
		if v, _ := value(t, reg, "autoglm_fds_opened_total", map[string]string{"pid": "100"}); v != float64(c.wantOpened) {
			t.Errorf("step %d: opened_total = %v, want %d", i, v, c.wantOpened)
		}
		if v, _ := value(t, reg, "autoglm_bpf_events_lost_total", map[string]string{"source": "fd_events"}); v != float64(c.wantLost) {
			t.Errorf("step %d: lost_total = %v, want %d", i, v, c.wantLost)
		}
	}
	// A source missing from a later snapshot keeps its count.
	m.Update(snap(9, nil, nil, nil))
	if v, _ := value(t, reg, "autoglm_bpf_events_lost_total", map[string]string{"source": "fd_events"}); v != 5 {
		t.Errorf("lost_total after the source went quiet = %v, want 5", v)
	}
}

func TestLint(t *testing.T) {
	m, _ := newMetrics(t)
	// The invalid byte in comm must not make the metric unexportable.
	m.Update(snap(1,
		[]*model.Process{proc(100, "fd\xffwork", 57, 80, 23, false)},
		[]model.Finding{finding(100, "fdwork", true)},
		map[string]uint64{"fd_events": 3}))
	problems, err := testutil.CollectAndLint(collector{m})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// Socket gauges: the TCP states a process the socket concern filled holds
// sockets in, every socket kind (zeros included), none for a process it did
// not fill, and gone after the process exits.
func TestSocketSeries(t *testing.T) {
	m, reg := newMetrics(t)
	sock := proc(100, "sock\xffwork", 9, 9, 0, false)
	sock.Sock = model.SockStats{
		TCPByState: map[string]int{"LISTEN": 1, "CLOSE_WAIT": 7},
		ByKind:     map[string]int{"tcp": 8, "udp": 1, "unix": 2, "other": 0},
	}
	m.Update(snap(1, []*model.Process{sock, proc(200, "fdwork", 3, 3, 0, false)}, nil, nil))
	for state, want := range map[string]float64{"CLOSE_WAIT": 7, "LISTEN": 1} {
		if v, ok := value(t, reg, "autoglm_sockets", map[string]string{"pid": "100", "state": state}); !ok || v != want {
			t.Errorf("autoglm_sockets{state=%s} = %v (present %v), want %v", state, v, ok, want)
		}
	}
	if n := count(t, reg, "autoglm_sockets", map[string]string{"pid": "100"}); n != 2 {
		t.Errorf("%d state series, want 2: one per state with sockets", n)
	}
	// The state emptied goes; the others stay.
	sock.Sock.TCPByState = map[string]int{"LISTEN": 1, "CLOSE_WAIT": 0}
	m.Update(snap(1, []*model.Process{sock, proc(200, "fdwork", 3, 3, 0, false)}, nil, nil))
	if _, ok := value(t, reg, "autoglm_sockets", map[string]string{"pid": "100", "state": "CLOSE_WAIT"}); ok {
		t.Error("CLOSE_WAIT still exported with no socket in it")
	}
	if n := count(t, reg, "autoglm_sockets", map[string]string{"pid": "100"}); n != 1 {
		t.Errorf("%d state series, want 1", n)
	}
	for kind, want := range map[string]float64{"tcp": 8, "udp": 1, "unix": 2, "other": 0} {
		if v, ok := value(t, reg, "autoglm_socket_fds", map[string]string{"pid": "100", "kind": kind}); !ok || v != want {
			t.Errorf("autoglm_socket_fds{kind=%s} = %v (present %v), want %v", kind, v, ok, want)
		}
	}
	if n := count(t, reg, "autoglm_sockets", map[string]string{"pid": "200"}) + count(t, reg, "autoglm_socket_fds", map[string]string{"pid": "200"}); n != 0 {
		t.Errorf("%d socket series for a process without a socket view", n)
	}
	problems, err := testutil.CollectAndLint(collector{m})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}

	sock.Exited = true
	m.Update(snap(2, []*model.Process{sock}, nil, nil))
	m.Update(snap(3, nil, nil, nil))
	if n := count(t, reg, "autoglm_sockets", nil) + count(t, reg, "autoglm_socket_fds", nil); n != 0 {
		t.Errorf("%d socket series left after exit", n)
	}
}

func TestClose(t *testing.T) {
	m, reg := newMetrics(t)
	if err := m.Close(snap(1, []*model.Process{proc(100, "fdwork", 7, 1, 0, false)}, nil, nil)); err != nil {
		t.Fatal(err)
	}
	if v, _ := value(t, reg, "autoglm_open_fds", map[string]string{"pid": "100"}); v != 7 {
		t.Errorf("open_fds after Close(final) = %v, want 7", v)
	}
	if err := m.Close(nil); err != nil {
		t.Fatal(err)
	}
}

func TestHandler(t *testing.T) {
	m, reg := newMetrics(t)
	m.Update(snap(1, []*model.Process{proc(100, "fdwork", 57, 80, 23, false)}, nil, nil))
	srv := httptest.NewServer(Handler(reg))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if line := `autoglm_open_fds{comm="fdwork",pid="100"} 57`; !strings.Contains(string(body), line+"\n") {
		t.Errorf("response lacks %q:\n%s", line, body)
	}
}

// matching returns the gathered metrics of the family name whose labels
// include want.
func matching(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) []*dto.Metric {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			have := map[string]string{}
			for _, l := range m.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue metrics
				}
			}
			out = append(out, m)
		}
	}
	return out
}

func count(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) int {
	t.Helper()
	return len(matching(t, g, name, want))
}

// value returns the value of the one series of name matching want.
func value(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) (float64, bool) {
	t.Helper()
	ms := matching(t, g, name, want)
	switch len(ms) {
	case 0:
		return 0, false
	case 1:
		if c := ms[0].GetCounter(); c != nil {
			return c.GetValue(), true
		}
		return ms[0].GetGauge().GetValue(), true
	}
	t.Fatalf("%s%v matches %d series", name, want, len(ms))
	return 0, false
}

// The pipeline keeps listing a process after it exited (the JSON report wants
// its last state); its series still go after its exit snapshot.
func TestExitedProcessStillListed(t *testing.T) {
	m, reg := newMetrics(t)
	alive := proc(100, "fdwork", 57, 80, 23, false)
	dead := proc(200, "sockwork", 3, 9, 6, true)
	findings := []model.Finding{finding(100, "fdwork", true), finding(200, "sockwork", false)}
	m.Update(snap(1, []*model.Process{alive, proc(200, "sockwork", 5, 9, 4, false)}, findings, nil))
	m.Update(snap(2, []*model.Process{alive, dead}, findings, nil))
	if _, ok := value(t, reg, "autoglm_open_fds", map[string]string{"pid": "200"}); !ok {
		t.Fatal("exit snapshot not served")
	}
	for i := 3; i < 6; i++ {
		m.Update(snap(i, []*model.Process{alive, dead}, findings, nil))
		for _, name := range []string{"autoglm_open_fds", "autoglm_fd_limit", "autoglm_fds_opened_total", "autoglm_finding"} {
			if _, ok := value(t, reg, name, map[string]string{"pid": "200"}); ok {
				t.Fatalf("snapshot %d: %s{pid=200} still exported", i, name)
			}
		}
	}
	if _, ok := value(t, reg, "autoglm_open_fds", map[string]string{"pid": "100"}); !ok {
		t.Fatal("live process lost")
	}
}

// With pod labels (the daemon), every per-process series and the finding
// name the pod; a process outside a pod has them empty. The pod UID and
// container id are on the container's info series only.
func TestPodLabels(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := New(reg, "v1.2.3", Options{Pods: true})
	inPod := proc(100, "fdwork", 57, 80, 23, false)
	inPod.Pod = model.Pod{UID: "3f0e9b7c-1a2b-4c3d-8e9f-0123456789ab", ContainerID: strings.Repeat("ab", 32),
		Namespace: "ml", Name: "serve-0", Container: "worker"}
	m.Update(snap(1, []*model.Process{inPod, proc(200, "host", 5, 5, 0, false)}, []model.Finding{finding(100, "fdwork", true)}, nil))
	want := `
# HELP autoglm_finding A finding's severity while it is active (1 info, 2 warning, 3 critical), and once it no longer holds, minus the severity it ended with; site is the function at the finding's call site. The severity is the value, not a label, so that an escalating finding stays one series.
# TYPE autoglm_finding gauge
autoglm_finding{comm="fdwork",container="worker",kind="fd_leak",namespace="ml",pid="100",pod="serve-0",site="main.leak"} 2
# HELP autoglm_open_fds Live file descriptors of the process.
# TYPE autoglm_open_fds gauge
autoglm_open_fds{comm="fdwork",container="worker",namespace="ml",pid="100",pod="serve-0"} 57
autoglm_open_fds{comm="host",container="",namespace="",pid="200",pod=""} 5
# HELP autoglm_container_info Always 1: the pod UID and container id of a container watched processes run in, to join on (namespace, pod, container); they change at every restart, so no other series carries them.
# TYPE autoglm_container_info gauge
autoglm_container_info{container="worker",container_id="` + strings.Repeat("ab", 32) + `",namespace="ml",pod="serve-0",pod_uid="3f0e9b7c-1a2b-4c3d-8e9f-0123456789ab"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoglm_open_fds", "autoglm_finding", "autoglm_container_info"); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

// fd creation failures: a counter per errno, zeros included, that never
// goes down; none for a process the fd concern did not fill.
func TestFDFailures(t *testing.T) {
	m, reg := newMetrics(t)
	p := proc(100, "fdwork", 256, 300, 44, false)
	p.FD.Failed = map[string]uint64{"EMFILE": 42, "ENFILE": 0}
	m.Update(snap(1, []*model.Process{p, {PID: 200, Comm: "other"}}, nil, nil))
	want := `
# HELP autoglm_fd_create_failures_total fd-creating calls that failed since attach because the process (EMFILE) or the system (ENFILE) was out of fds.
# TYPE autoglm_fd_create_failures_total counter
autoglm_fd_create_failures_total{comm="fdwork",errno="EMFILE",pid="100"} 42
autoglm_fd_create_failures_total{comm="fdwork",errno="ENFILE",pid="100"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoglm_fd_create_failures_total"); err != nil {
		t.Fatal(err)
	}
	p.FD.Failed = map[string]uint64{"EMFILE": 40, "ENFILE": 1}
	m.Update(snap(2, []*model.Process{p}, nil, nil))
	if v, _ := value(t, reg, "autoglm_fd_create_failures_total", map[string]string{"errno": "EMFILE"}); v != 42 {
		t.Errorf("EMFILE after a smaller sample = %v, want 42", v)
	}
	if v, _ := value(t, reg, "autoglm_fd_create_failures_total", map[string]string{"errno": "ENFILE"}); v != 1 {
		t.Errorf("ENFILE = %v, want 1", v)
	}
}

// An fd leak explained by a socket leak is not a finding of its own on
// /metrics: only the socket leak is, and the relation has its own gauge.
func TestCausedBy(t *testing.T) {
	m, reg := newMetrics(t)
	s := finding(100, "sockwork", true)
	s.Kind = model.KindSocketLeak
	s.Stack = []model.Frame{model.ParseFrame("accept_conn+0x12 (sockwork)")}
	f := finding(100, "sockwork", true)
	ref := s.Ref()
	f.CausedBy = &ref
	p := []*model.Process{proc(100, "sockwork", 57, 80, 23, false)}
	m.Update(snap(1, p, []model.Finding{f, s}, nil))
	want := `
# HELP autoglm_finding A finding's severity while it is active (1 info, 2 warning, 3 critical), and once it no longer holds, minus the severity it ended with; site is the function at the finding's call site. The severity is the value, not a label, so that an escalating finding stays one series.
# TYPE autoglm_finding gauge
autoglm_finding{comm="sockwork",kind="socket_leak",pid="100",site="accept_conn"} 2
# HELP autoglm_finding_caused_by 1 while a finding explained by another (cause: its kind) is active, 0 after; such a finding is not in autoglm_finding or autoglm_findings_total.
# TYPE autoglm_finding_caused_by gauge
autoglm_finding_caused_by{cause="socket_leak",comm="sockwork",kind="fd_leak",pid="100"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoglm_finding", "autoglm_finding_caused_by"); err != nil {
		t.Fatal(err)
	}
	if v, _ := value(t, reg, "autoglm_findings_total", map[string]string{"kind": "fd_leak"}); v != 0 {
		t.Errorf("findings_total{fd_leak} = %v, want 0", v)
	}
	if v, _ := value(t, reg, "autoglm_findings_total", map[string]string{"kind": "socket_leak"}); v != 1 {
		t.Errorf("findings_total{socket_leak} = %v, want 1", v)
	}
	f.Active = false
	m.Update(snap(2, p, []model.Finding{f, s}, nil))
	if v, ok := value(t, reg, "autoglm_finding_caused_by", map[string]string{"kind": "fd_leak"}); !ok || v != 0 {
		t.Errorf("caused_by after the fd leak ended = %v (present %v), want 0", v, ok)
	}
}

// The series of one process as the fd, socket and scheduler concerns fill
// it (README, "Series per process"): 18. Before sockets were exported by
// state present and the run-queue histogram became native, the same process
// had 50 without the two failure counters: 12 states, and a histogram of
// 22 buckets, +Inf, sum and count.
func TestSeriesPerProcess(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    Options
		classic int // series of the run-queue histogram
	}{
		{"native", Options{}, 1},
		{"with classic buckets", Options{RunqueueClassicBuckets: true}, len(RunqueueBuckets) + 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			m := New(reg, "v1", tc.opts)
			p := schedProc(100, "server", 900, 40, false)
			p.FD.Opened = map[string]uint64{"file": 80, "socket": 500, "pipe": 2}
			p.FD.Closed = map[string]uint64{"file": 70, "socket": 480}
			p.FD.Failed = map[string]uint64{"EMFILE": 0, "ENFILE": 0}
			p.Sock = model.SockStats{TCPByState: map[string]int{"LISTEN": 1, "ESTABLISHED": 19},
				ByKind: map[string]int{"tcp": 20, "udp": 0, "unix": 2, "other": 0}}
			m.Update(snap(1, []*model.Process{p}, nil, nil))
			// Series as Prometheus stores them: a classic histogram is
			// one per bucket plus sum and count.
			families, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, f := range families {
				for _, s := range f.GetMetric() {
					pid := ""
					for _, l := range s.GetLabel() {
						if l.GetName() == "pid" {
							pid = l.GetValue()
						}
					}
					switch {
					case pid != "100":
					case s.GetHistogram() != nil && len(s.GetHistogram().GetBucket()) > 0:
						n += len(s.GetHistogram().GetBucket()) + 3 // and +Inf, sum, count
					default:
						n++
					}
				}
			}
			// open_fds, fd_limit, 3 opened, 2 closed, 2 failures, 2 TCP
			// states, 4 socket kinds, 2 context switch types, run queue.
			if want := 1 + 1 + 3 + 2 + 2 + 2 + 4 + 2 + tc.classic; n != want {
				t.Errorf("%d series for the process, want %d", n, want)
			}
		})
	}
}

// Processes a view could not follow are counted by view and reason.
func TestTrackFailures(t *testing.T) {
	m, reg := newMetrics(t)
	s := snap(1, []*model.Process{proc(100, "fdwork", 5, 5, 0, false)}, nil, nil)
	s.TrackFailures = map[model.TrackFailure]uint64{{View: "sock", Reason: "EPERM"}: 2}
	m.Update(s)
	want := `
# HELP autoglm_track_failures_total Processes a view could not follow (the other views watched them on), by view and reason (an errno name, or other).
# TYPE autoglm_track_failures_total counter
autoglm_track_failures_total{reason="EPERM",view="sock"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoglm_track_failures_total"); err != nil {
		t.Fatal(err)
	}
}

// The agent's own Go runtime and process series are served beside the
// watched processes', as by every exporter.
func TestOwnRuntimeAndProcessSeries(t *testing.T) {
	_, reg := newMetrics(t)
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} {
		if len(matching(t, reg, name, nil)) != 1 {
			t.Errorf("no %s", name)
		}
	}
}
