package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/deploy"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// startServer runs a Debian-packaged server (prometheus, alertmanager) on
// loopback until the test ends; it fails the test if the binary is missing
// under CI and skips otherwise.
func startServer(t *testing.T, bin string, args ...string) {
	t.Helper()
	if _, err := exec.LookPath(bin); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not installed (scripts/install-deps.sh test installs it)", bin)
		}
		t.Skipf("%s not installed", bin)
	}
	cmd := exec.Command(bin, args...)
	log, err := os.Create(filepath.Join(t.TempDir(), filepath.Base(bin)+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("%s log:\n%s", bin, b)
		}
	})
}

// fastRules is the shipped rules file with every `for:` cut to a few
// seconds, so that the loop closes within a test.
func fastRules(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testutil.RepoRoot(), "deploy", "prometheus", "autoglm-rules.yml"))
	if err != nil {
		t.Fatal(err)
	}
	fast := regexp.MustCompile(`(?m)^(\s+for:) .*$`).ReplaceAll(b, []byte("$1 3s"))
	path := filepath.Join(t.TempDir(), "rules.yml")
	if err := os.WriteFile(path, fast, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// The alerting loop, as a cluster runs it: Prometheus scrapes the daemon
// with the rules from deploy/, a process in a pod leaks fds, and the alert
// arrives at Alertmanager's API naming the pid and the call site. Its limit
// then drops so that the leak turns critical: the critical alert arrives
// while the warning one goes on, never resolved and fired again, inhibited
// by the critical one under the shipped Alertmanager configuration. Every
// query of the Grafana dashboard then runs on that Prometheus without
// error, and the key panels return data.
func TestAlertingLoop(t *testing.T) {
	testutil.RequireRoot(t)
	const uid = "a1b2c3d4-0000-4000-8000-00000000abcd"
	cid := strings.Repeat("fedcba9876543210", 4)
	dir := testCgroup(t, filepath.Join("kubepods", "burstable", "pod"+uid, cid))
	d := startDaemon(t, "--all", "--match-comm", "^fdwork$")

	amAddr, promAddr := testutil.FreeAddr(t), testutil.FreeAddr(t)
	tmp := t.TempDir()
	// The shipped configuration: its receivers send nowhere, its API lists
	// every alert with what inhibits it.
	amConf := filepath.Join(testutil.RepoRoot(), "deploy", "alertmanager", "alertmanager.yml")
	startServer(t, "prometheus-alertmanager", "--config.file="+amConf, "--storage.path="+filepath.Join(tmp, "am"),
		"--web.listen-address="+amAddr, "--cluster.listen-address=")
	promConf := filepath.Join(tmp, "prometheus.yml")
	if err := os.WriteFile(promConf, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
alerting:
  alertmanagers:
    - static_configs:
        - targets: [%q]
scrape_configs:
  - job_name: autoglm-ebpf
    static_configs:
      - targets: [%q]
        labels: {node: test-node}
`, fastRules(t), amAddr, d.addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	startServer(t, "prometheus", "--config.file="+promConf, "--storage.tsdb.path="+filepath.Join(tmp, "tsdb"),
		"--web.listen-address="+promAddr)

	bin := testutil.Fixture(t, "fdwork")
	// A leak slow enough for the hard fd limit to last 25 minutes, past
	// the 10 that make it critical: a warning.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	rate := strconv.FormatUint(min(40, max(1, lim.Max/1500)), 10)
	leaker := exec.Command("/bin/sh", append(inCgroup(dir), "prlimit", fmt.Sprintf("--nofile=%d:%d", lim.Max, lim.Max), bin, "leak", rate, "240")...)
	if err := leaker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leaker.Process.Kill(); _ = leaker.Wait() })
	pid := strconv.Itoa(leaker.Process.Pid)

	var seen []amAlert // what Alertmanager had last, for a failure's log
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("alerts at Alertmanager: %+v", seen)
			_, body := get(d.addr, "/metrics")
			for _, l := range strings.Split(body, "\n") {
				if strings.HasPrefix(l, "autoglm_finding") || strings.HasPrefix(l, "autoglm_open_fds") || strings.HasPrefix(l, "autoglm_container_open_fds") {
					t.Log(l)
				}
			}
		}
	})
	fdLeak := func(severity string) (amAlert, bool) {
		var alerts []amAlert
		if err := getJSON("http://"+amAddr+"/api/v2/alerts", &alerts); err != nil {
			return amAlert{}, false
		}
		seen = alerts
		for _, a := range alerts {
			if a.Labels["alertname"] == "AutoglmFdLeak" && a.Labels["pid"] == pid && a.Labels["severity"] == severity {
				return a, true
			}
		}
		return amAlert{}, false
	}
	var warning amAlert
	testutil.Eventually(t, 90*time.Second, "AutoglmFdLeak (warning) at Alertmanager", func() bool {
		var ok bool
		warning, ok = fdLeak("warning")
		return ok
	})
	if l := warning.Labels; l["site"] != "leak_tick" || l["node"] != "test-node" || l["kind"] != "fd_leak" {
		t.Errorf("alert labels %v: want kind fd_leak, site leak_tick, node test-node", l)
	}
	if sum := warning.Annotations["summary"]; !strings.Contains(sum, "pid "+pid) || !strings.Contains(sum, "leak_tick") {
		t.Errorf("alert summary %q does not name the pid and the call site", sum)
	}

	// The escalation: a limit the leak reaches within a minute.
	fds, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	limit := fmt.Sprintf("--nofile=%d:%d", len(fds)+400, len(fds)+400)
	if out, err := exec.Command("prlimit", "--pid", pid, limit).CombinedOutput(); err != nil {
		t.Fatalf("prlimit: %v: %s", err, out)
	}
	testutil.Eventually(t, 60*time.Second, "AutoglmFdLeak (critical) at Alertmanager", func() bool {
		_, ok := fdLeak("critical")
		return ok
	})
	still, ok := fdLeak("warning")
	if !ok || !still.StartsAt.Equal(warning.StartsAt) {
		t.Errorf("the warning alert did not hold through the escalation: before %v, after %v (present %v)", warning.StartsAt, still.StartsAt, ok)
	}
	testutil.Eventually(t, 10*time.Second, "the warning inhibited by the critical alert", func() bool {
		w, ok := fdLeak("warning")
		return ok && len(w.Status.InhibitedBy) == 1
	})

	targets, err := deploy.DashboardTargets("1m")
	if err != nil {
		t.Fatal(err)
	}
	empty := 0
	for _, tg := range targets {
		var r struct {
			Status string `json:"status"`
			Error  string `json:"error"`
			Data   struct {
				Result []json.RawMessage `json:"result"`
			} `json:"data"`
		}
		if err := getJSON("http://"+promAddr+"/api/v1/query?query="+url.QueryEscape(tg.Expr), &r); err != nil || r.Status != "success" {
			t.Errorf("dashboard panel %q: query %s: %v %s", tg.Panel, tg.Expr, err, r.Error)
			continue
		}
		if len(r.Data.Result) == 0 {
			empty++
			if keyPanel(tg.Expr) {
				t.Errorf("key dashboard panel %q returned no data: %s", tg.Panel, tg.Expr)
			}
		}
	}
	t.Logf("%d dashboard queries ran, %d without data (no GPU, no NVML here)", len(targets), empty)
}

// keyPanel: the panels a GPU-less machine must fill: the container's fds
// and context switches, the leaking process's own fds (it has an active
// finding), the findings, and the agent's own health.
func keyPanel(expr string) bool {
	for _, m := range []string{"autoglm_container_open_fds", "autoglm_open_fds", "autoglm_finding",
		"autoglm_container_context_switches_total", "autoglm_view_up", "autoglm_bpf_memory_bytes",
		"process_resident_memory_bytes", "process_cpu_seconds_total", "autoglm_build_info"} {
		if strings.Contains(expr, m) {
			return true
		}
	}
	return false
}

// amAlert is an alert as Alertmanager's API lists it.
type amAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	StartsAt    time.Time         `json:"startsAt"`
	Status      struct {
		InhibitedBy []string `json:"inhibitedBy"`
	} `json:"status"`
}

func getJSON(u string, v any) error {
	resp, err := http.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", u, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
