package deploy

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

const chartDir = "helm/autoglm-ebpf"

// chartFiles are the chart's copies of files kept elsewhere: a Helm chart
// cannot read outside its folder. -update copies them.
var chartFiles = map[string]string{
	chartDir + "/files/autoglm-rules.yml": rulesFile,
	chartDir + "/files/autoglm-ebpf.json": dashboardFile,
}

// minKube is the oldest Kubernetes the manifests and the chart support.
var minKube = chartutil.KubeVersion{Version: "v1.30.0", Major: "1", Minor: "30"}

// helmLabels are the labels the chart adds to the kustomize base's (whose
// app.kubernetes.io/instance is the default release's name).
var helmLabels = []string{"app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart"}

// renderChart renders the chart as `helm template autoglm-ebpf -n
// autoglm-ebpf` would with values over the defaults, and decodes each
// object strictly.
func renderChart(t *testing.T, values map[string]any) []manifest {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = minKube
	rv, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: "autoglm-ebpf", Namespace: namespace, Revision: 1, IsInstall: true}, caps)
	if err != nil {
		t.Fatal(err)
	}
	out, err := engine.Render(ch, rv)
	if err != nil {
		t.Fatal(err)
	}
	var ms []manifest
	for _, name := range slices.Sorted(maps.Keys(out)) {
		if !strings.HasSuffix(name, ".yaml") || strings.TrimSpace(out[name]) == "" {
			continue // NOTES.txt, helpers, a template switched off
		}
		ms = append(ms, decodeManifests(t, name, []byte(out[name]))...)
	}
	return ms
}

// `helm lint` with the default values and with every toggle on, against the
// oldest Kubernetes supported: no error, no warning.
func TestChartLint(t *testing.T) {
	for _, vals := range []map[string]any{nil, allToggles(), noEvents} {
		l := lint.AllWithKubeVersion(chartDir, vals, namespace, &minKube)
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint (values %v): %s", vals, m)
			}
		}
	}
}

// noEvents switches off what is on by default.
var noEvents = map[string]any{"kubernetesEvents": map[string]any{"enabled": false}}

func allToggles() map[string]any {
	return map[string]any{
		"serviceMonitor": map[string]any{"enabled": true},
		"prometheusRule": map[string]any{"enabled": true},
		"dashboard":      map[string]any{"enabled": true},
	}
}

// The chart's copies of the rule file and the dashboard are those files.
func TestChartFiles(t *testing.T) {
	for copyPath, src := range chartFiles {
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if *update {
			if err := os.WriteFile(copyPath, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := os.ReadFile(copyPath); err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s (go test ./deploy/ -run TestChartFiles -update copies it): %v", copyPath, src, err)
		}
	}
}

// With the default values (and the operator's objects on) the chart renders
// exactly the kustomize manifests, Helm's own labels aside: one source of
// truth, or this test fails on drift.
func TestChartMatchesKustomize(t *testing.T) {
	rendered := renderChart(t, map[string]any{"serviceMonitor": map[string]any{"enabled": true}, "prometheusRule": map[string]any{"enabled": true}})
	key := func(m manifest) string {
		meta := objectMeta(m.obj)
		return m.kind + "/" + meta.Namespace + "/" + meta.Name
	}
	want := map[string]manifest{}
	for _, m := range loadManifests(t) {
		if m.kind != "Namespace" { // the chart makes none, as the base
			want[key(m)] = m
		}
	}
	got := map[string]manifest{}
	for _, m := range rendered {
		stripHelmLabels(t, m)
		got[key(m)] = m
	}
	if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want))) {
		t.Fatalf("the chart renders %v, the kustomize manifests are %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	for k, g := range got {
		gj, err := json.MarshalIndent(g.obj, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		wj, err := json.MarshalIndent(want[k].obj, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(gj, wj) {
			t.Errorf("%s: the chart's (%s) differs from %s:\n%s", k, g.file, want[k].file, lineDiff(string(wj), string(gj)))
		}
	}
}

// stripHelmLabels takes Helm's labels off an object and its pod template,
// after checking they are there.
func stripHelmLabels(t *testing.T, m manifest) {
	t.Helper()
	strip := func(where string, labels map[string]string) {
		for _, l := range helmLabels {
			if labels[l] == "" {
				t.Errorf("%s %s: no label %s", m, where, l)
			}
			delete(labels, l)
		}
	}
	switch o := m.obj.(type) {
	case *serviceMonitor:
		strip("metadata", o.Labels)
	case *prometheusRule:
		strip("metadata", o.Labels)
	case *appsv1.DaemonSet:
		strip("metadata", o.Labels)
		strip("pod template", o.Spec.Template.Labels)
	case interface{ GetLabels() map[string]string }:
		strip("metadata", o.GetLabels())
	}
}

// lineDiff shows the lines of b that a lacks and the other way round.
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	var out []string
	for _, l := range al {
		if !slices.Contains(bl, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range bl {
		if !slices.Contains(al, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}

// The chart's DaemonSet and ClusterRole pass the manifests' assertions, with
// the defaults, with every toggle on and with events off; the values change
// what they say.
func TestChartValues(t *testing.T) {
	for _, tt := range []struct {
		vals   map[string]any
		events bool
	}{{nil, true}, {allToggles(), true}, {noEvents, false}} {
		ms := renderChart(t, tt.vals)
		checkDaemonSet(t, ms)
		// Findings as events by default, the events rule with them.
		checkRBAC(t, ms)
		if args := only[*appsv1.DaemonSet](t, ms).Spec.Template.Spec.Containers[0].Args; slices.Contains(args, "--kubernetes.events") != tt.events {
			t.Errorf("values %v: args %q, want --kubernetes.events: %v", tt.vals, args, tt.events)
		}
	}

	ms := renderChart(t, map[string]any{
		"image": map[string]any{"repository": "registry.example.com/autoglm-ebpf", "tag": "v9.9.9"},
		// Helm merges maps with the defaults: null removes a default key.
		"nodeSelector":     map[string]any{"cloud.google.com/gke-accelerator": "nvidia-h100-80gb", "nvidia.com/gpu.present": nil},
		"tolerations":      []any{map[string]any{"operator": "Exists"}},
		"priorityClass":    map[string]any{"create": false, "name": "site-agents"},
		"runtimeClassName": "nvidia",
		"args":             []any{"--all", "--max-processes=64"},
		"dashboard":        map[string]any{"enabled": true},
		"serviceMonitor":   map[string]any{"enabled": true, "labels": map[string]any{"release": "kube-prometheus-stack"}},
	})
	pod := only[*appsv1.DaemonSet](t, ms).Spec.Template.Spec
	c := pod.Containers[0]
	if c.Image != "registry.example.com/autoglm-ebpf:v9.9.9" || !slices.Equal(c.Args, []string{"daemon", "--all", "--max-processes=64", "--kubernetes.events"}) {
		t.Errorf("image %q, args %q", c.Image, c.Args)
	}
	if pod.NodeSelector["cloud.google.com/gke-accelerator"] != "nvidia-h100-80gb" || len(pod.NodeSelector) != 2 ||
		len(pod.Tolerations) != 1 || pod.PriorityClassName != "site-agents" || pod.RuntimeClassName == nil || *pod.RuntimeClassName != "nvidia" {
		t.Errorf("nodeSelector %v, tolerations %v, priorityClassName %q, runtimeClassName %v", pod.NodeSelector, pod.Tolerations, pod.PriorityClassName, pod.RuntimeClassName)
	}
	for _, m := range ms {
		if _, ok := m.obj.(*schedulingv1.PriorityClass); ok {
			t.Error("a PriorityClass rendered with priorityClass.create=false")
		}
	}
	if sm := only[*serviceMonitor](t, ms); sm.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("ServiceMonitor labels %v", sm.Labels)
	}
	cm := only[*corev1.ConfigMap](t, ms)
	dash, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if cm.Labels["grafana_dashboard"] != "1" || cm.Data["autoglm-ebpf.json"] != strings.TrimRight(string(dash), "\n") {
		t.Errorf("dashboard ConfigMap: labels %v, %d bytes of JSON (the file has %d)", cm.Labels, len(cm.Data["autoglm-ebpf.json"]), len(dash))
	}
	if filepath.Base(chartDir) != appName {
		t.Errorf("chart folder %s: want %s", chartDir, appName)
	}
}

// imageRepo is the image the manifests and the chart run.
const imageRepo = "ghcr.io/open-autoglm/autoglm-ebpf"

// The image is a release's tag, never latest, and one tag everywhere: the
// chart's appVersion (the chart's default image), the kustomize base's
// DaemonSet and the tag its kustomization.yaml sets. `make image` tags with
// `git describe`, which is vX.Y.Z on a release's commit.
func TestImageVersion(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	app := ch.Metadata.AppVersion
	if !regexp.MustCompile(`^v[0-9]+\.[0-9]+\.[0-9]+$`).MatchString(app) {
		t.Fatalf("Chart.yaml appVersion %q: want a release's tag, vX.Y.Z", app)
	}
	want := imageRepo + ":" + app
	if img := only[*appsv1.DaemonSet](t, renderChart(t, nil)).Spec.Template.Spec.Containers[0].Image; img != want {
		t.Errorf("the chart's default image %q, want %q", img, want)
	}
	if img := only[*appsv1.DaemonSet](t, loadManifests(t)).Spec.Template.Spec.Containers[0].Image; img != want {
		t.Errorf("kubernetes/base/daemonset.yaml: image %q, want %q (the chart's appVersion)", img, want)
	}
	data, err := os.ReadFile("kubernetes/base/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := decodeStrict(data, &k); err != nil {
		t.Fatal(err)
	}
	if len(k.Images) != 1 || k.Images[0].Name != imageRepo || k.Images[0].NewName != "" || k.Images[0].NewTag != app || k.Images[0].Digest != "" {
		t.Errorf("kubernetes/base/kustomization.yaml images %+v: want %s with newTag %s", k.Images, imageRepo, app)
	}
}
