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
// arrives at Alertmanager's API naming the pid, the pod and the call site.
// Every query of the Grafana dashboard then runs on that Prometheus without
// error, and the key panels return data.
func TestAlertingLoop(t *testing.T) {
	testutil.RequireRoot(t)
	const uid = "a1b2c3d4-0000-4000-8000-00000000abcd"
	cid := strings.Repeat("fedcba9876543210", 4)
	dir := testCgroup(t, filepath.Join("kubepods", "burstable", "pod"+uid, cid))
	d := startDaemon(t, "--all", "--match-comm", "^fdwork$")

	amAddr, promAddr := freeAddr(t), freeAddr(t)
	tmp := t.TempDir()
	amConf := filepath.Join(tmp, "alertmanager.yml")
	if err := os.WriteFile(amConf, []byte(`route:
  receiver: "null"
  group_wait: 1s
  group_interval: 1s
receivers:
  - name: "null"
`), 0o644); err != nil {
		t.Fatal(err)
	}
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
	leaker := exec.Command("/bin/sh", append(inCgroup(dir), bin, "leak", "40", "90")...)
	if err := leaker.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leaker.Process.Kill(); _ = leaker.Wait() })
	pid := strconv.Itoa(leaker.Process.Pid)

	var alert map[string]string
	testutil.Eventually(t, 60*time.Second, "AutoglmFdLeak at Alertmanager", func() bool {
		var alerts []struct {
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		}
		if err := getJSON("http://"+amAddr+"/api/v2/alerts", &alerts); err != nil {
			return false
		}
		for _, a := range alerts {
			if a.Labels["alertname"] == "AutoglmFdLeak" && a.Labels["pid"] == pid {
				alert = a.Labels
				alert["summary"] = a.Annotations["summary"]
				return true
			}
		}
		return false
	})
	if alert["pod_uid"] != uid || alert["container_id"] != cid || alert["site"] != "leak_tick" || alert["node"] != "test-node" {
		t.Errorf("alert labels %v: want pod_uid %s, container_id %s, site leak_tick, node test-node", alert, uid, cid)
	}
	if !strings.Contains(alert["summary"], "pid "+pid) || !strings.Contains(alert["summary"], "leak_tick") {
		t.Errorf("alert summary %q does not name the pid and the call site", alert["summary"])
	}

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

// keyPanel: the panels a GPU-less machine must fill.
func keyPanel(expr string) bool {
	for _, m := range []string{"autoglm_open_fds", "autoglm_finding", "autoglm_context_switches_total"} {
		if strings.Contains(expr, m) {
			return true
		}
	}
	return false
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
