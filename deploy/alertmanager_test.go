package deploy

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

const amConfigFile = "alertmanager/alertmanager.yml"

// The receivers of alertmanager.yml, by severity; any other severity, or
// none, goes to the low-noise one.
var receiverBySeverity = map[string]string{"critical": "autoglm-page", "warning": "autoglm-ticket"}

const defaultReceiver = "autoglm-default"

// The alerts of the device-fault inhibition: a device fault (source)
// silences the GPU alerts of the processes on its node (targets). Every
// other AutoglmGpu* alert is in neither list, for the reason given.
var (
	deviceFaults     = []string{"AutoglmGpuXid", "AutoglmGpuEccError"}
	gpuProcessAlerts = []string{"AutoglmGpuMemoryLeak", "AutoglmGpuAllocBurst", "AutoglmGpuAllocFailure",
		"AutoglmGpuAllocChurn", "AutoglmGpuInputBound", "AutoglmGpuSyncStorm", "AutoglmGpuProcessMemoryExhaustionPredicted",
		"AutoglmGpuXidApplication"}
	gpuAlertsNotInhibited = map[string]string{
		"AutoglmGpuXidUnknown":                "the device's, for an XID that may be its fault: it stays visible beside a device fault",
		"AutoglmGpuMemoryExhaustionPredicted": "a device's, not a process's",
	}
)

// alertmanagerTool returns the first of names on PATH. Without it the test
// is skipped, unless CI is set: CI must run the Alertmanager tests.
func alertmanagerTool(t *testing.T, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not found and CI is set: install it (Debian: apt-get install prometheus-alertmanager; scripts/install-deps.sh test)", names[0])
	}
	t.Skipf("%s not installed (Debian: apt-get install prometheus-alertmanager); CI unset", names[0])
	return ""
}

func TestAlertmanagerCheckConfig(t *testing.T) {
	amtool := alertmanagerTool(t, "amtool")
	if out, err := exec.Command(amtool, "check-config", amConfigFile).CombinedOutput(); err != nil {
		t.Fatalf("amtool check-config %s: %v\n%s", amConfigFile, err, out)
	}
}

// TestAlertmanagerRoutes: every alert of the rule file, at each severity it
// can have, reaches the receiver of that severity (`amtool config routes
// test --verify.receivers` fails otherwise); other severities and other
// alerts reach the default receiver.
func TestAlertmanagerRoutes(t *testing.T) {
	amtool := alertmanagerTool(t, "amtool")
	routes := func(want string, labels ...string) error {
		args := append([]string{"config", "routes", "test", "--config.file=" + amConfigFile, "--verify.receivers=" + want}, labels...)
		if out, err := exec.Command(amtool, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	type route struct{ alert, severity string }
	var cases []route
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if s, ok := r.Labels["severity"]; ok {
				cases = append(cases, route{r.Alert, s})
				continue
			}
			// A rule that passes the finding's own severity on.
			cases = append(cases, route{r.Alert, "warning"}, route{r.Alert, "critical"})
		}
	}
	slices.SortFunc(cases, func(a, b route) int {
		return cmp.Or(strings.Compare(a.alert, b.alert), strings.Compare(a.severity, b.severity))
	})
	for _, c := range slices.Compact(cases) {
		want, ok := receiverBySeverity[c.severity]
		if !ok {
			want = defaultReceiver
		}
		if err := routes(want, "alertname="+c.alert, "severity="+c.severity); err != nil {
			t.Errorf("%s severity=%s: want receiver %s: %v", c.alert, c.severity, want, err)
		}
	}
	for _, labels := range [][]string{
		{"alertname=AutoglmGpuXidApplication", "severity=info"},
		{"alertname=AutoglmFdLeak"},
		// Not ours: merged into another configuration, these routes must
		// leave other alerts alone.
		{"alertname=KubeNodeNotReady", "severity=critical"},
	} {
		if err := routes(defaultReceiver, labels...); err != nil {
			t.Errorf("%v: want receiver %s: %v", labels, defaultReceiver, err)
		}
	}
	// The check itself fails on a wrong receiver.
	if routes("autoglm-page", "alertname=AutoglmFdLeak", "severity=warning") == nil {
		t.Error("amtool config routes test --verify.receivers passed a warning routed to autoglm-page")
	}
}

// TestAlertmanagerGpuAlertsClassified: the inhibition lists name shipped
// alerts, and a new GPU alert is put in one of them or explicitly in none.
func TestAlertmanagerGpuAlertsClassified(t *testing.T) {
	shipped := map[string]bool{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			shipped[r.Alert] = true
		}
	}
	listed := map[string]bool{}
	for _, a := range slices.Concat(deviceFaults, gpuProcessAlerts, slices.Collect(maps.Keys(gpuAlertsNotInhibited))) {
		listed[a] = true
		if !shipped[a] {
			t.Errorf("%s is in the inhibition lists but not in %s", a, rulesFile)
		}
	}
	for a := range shipped {
		if strings.HasPrefix(a, "AutoglmGpu") && !listed[a] {
			t.Errorf("%s: say whether a device fault inhibits it (alertmanager.yml's second inhibit rule, and this file's lists)", a)
		}
	}
}

// amAlert is an alert as posted to and read from Alertmanager's API v2.
type amAlert struct {
	Labels      map[string]string `json:"labels"`
	StartsAt    time.Time         `json:"startsAt,omitzero"`
	EndsAt      time.Time         `json:"endsAt,omitzero"`
	Fingerprint string            `json:"fingerprint,omitempty"`
	Status      struct {
		InhibitedBy []string `json:"inhibitedBy"`
	} `json:"status,omitzero"`
}

// TestAlertmanagerInhibitions runs Debian's Alertmanager with the shipped
// configuration, posts alerts as the shipped rules raise them, and reads
// back from its API which alerts are inhibited, and by which.
func TestAlertmanagerInhibitions(t *testing.T) {
	bin := alertmanagerTool(t, "prometheus-alertmanager", "alertmanager")
	addr := startAlertmanager(t, bin)

	with := func(base map[string]string, kv ...string) map[string]string {
		l := maps.Clone(base)
		for i := 0; i < len(kv); i += 2 {
			l[kv[i]] = kv[i+1]
		}
		return l
	}
	// Three agents: two with node and cluster (the ServiceMonitor, a
	// Prometheus holding several clusters), one from a plain scrape job.
	nodeA := map[string]string{"job": "autoglm-ebpf", "instance": "10.0.0.5:9464", "node": "gpu-node-1", "cluster": "gpu-east"}
	nodeB := with(nodeA, "instance", "10.0.0.6:9464", "node", "gpu-node-2")
	plain := map[string]string{"job": "autoglm-ebpf", "instance": "10.0.0.7:9464"}
	inPod := map[string]string{"pid": "4242", "comm": "trainer", "namespace": "ml", "pod": "trainer-0", "container": "trainer",
		"pod_uid": "7d3c2a8e-0001", "container_id": "containerd://4f1e"}
	finding := func(agent map[string]string, alert, severity, kind string, process map[string]string) map[string]string {
		l := with(agent, "alertname", alert, "severity", severity, "kind", kind, "site", "cache_tokenizer")
		maps.Copy(l, process)
		return l
	}
	device := func(agent map[string]string, alert, severity string, kv ...string) map[string]string {
		return with(agent, append([]string{"alertname", alert, "severity", severity, "gpu", "0", "uuid", "GPU-aaaa"}, kv...)...)
	}

	alerts := map[string]map[string]string{} // name -> labels
	want := map[string][]string{}            // name -> the names of the alerts inhibiting it
	add := func(name string, labels map[string]string, inhibitedBy ...string) {
		alerts[name], want[name] = labels, inhibitedBy
	}

	// A finding escalated: its critical alert silences its warning alert.
	fdCritical := finding(nodeA, "AutoglmFdLeak", "critical", "fd_leak", inPod)
	add("fd critical", fdCritical)
	add("fd warning", with(fdCritical, "severity", "warning"), "fd critical")
	// The same on a host process of a plain scrape job: no pod, no node on
	// either alert.
	hostCritical := finding(plain, "AutoglmFdLeak", "critical", "fd_leak", map[string]string{"pid": "77", "comm": "nginx"})
	add("host fd critical", hostCritical)
	add("host fd warning", with(hostCritical, "severity", "warning"), "host fd critical")
	// Not the same finding: one label of the identity differs, or one of
	// them has a label the other lacks.
	add("socket leak warning", with(fdCritical, "alertname", "AutoglmSocketLeak", "severity", "warning"))
	for _, l := range []string{"cluster", "job", "instance", "node", "kind", "site", "pid", "namespace", "pod", "container", "cgroup", "gpu", "uuid", "xid"} {
		add("fd warning, other "+l, with(fdCritical, "severity", "warning", l, "other"))
	}

	// A device fault on node A silences the GPU alerts of node A's
	// processes, of either severity, and nothing else there (fd critical
	// above stays uninhibited).
	add("xid", device(nodeA, "AutoglmGpuXid", "critical", "xid", "79"))
	// An alert of gpuProcessAlerts or gpuAlertsNotInhibited on a process in
	// a pod, with the labels its rule gives it.
	gpuAlert := func(agent map[string]string, alert, severity string) map[string]string {
		switch alert {
		case "AutoglmGpuMemoryLeak", "AutoglmGpuAllocBurst", "AutoglmGpuAllocFailure", "AutoglmGpuAllocChurn", "AutoglmGpuInputBound", "AutoglmGpuSyncStorm":
			kind := map[string]string{"AutoglmGpuMemoryLeak": "gpu_memory_leak", "AutoglmGpuAllocBurst": "gpu_alloc_burst",
				"AutoglmGpuAllocFailure": "gpu_alloc_failure", "AutoglmGpuAllocChurn": "gpu_alloc_churn",
				"AutoglmGpuInputBound": "gpu_input_bound", "AutoglmGpuSyncStorm": "gpu_sync_storm"}[alert]
			return finding(agent, alert, severity, kind, inPod)
		case "AutoglmGpuProcessMemoryExhaustionPredicted": // NVML's per-process series, with the device's uuid
			l := device(agent, alert, severity, "gpu", "1", "uuid", "GPU-bbbb")
			maps.Copy(l, inPod)
			return l
		case "AutoglmGpuXidApplication": // the device's XID counter
			return device(agent, alert, severity, "gpu", "1", "uuid", "GPU-bbbb", "xid", "13")
		case "AutoglmGpuXidUnknown":
			return device(agent, alert, severity, "gpu", "1", "uuid", "GPU-bbbb", "xid", "999")
		case "AutoglmGpuMemoryExhaustionPredicted":
			return device(agent, alert, severity)
		}
		t.Fatalf("%s: no labels for it in this test", alert)
		return nil
	}
	for _, a := range gpuProcessAlerts {
		add(a+" on A", gpuAlert(nodeA, a, "warning"), "xid")
	}
	for a := range gpuAlertsNotInhibited {
		add(a+" on A", gpuAlert(nodeA, a, "warning"))
	}
	leakCritical := gpuAlert(nodeA, "AutoglmGpuMemoryLeak", "critical")
	add("gpu leak critical on A", with(leakCritical, "pid", "4243"), "xid")
	// Inhibited by both rules: Alertmanager names the source of the first.
	add("gpu leak warning on A, escalated", with(leakCritical, "pid", "4243", "severity", "warning"), "gpu leak critical on A")
	// Another agent: one of its labels differs.
	for _, l := range []string{"cluster", "job", "instance", "node"} {
		add("gpu leak warning, other "+l, with(gpuAlert(nodeA, "AutoglmGpuMemoryLeak", "warning"), l, "other"))
	}
	// Node B: XID alerts that are no device fault (an unclassified XID, an
	// XID alert that is not critical), so its process's GPU alert stays.
	add("xid unknown on B", gpuAlert(nodeB, "AutoglmGpuXidUnknown", "warning"))
	add("xid warning on B", device(nodeB, "AutoglmGpuXid", "warning", "xid", "13"))
	add("gpu leak warning on B", gpuAlert(nodeB, "AutoglmGpuMemoryLeak", "warning"))
	// An ECC error on the plain job's agent (no node) silences its
	// processes' GPU alerts; the host fd alerts there stay as they are.
	add("ecc", device(plain, "AutoglmGpuEccError", "critical"))
	add("alloc failure on plain", finding(plain, "AutoglmGpuAllocFailure", "warning", "gpu_alloc_failure", map[string]string{"pid": "78", "comm": "python3"}), "ecc")

	now := time.Now()
	var post []amAlert
	for _, l := range alerts {
		post = append(post, amAlert{Labels: l, StartsAt: now, EndsAt: now.Add(time.Hour)})
	}
	body, err := json.Marshal(post)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+addr+"/api/v2/alerts", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /api/v2/alerts: %s", resp.Status)
	}

	// The inhibitor learns of the sources asynchronously. Every source
	// inhibits some alert here, so once each expected inhibition is seen
	// all sources are known, and an alert not inhibited then stays so.
	var diff []string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Alertmanager's inhibitions differ from the expected:\n%s", strings.Join(diff, "\n"))
		}
	})
	testutil.Eventually(t, 30*time.Second, "the expected inhibitions in Alertmanager's API", func() bool {
		got, err := inhibitions(addr, alerts)
		if err != nil {
			diff = []string{err.Error()}
			return false
		}
		diff = nil
		for name, w := range want {
			slices.Sort(w)
			if !slices.Equal(got[name], w) {
				diff = append(diff, fmt.Sprintf("%s: inhibited by %q, want %q", name, got[name], w))
			}
		}
		slices.Sort(diff)
		return len(diff) == 0
	})
}

// inhibitions returns, for each of the named alerts, the sorted names of
// the alerts inhibiting it, as Alertmanager's API says.
func inhibitions(addr string, alerts map[string]map[string]string) (map[string][]string, error) {
	resp, err := http.Get("http://" + addr + "/api/v2/alerts")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /api/v2/alerts: %s", resp.Status)
	}
	var got []amAlert
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		return nil, err
	}
	nameOf := func(labels map[string]string) string {
		for n, l := range alerts {
			if maps.Equal(l, labels) {
				return n
			}
		}
		return ""
	}
	byFingerprint := map[string]string{}
	for _, a := range got {
		byFingerprint[a.Fingerprint] = nameOf(a.Labels)
	}
	out := map[string][]string{}
	for _, a := range got {
		n := nameOf(a.Labels)
		if n == "" {
			return nil, fmt.Errorf("an alert not posted: %v", a.Labels)
		}
		var by []string
		for _, f := range a.Status.InhibitedBy {
			by = append(by, byFingerprint[f])
		}
		slices.Sort(by)
		out[n] = by
	}
	if len(out) != len(alerts) {
		return nil, fmt.Errorf("%d of the %d alerts posted", len(out), len(alerts))
	}
	return out, nil
}

// startAlertmanager runs bin with the shipped configuration on a loopback
// port until the test ends, and returns its address once it is ready.
func startAlertmanager(t *testing.T, bin string) string {
	t.Helper()
	addr := testutil.FreeAddr(t)
	dir := t.TempDir()
	cmd := exec.Command(bin, "--config.file="+amConfigFile, "--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--cluster.listen-address=")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("%s log:\n%s", bin, log.String())
		}
	})
	testutil.Eventually(t, 30*time.Second, "Alertmanager ready on "+addr, func() bool {
		select {
		case <-exited:
			t.Fatalf("%s exited: %s\n%s", bin, cmd.ProcessState, log.String())
		default:
		}
		resp, err := http.Get("http://" + addr + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return addr
}
