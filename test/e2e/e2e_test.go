//go:build e2e

// Package e2e runs the shipped manifests on a real one-node Kubernetes
// (`make e2e`, root): the agent's DaemonSet from the kustomize base and
// from the Helm chart, a leaking workload in another namespace, Debian's
// Prometheus with the shipped rules and Alertmanager. cluster.go brings
// the node up from real components and takes it down, checking that the
// host is left as it was.
package e2e

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/yaml"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/report"
)

var (
	kubeBin    = flag.String("kube-bin", "", "folder with kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and kubectl (test/e2e/kube)")
	agentImage = flag.String("image", "", "the agent's image archive (make image)")
	agentRef   = flag.String("image-ref", "", "the agent image's name, REPOSITORY:TAG")
	fixtures   = flag.String("fixtures", "", "testdata/bin: the workload's programs and the stand-in CUDA libraries")
	runDir     = flag.String("run-dir", "", "the run's folder (made anew, removed at the end)")
)

// The agent's warning when it has no pod names (pkg/podinfo).
const fallbackMsg = "pod names unavailable from the Kubernetes API; labels fall back to cgroup ids only"

const (
	agentNS    = "autoglm-ebpf"
	helmNS     = "autoglm-helm"
	workNS     = "e2e-workload"
	workPod    = "leaky"
	promAddr   = "127.0.0.1:19090"
	alertsAddr = "127.0.0.1:19093"
)

func TestShippedManifestsOnRealCluster(t *testing.T) {
	for name, v := range map[string]string{"-kube-bin": *kubeBin, "-image": *agentImage, "-image-ref": *agentRef, "-fixtures": *fixtures, "-run-dir": *runDir} {
		if v == "" {
			t.Fatalf("%s is required (make e2e sets it)", name)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	dir, err := filepath.Abs(*runDir)
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, *kubeBin, dir)
	start := time.Now()
	c.up(ctx)
	c.images(ctx)
	t.Logf("node Ready and images imported in %v", time.Since(start).Round(time.Second))
	repo, tag, _ := strings.Cut(*agentRef, ":")

	// 1. The kustomize base, with only the image overridden.
	overlay := c.path("overlay")
	root, _ := filepath.Abs("../../deploy/kubernetes")
	rel, _ := filepath.Rel(overlay, root)
	os.MkdirAll(overlay, 0o755)
	kust := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%s]\nimages:\n  - name: ghcr.io/open-autoglm/autoglm-ebpf\n    newName: %q\n    newTag: %q\n", rel, repo, tag)
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kust), 0o644); err != nil {
		t.Fatal(err)
	}
	kustomized := c.mustKubectl(ctx, "kustomize", overlay)
	c.apply(ctx, "kustomize.yaml", kustomized)
	agent := c.agentReady(ctx, agentNS, "")
	t.Run("KustomizeSecurityContextUnchanged", func(t *testing.T) { checkSecurityContext(t, kustomized, agent) })

	c.apply(ctx, "workload.yaml", mustRead(t, "testdata/workload.yaml"))
	work := c.podRunning(ctx, workNS, workPod)
	c.monitoring(ctx, agent.Status.PodIP)

	t.Run("FindingsCarryPodLabels", func(t *testing.T) { c.checkFindings(ctx, t, agent, work, true) })
	t.Run("FdLeakIsAnEventOnItsPod", func(t *testing.T) { c.checkEvent(ctx, t) })
	t.Run("RunbookConfirmsFdLeak", func(t *testing.T) { c.checkRunbookConfirm(ctx, t, agent, work) })
	t.Run("FdLeakAlertReachesAlertmanager", func(t *testing.T) { c.checkAlert(ctx, t) })
	t.Run("WithoutRBACFallsBackToCgroupLabels", func(t *testing.T) {
		role := c.mustKubectl(ctx, "get", "clusterrole", "autoglm-ebpf", "-o", "yaml")
		c.mustKubectl(ctx, "delete", "clusterrole", "autoglm-ebpf")
		c.mustKubectl(ctx, "delete", "pod", "-n", agentNS, agent.Metadata.Name, "--wait=true")
		bare := c.agentReady(ctx, agentNS, agent.Metadata.Name)
		c.checkFindings(ctx, t, bare, work, false)
		logs := c.mustKubectl(ctx, "logs", "-n", agentNS, bare.Metadata.Name)
		if n := strings.Count(logs, fallbackMsg); n != 1 {
			t.Errorf("the agent without RBAC said %d times %q, want once:\n%s", n, fallbackMsg, logs)
		} else {
			for _, line := range strings.Split(logs, "\n") {
				if strings.Contains(line, fallbackMsg) {
					t.Logf("%s: %s", bare.Metadata.Name, line)
				}
			}
		}
		c.apply(ctx, "clusterrole.yaml", role)
	})
	progs := c.bpfPrograms()
	c.mustKubectl(ctx, "delete", "-f", c.path("kustomize.yaml"), "--wait=true")
	t.Run("KustomizeDeletedLeavesNoBPF", func(t *testing.T) { c.checkNoBPF(ctx, t, progs) })

	// 2. The Helm chart, with only the image overridden, in a namespace
	// labelled for the privileged Pod Security Standard (as its values say).
	rendered := renderChart(t, map[string]any{"image": map[string]any{"repository": repo, "tag": tag}})
	c.mustKubectl(ctx, "create", "namespace", helmNS)
	c.mustKubectl(ctx, "label", "namespace", helmNS, "pod-security.kubernetes.io/enforce=privileged")
	c.apply(ctx, "helm.yaml", rendered)
	agent = c.agentReady(ctx, helmNS, "")
	t.Run("HelmSecurityContextUnchanged", func(t *testing.T) { checkSecurityContext(t, rendered, agent) })
	t.Run("HelmFindingsCarryPodLabels", func(t *testing.T) { c.checkFindings(ctx, t, agent, work, true) })
	t.Run("DeletedPodsSeriesGo", func(t *testing.T) {
		c.mustKubectl(ctx, "delete", "pod", "-n", workNS, workPod, "--wait=true")
		err := poll(ctx, time.Minute, func() error {
			fams, err := scrape(agent.Status.PodIP)
			if err != nil {
				return err
			}
			for name, f := range fams {
				for _, m := range f.Metric {
					if l := labels(m); l["pod_uid"] == work.Metadata.UID || l["namespace"] == workNS && l["pod"] == workPod {
						return fmt.Errorf("%s%v still there", name, l)
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	})
	progs = c.bpfPrograms()
	c.mustKubectl(ctx, "delete", "-f", c.path("helm.yaml"), "--wait=true")
	t.Run("HelmDeletedLeavesNoBPF", func(t *testing.T) { c.checkNoBPF(ctx, t, progs) })
}

func mustRead(t *testing.T, p string) string {
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// images builds the sandbox and workload images and imports them with the
// agent's.
func (c *cluster) images(ctx context.Context) {
	t := c.t
	dir := c.path("images")
	os.MkdirAll(dir, 0o755)
	pause := filepath.Join(dir, "pause")
	if out, err := exec.Command("cc", "-static", "-O2", "-o", pause, "testdata/pause.c").CombinedOutput(); err != nil {
		t.Fatalf("cc pause.c: %v: %s", err, out)
	}
	fx := *fixtures
	steps := []error{
		writeImage(filepath.Join(dir, "pause.tar"), pauseImage, []string{"/pause"}, []imageFile{{"/pause", pause}}),
		writeImage(filepath.Join(dir, "workload.tar"), workloadImage, []string{"/opt/e2e/demo"}, []imageFile{
			{"/opt/e2e/demo", filepath.Join(fx, "demo")},
			{"/opt/e2e/cudawork", filepath.Join(fx, "cudawork")},
			{"/opt/e2e/cuda/libcudart.so.11.0", filepath.Join(fx, "cuda/libcudart.so.11.0")},
			{"/opt/e2e/cuda/libcuda.so.1", filepath.Join(fx, "cuda/libcuda.so.1")},
		}),
	}
	for _, err := range steps {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, a := range []string{filepath.Join(dir, "pause.tar"), filepath.Join(dir, "workload.tar"), *agentImage} {
		c.importImage(ctx, a)
	}
}

// apply writes manifests to the run's folder (to delete them by file
// later) and applies them.
func (c *cluster) apply(ctx context.Context, file, manifests string) {
	c.t.Helper()
	p := c.path(file)
	if err := os.WriteFile(p, []byte(manifests), 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.mustKubectl(ctx, "apply", "-f", p)
}

// pod is what the test reads of a pod from `kubectl get -o json`.
type pod struct {
	Metadata struct {
		Name, Namespace, UID string
	}
	Spec struct {
		NodeName        string         `json:"nodeName"`
		SecurityContext map[string]any `json:"securityContext"`
		Containers      []struct {
			Name            string
			SecurityContext map[string]any `json:"securityContext"`
		}
	}
	Status struct {
		Phase, PodIP      string
		Conditions        []struct{ Type, Status string }
		ContainerStatuses []struct{ Name, ContainerID string }
	}
}

func (c *cluster) getPod(ctx context.Context, ns, name string) (pod, error) {
	var p pod
	out, err := c.kubectl(ctx, "get", "pod", "-n", ns, name, "-o", "json")
	if err != nil {
		return p, err
	}
	return p, json.Unmarshal([]byte(out), &p)
}

func (p pod) ready() bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == "Ready" {
			return cond.Status == "True"
		}
	}
	return false
}

// agentReady waits for the DaemonSet's pod in ns (other than old) to be
// Ready and returns it.
func (c *cluster) agentReady(ctx context.Context, ns, old string) pod {
	var p pod
	c.waitFor(ctx, "the agent's pod Ready in "+ns, func() error {
		out, err := c.kubectl(ctx, "get", "pods", "-n", ns, "-l", "app.kubernetes.io/name=autoglm-ebpf", "-o", "jsonpath={.items[*].metadata.name}")
		if err != nil {
			return err
		}
		names := slices.DeleteFunc(strings.Fields(out), func(n string) bool { return n == old })
		if len(names) != 1 {
			return fmt.Errorf("agent pods: %q", out)
		}
		if p, err = c.getPod(ctx, ns, names[0]); err != nil {
			return err
		}
		if !p.ready() {
			return fmt.Errorf("%s not Ready: %+v", p.Metadata.Name, p.Status)
		}
		return nil
	})
	return p
}

func (c *cluster) podRunning(ctx context.Context, ns, name string) pod {
	var p pod
	c.waitFor(ctx, "pod "+ns+"/"+name+" Running", func() error {
		var err error
		if p, err = c.getPod(ctx, ns, name); err != nil {
			return err
		}
		if !p.ready() {
			return fmt.Errorf("not Ready: %+v", p.Status)
		}
		return nil
	})
	return p
}

// checkSecurityContext compares the running agent's pod and container
// securityContext with the DaemonSet's in the manifests applied.
func checkSecurityContext(t *testing.T, manifests string, running pod) {
	for _, doc := range strings.Split(manifests, "\n---\n") {
		var ds struct {
			Kind string
			Spec struct {
				Template struct {
					Spec struct {
						SecurityContext map[string]any `json:"securityContext"`
						Containers      []struct {
							Name            string
							SecurityContext map[string]any `json:"securityContext"`
						}
					}
				}
			}
		}
		if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
			t.Fatal(err)
		}
		if ds.Kind != "DaemonSet" {
			continue
		}
		want := ds.Spec.Template.Spec
		if !reflect.DeepEqual(want.SecurityContext, running.Spec.SecurityContext) {
			t.Errorf("pod securityContext %v, the manifest's %v", running.Spec.SecurityContext, want.SecurityContext)
		}
		if len(want.Containers) != 1 || len(running.Spec.Containers) != 1 ||
			!reflect.DeepEqual(want.Containers[0].SecurityContext, running.Spec.Containers[0].SecurityContext) {
			t.Errorf("container securityContext %v, the manifest's %v", running.Spec.Containers, want.Containers)
		}
		checkSeccomp(t, want.SecurityContext, running)
		return
	}
	t.Fatal("no DaemonSet in the manifests")
}

// checkSeccomp checks that the agent's processes on the host run under the
// seccomp mode the pod's securityContext asks for: a filter (mode 2 in
// /proc/PID/status) for RuntimeDefault. The findings checked after show
// that the filter admits what the agent calls (bpf, perf_event_open).
func checkSeccomp(t *testing.T, podSC map[string]any, running pod) {
	prof, _ := podSC["seccompProfile"].(map[string]any)
	want := map[any]string{"RuntimeDefault": "2", "Localhost": "2", "Unconfined": "0"}[prof["type"]]
	if want == "" {
		t.Fatalf("the pod's seccompProfile %v: no expected mode", prof)
	}
	if len(running.Status.ContainerStatuses) != 1 {
		t.Fatalf("agent container statuses %+v", running.Status.ContainerStatuses)
	}
	_, id, _ := strings.Cut(running.Status.ContainerStatuses[0].ContainerID, "://")
	found := 0
	for _, pid := range clusterProcesses(*runDir) {
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if id == "" || !strings.Contains(string(cg), id) || err != nil {
			continue
		}
		found++
		for _, l := range strings.Split(string(status), "\n") {
			if mode, ok := strings.CutPrefix(l, "Seccomp:"); ok && strings.TrimSpace(mode) != want {
				t.Errorf("agent pid %d: Seccomp mode %s, want %s (seccompProfile %v)", pid, strings.TrimSpace(mode), want, prof)
			}
		}
	}
	if found == 0 {
		t.Fatalf("no process of the agent's container %q on the host", id)
	}
	t.Logf("the agent's %d processes run in seccomp mode %s (%v)", found, want, prof["type"])
}

func scrape(podIP string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get("http://" + podIP + ":9464/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(pmodel.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

func labels(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.Label {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// checkFindings waits for the fd leak and the GPU memory leak of the
// workload on the agent's /metrics, with the pod's labels as the API
// server has them (names only when the agent may read pods), and for each
// container's series: named, with its pod UID and container id on
// autoglm_container_info; unnamed, by the cgroup that holds its id.
func (c *cluster) checkFindings(ctx context.Context, t *testing.T, agent, work pod, named bool) {
	ids := map[string]string{}
	for _, s := range work.Status.ContainerStatuses {
		_, id, _ := strings.Cut(s.ContainerID, "://")
		ids[s.Name] = id
	}
	want := map[string]string{"fd_leak": "fds", "gpu_memory_leak": "gpu"}
	for kind, container := range want {
		expect := map[string]string{"kind": kind, "namespace": "", "pod": "", "container": ""}
		unit := map[string]string{"namespace": "", "pod": "", "container": ""}
		if named {
			expect["namespace"], expect["pod"], expect["container"] = work.Metadata.Namespace, work.Metadata.Name, container
			unit = map[string]string{"namespace": work.Metadata.Namespace, "pod": work.Metadata.Name, "container": container,
				"pod_uid": work.Metadata.UID, "container_id": ids[container]}
		}
		var seen []map[string]string
		err := poll(ctx, 3*time.Minute, func() error {
			fams, err := scrape(agent.Status.PodIP)
			if err != nil {
				return err
			}
			seen = nil
			found := false
			for _, m := range fams["autoglm_finding"].GetMetric() {
				l := labels(m)
				seen = append(seen, l)
				if m.GetGauge().GetValue() > 0 && matches(l, expect) {
					t.Logf("%s: autoglm_finding%v", agent.Metadata.Name, l)
					found = true
				}
			}
			if !found {
				return fmt.Errorf("no active autoglm_finding with %v", expect)
			}
			series := "autoglm_container_info"
			if !named {
				series = "autoglm_container_processes"
			}
			for _, m := range fams[series].GetMetric() {
				if l := labels(m); matches(l, unit) && (named || strings.Contains(l["cgroup"], ids[container])) {
					return nil
				}
			}
			return fmt.Errorf("no %s of container %s (%s) with %v", series, container, ids[container], unit)
		})
		if err != nil {
			t.Errorf("%v; findings seen: %v", err, seen)
		}
	}
}

// matches says whether labels has every label of want.
func matches(labels, want map[string]string) bool {
	for k, v := range want {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkEvent waits for the workload's fd leak as an event on its pod, in
// `kubectl get events` and in `kubectl describe pod` (which selects the
// pod's events by its UID too).
func (c *cluster) checkEvent(ctx context.Context, t *testing.T) {
	var last string
	err := poll(ctx, 3*time.Minute, func() error {
		out, err := c.kubectl(ctx, "get", "events", "-n", workNS, "--field-selector", "involvedObject.name="+workPod)
		if err != nil {
			return err
		}
		last = out
		// LAST SEEN, TYPE, REASON, OBJECT, MESSAGE
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			if len(f) > 4 && f[1] == "Warning" && f[2] == "FdLeak" && f[3] == "pod/"+workPod && strings.Contains(l, "cache_tokenizer") {
				t.Logf("kubectl get events -n %s --field-selector involvedObject.name=%s:\n%s", workNS, workPod, out)
				return nil
			}
		}
		return fmt.Errorf("no Warning FdLeak event on pod/%s naming cache_tokenizer", workPod)
	})
	if err != nil {
		t.Errorf("%v; kubectl get events shows:\n%s", err, last)
		return
	}
	described := c.mustKubectl(ctx, "describe", "pod", "-n", workNS, workPod)
	if _, events, _ := strings.Cut(described, "\nEvents:"); !strings.Contains(events, "FdLeak") {
		t.Errorf("kubectl describe pod shows no FdLeak event:%s", events)
	}
}

// checkRunbookConfirm follows docs/runbooks.md's confirm step for the
// workload's fd leak as an operator would: the host pid from the
// finding's series (the alert's pid label), the agent's pod on the node by
// label and node name, `attach --json -` in it through kubectl exec (its
// image has no shell, cat or tar), and the report from exec's standard
// output saved to a file that `autoglm-ebpf report` reads.
func (c *cluster) checkRunbookConfirm(ctx context.Context, t *testing.T, agent, work pod) {
	var pid string
	err := poll(ctx, 3*time.Minute, func() error {
		fams, err := scrape(agent.Status.PodIP)
		if err != nil {
			return err
		}
		for _, m := range fams["autoglm_finding"].GetMetric() {
			if l := labels(m); m.GetGauge().GetValue() > 0 && matches(l, map[string]string{"kind": "fd_leak", "namespace": workNS, "pod": workPod}) {
				pid = l["pid"]
				return nil
			}
		}
		return fmt.Errorf("no active fd_leak finding of %s/%s", workNS, workPod)
	})
	if err != nil {
		t.Fatal(err)
	}
	// The runbooks' other way to a container's host pids: the cgroup of
	// each names the container's id, whatever the driver.
	for _, s := range work.Status.ContainerStatuses {
		if s.Name != "fds" {
			continue
		}
		_, id, _ := strings.Cut(s.ContainerID, "://")
		if cg, err := os.ReadFile("/proc/" + pid + "/cgroup"); err != nil || !strings.Contains(string(cg), id) {
			t.Errorf("/proc/%s/cgroup does not name container fds (%s): %q, %v", pid, id, cg, err)
		}
	}
	out, err := c.kubectl(ctx, "-n", agentNS, "get", "pod", "-l", "app.kubernetes.io/name=autoglm-ebpf",
		"--field-selector", "spec.nodeName="+agent.Spec.NodeName, "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	if name := strings.TrimSpace(out); name != "pod/"+agent.Metadata.Name {
		t.Fatalf("the agent's pod on node %s: %q, want pod/%s", agent.Spec.NodeName, name, agent.Metadata.Name)
	}
	start := time.Now()
	out, err = c.kubectl(ctx, "-n", agentNS, "exec", "pod/"+agent.Metadata.Name, "--",
		"autoglm-ebpf", "attach", "--pid", pid, "--duration", "20s", "--json", "-")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("attach --pid %s in %s: %d bytes of report in %v", pid, agent.Metadata.Name, len(out), time.Since(start).Round(time.Second))
	file := c.path("runbook-" + pid + ".json")
	if err := os.WriteFile(file, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := report.Read(file)
	if err != nil {
		t.Fatalf("the report from kubectl exec's stdout: %v", err)
	}
	for _, f := range r.Findings {
		if f.Kind == "fd_leak" && strconv.Itoa(f.PID) == pid && slices.ContainsFunc(f.Stack, func(fr model.Frame) bool { return fr.Function == "cache_tokenizer" }) {
			t.Logf("report: %s", f.Summary)
			return
		}
	}
	t.Errorf("the report has no fd_leak of pid %s at cache_tokenizer: %+v", pid, r.Findings)
}

// monitoring starts Debian's Prometheus, scraping the agent's pod with the
// shipped rules, and Alertmanager.
func (c *cluster) monitoring(ctx context.Context, podIP string) {
	rules, _ := filepath.Abs("../../deploy/prometheus/autoglm-rules.yml")
	prom := fmt.Sprintf(`global: {scrape_interval: 5s, evaluation_interval: 5s}
rule_files: [%q]
alerting:
  alertmanagers: [{static_configs: [{targets: [%q]}]}]
scrape_configs:
  - job_name: autoglm-ebpf
    static_configs: [{targets: ["%s:9464"]}]
`, rules, alertsAddr, podIP)
	am := "route: {receiver: none, group_wait: 1s}\nreceivers: [{name: none}]\n"
	for f, s := range map[string]string{"prometheus.yml": prom, "alertmanager.yml": am} {
		if err := os.WriteFile(c.path(f), []byte(s), 0o644); err != nil {
			c.t.Fatal(err)
		}
	}
	c.start("alertmanager", "/usr/bin/prometheus-alertmanager", "--config.file="+c.path("alertmanager.yml"),
		"--storage.path="+c.path("alertmanager"), "--web.listen-address="+alertsAddr, "--cluster.listen-address=")
	c.start("prometheus", "/usr/bin/prometheus", "--config.file="+c.path("prometheus.yml"),
		"--storage.tsdb.path="+c.path("prometheus"), "--web.listen-address="+promAddr)
	c.waitHTTP(ctx, "Alertmanager", "http://"+alertsAddr+"/-/ready")
	c.waitHTTP(ctx, "Prometheus", "http://"+promAddr+"/-/ready")
}

// checkAlert waits for AutoglmFdLeak (for: 2m) to reach Alertmanager with
// the workload pod's namespace and name.
func (c *cluster) checkAlert(ctx context.Context, t *testing.T) {
	var last string
	err := poll(ctx, 5*time.Minute, func() error {
		resp, err := http.Get("http://" + alertsAddr + "/api/v2/alerts?filter=alertname%3D%22AutoglmFdLeak%22")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		last = string(body)
		var alerts []struct{ Labels map[string]string }
		if err := json.Unmarshal(body, &alerts); err != nil {
			return err
		}
		for _, a := range alerts {
			if a.Labels["namespace"] == workNS && a.Labels["pod"] == workPod {
				t.Logf("Alertmanager: %v", a.Labels)
				return nil
			}
		}
		return fmt.Errorf("no AutoglmFdLeak alert for %s/%s", workNS, workPod)
	})
	if err != nil {
		t.Errorf("%v; Alertmanager has %s", err, last)
	}
}

// bpfPrograms are the ids of the BPF programs loaded now.
func (c *cluster) bpfPrograms() []string {
	s, err := snapshotHost(c.dir)
	if err != nil {
		c.t.Fatal(err)
	}
	return s.Progs
}

// checkNoBPF waits for the programs the agent loaded (those in withAgent
// but not loaded before the run) to be gone: the agent's pod has ended
// once kubectl delete --wait returned, but its programs are freed when the
// last reference goes. Programs of others may come and go meanwhile.
func (c *cluster) checkNoBPF(ctx context.Context, t *testing.T, withAgent []string) {
	agents := slices.DeleteFunc(slices.Clone(withAgent), func(p string) bool { return slices.Contains(c.before.Progs, p) })
	if len(agents) == 0 {
		t.Fatalf("the agent loaded no BPF program: %d loaded with it, the same before", len(withAgent))
	}
	var left []string
	err := poll(ctx, 30*time.Second, func() error {
		now := c.bpfPrograms()
		left = slices.DeleteFunc(slices.Clone(agents), func(p string) bool { return !slices.Contains(now, p) })
		if len(left) > 0 {
			return fmt.Errorf("%d of the agent's %d BPF programs still loaded", len(left), len(agents))
		}
		return nil
	})
	if err != nil {
		t.Errorf("%v: %v", err, left)
	} else {
		t.Logf("the agent's %d BPF programs unloaded", len(agents))
	}
}

// renderChart renders deploy/helm/autoglm-ebpf as `helm template` does.
func renderChart(t *testing.T, values map[string]any) string {
	ch, err := loader.Load("../../deploy/helm/autoglm-ebpf")
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: "autoglm-ebpf", Namespace: helmNS, Revision: 1, IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, name := range slices.Sorted(maps.Keys(out)) {
		if strings.HasSuffix(name, ".yaml") && strings.TrimSpace(out[name]) != "" {
			docs = append(docs, out[name])
		}
	}
	return strings.Join(docs, "\n---\n")
}
