package deploy

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

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

// release is a Helm release's name and namespace.
type release struct{ name, namespace string }

// defaultRelease is the install deploy/README.md shows, which renders the
// kustomize base.
var defaultRelease = release{"autoglm-ebpf", namespace}

// renderChart renders the chart as `helm template autoglm-ebpf -n
// autoglm-ebpf` would with values over the defaults, and decodes each
// object strictly.
func renderChart(t *testing.T, values map[string]any) []manifest {
	t.Helper()
	return renderRelease(t, defaultRelease, values)
}

// renderRelease renders the chart for release r with values over the
// defaults, and decodes each object strictly.
func renderRelease(t *testing.T, r release, values map[string]any) []manifest {
	t.Helper()
	out, err := renderValues(r, values)
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

// renderValues renders the chart's files for release r as `helm template`
// does, against the oldest Kubernetes supported: values over the defaults,
// checked against values.schema.json first.
func renderValues(r release, values map[string]any) (map[string]string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = minKube
	rv, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: r.name, Namespace: r.namespace, Revision: 1, IsInstall: true}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Render(ch, rv)
}

// `helm lint --strict` (a warning fails too) with the default values, with
// every toggle on, with events off and with every value set, against the
// oldest Kubernetes supported: no error, no warning.
func TestChartLint(t *testing.T) {
	for _, vals := range []map[string]any{nil, allToggles(), noEvents, allValues(t)} {
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
		"networkPolicy":  map[string]any{"enabled": true},
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
		// The chart makes no Namespace, as the base; the components are
		// opt-in (TestChartNetworkPolicy).
		if m.kind != "Namespace" && !strings.HasPrefix(m.file, componentsDir+"/") {
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

// With networkPolicy.enabled the chart renders the kustomize component's
// NetworkPolicy, Helm's labels aside; the values choose whom it admits, and
// none at all is refused rather than rendered as a policy admitting all.
func TestChartNetworkPolicy(t *testing.T) {
	policies := func(ms []manifest) []*networkingv1.NetworkPolicy {
		var nps []*networkingv1.NetworkPolicy
		for _, m := range ms {
			if np, ok := m.obj.(*networkingv1.NetworkPolicy); ok {
				stripHelmLabels(t, m)
				nps = append(nps, np)
			}
		}
		return nps
	}
	if nps := policies(renderChart(t, nil)); len(nps) != 0 {
		t.Errorf("the default values render %d NetworkPolicies, want none", len(nps))
	}
	var want *networkingv1.NetworkPolicy
	for _, m := range loadManifests(t) {
		if np, ok := m.obj.(*networkingv1.NetworkPolicy); ok && strings.HasPrefix(m.file, networkPolicyComponent+"/") {
			want = np
		}
	}
	if want == nil {
		t.Fatalf("no NetworkPolicy in %s", networkPolicyComponent)
	}
	ms := renderChart(t, map[string]any{"networkPolicy": map[string]any{"enabled": true}})
	nps := policies(ms)
	if len(nps) != 1 {
		t.Fatalf("networkPolicy.enabled renders %d NetworkPolicies, want 1", len(nps))
	}
	gj, err := json.MarshalIndent(nps[0], "", " ")
	if err != nil {
		t.Fatal(err)
	}
	wj, err := json.MarshalIndent(want, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gj, wj) {
		t.Errorf("the chart's NetworkPolicy differs from %s's:\n%s", networkPolicyComponent, lineDiff(string(wj), string(gj)))
	}

	// Helm merges maps with the defaults: selecting by another label
	// drops the default's with null, as values.yaml says.
	observability := map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": nil, "team": "observability"}}
	alloy := map[string]any{"podSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "alloy"}},
		"namespaceSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": "pyroscope"}}}
	alloyPeer := networkingv1.NetworkPolicyPeer{
		PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "alloy"}},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "pyroscope"}},
	}
	for _, tt := range []struct {
		vals map[string]any
		from []networkingv1.NetworkPolicyPeer
	}{
		{map[string]any{"enabled": true, "namespaceSelector": observability, "from": []any{alloy}}, []networkingv1.NetworkPolicyPeer{
			{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "observability"}}}, alloyPeer}},
		{map[string]any{"enabled": true, "namespaceSelector": nil, "from": []any{alloy}}, []networkingv1.NetworkPolicyPeer{alloyPeer}},
	} {
		ms := renderChart(t, map[string]any{"networkPolicy": tt.vals})
		nps := policies(ms)
		if len(nps) != 1 {
			t.Fatalf("values %v: %d NetworkPolicies, want 1", tt.vals, len(nps))
		}
		checkNetworkPolicy(t, nps[0], only[*appsv1.DaemonSet](t, ms))
		if got := nps[0].Spec.Ingress[0].From; !reflect.DeepEqual(got, tt.from) {
			t.Errorf("values %v: from %+v, want %+v", tt.vals, got, tt.from)
		}
	}
	_, err = renderValues(defaultRelease, map[string]any{"networkPolicy": map[string]any{"enabled": true, "namespaceSelector": nil}})
	if err == nil || !strings.Contains(err.Error(), "would admit every client") {
		t.Errorf("networkPolicy with no peers: %v, want an error saying it would admit every client", err)
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
	if pod.NodeSelector["cloud.google.com/gke-accelerator"] != "nvidia-h100-80gb" || len(pod.NodeSelector) != 1 ||
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

// allValuesFile sets every value of the chart to something other than its
// default.
const allValuesFile = "testdata/chart-all-values.yaml"

// allValues reads allValuesFile as `helm -f` does.
func allValues(t *testing.T) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(allValuesFile)
	if err != nil {
		t.Fatal(err)
	}
	return v.AsMap()
}

// jsonSchema is the part of a JSON Schema that says which keys there are.
type jsonSchema struct {
	Ref         string                 `json:"$ref"`
	Properties  map[string]*jsonSchema `json:"properties"`
	Definitions map[string]*jsonSchema `json:"definitions"`
}

// schemaKeys returns the path of each key the chart's schema knows that
// has no keys of its own (image.tag, nodeSelector, ...).
func schemaKeys(t *testing.T) [][]string {
	t.Helper()
	data, err := os.ReadFile(chartDir + "/values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var root jsonSchema
	if err := json.Unmarshal(data, &root); err != nil {
		t.Fatal(err)
	}
	var out [][]string
	var walk func(s *jsonSchema, path []string)
	walk = func(s *jsonSchema, path []string) {
		if name, ok := strings.CutPrefix(s.Ref, "#/definitions/"); ok {
			if s = root.Definitions[name]; s == nil {
				t.Fatalf("values.schema.json %s: no definition %s", strings.Join(path, "."), name)
			}
		}
		if len(s.Properties) == 0 {
			out = append(out, path)
			return
		}
		for _, k := range slices.Sorted(maps.Keys(s.Properties)) {
			walk(s.Properties[k], append(slices.Clone(path), k))
		}
	}
	walk(&root, nil)
	return out
}

// lookup returns the value at path in values.
func lookup(values map[string]any, path []string) (any, bool) {
	var v any = values
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

// The schema, values.yaml and the all-values file know the same keys:
// values.yaml documents each key the schema has, and the all-values file
// sets each to something else (the schema refuses keys it lacks, so the
// other way round holds by validation: TestChartLint).
func TestChartSchemaKeys(t *testing.T) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	all := allValues(t)
	keys := schemaKeys(t)
	if len(keys) < 20 {
		t.Fatalf("the schema knows only %v", keys)
	}
	for _, path := range keys {
		def, ok := lookup(ch.Values, path)
		if !ok {
			t.Errorf("values.yaml has no %s, which the schema knows", strings.Join(path, "."))
		}
		v, ok := lookup(all, path)
		if !ok {
			t.Errorf("%s does not set %s", allValuesFile, strings.Join(path, "."))
		} else if reflect.DeepEqual(v, def) {
			t.Errorf("%s sets %s to its default %v", allValuesFile, strings.Join(path, "."), v)
		}
	}
}

// The schema refuses a misspelt key, at the top and in a block, a value of
// the wrong type, and values the agent must not run with, naming each.
func TestChartSchemaRejects(t *testing.T) {
	for _, tt := range []struct {
		values map[string]any
		want   string
	}{
		{map[string]any{"imagePullSecret": []any{map[string]any{"name": "regcred"}}}, "'imagePullSecret'"},
		{map[string]any{"image": map[string]any{"tga": "v1.0.0"}}, "'tga'"},
		{map[string]any{"serviceMonitor": map[string]any{"enabled": "yes"}}, "/serviceMonitor/enabled"},
		{map[string]any{"extraArgs": "--all"}, "/extraArgs"},
		{map[string]any{"resources": map[string]any{"limits": map[string]any{"memory": "lots"}}}, "/resources/limits/memory"},
		{map[string]any{"image": map[string]any{"digest": "latest"}}, "/image/digest"},
		{map[string]any{"priorityClass": map[string]any{"value": 2000001000}}, "/priorityClass/value"},
		{map[string]any{"updateStrategy": map[string]any{"rollingUpdate": map[string]any{"maxSurge": 1}}}, "/updateStrategy/rollingUpdate/maxSurge"},
		{map[string]any{"podLabels": map[string]any{"app.kubernetes.io/instance": "x"}}, "propertyName 'app.kubernetes.io/instance'"},
	} {
		_, err := renderValues(defaultRelease, tt.values)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("values %v: error %v, want one naming %s", tt.values, err, tt.want)
		}
	}
}

// Each value of the all-values file lands where it should.
func TestChartAllValues(t *testing.T) {
	r := release{"gpu", "gpu-agents"}
	const name = "site-gpu-agent" // fullnameOverride
	ms := renderRelease(t, r, allValues(t))
	ds := only[*appsv1.DaemonSet](t, ms)
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]
	if ds.Name != name || ds.Namespace != r.namespace {
		t.Errorf("DaemonSet %s/%s, want %s/%s", ds.Namespace, ds.Name, r.namespace, name)
	}
	sel := map[string]string{"app.kubernetes.io/name": "gpu-agent", "app.kubernetes.io/instance": "gpu"} // nameOverride
	if !maps.Equal(ds.Spec.Selector.MatchLabels, sel) {
		t.Errorf("DaemonSet selector %v, want %v", ds.Spec.Selector.MatchLabels, sel)
	}
	if ds.Labels["app.kubernetes.io/version"] != "v9.9.9" {
		t.Errorf("version label %q, want the image's tag", ds.Labels["app.kubernetes.io/version"])
	}
	if want := "registry.example.com/autoglm-ebpf@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"; c.Image != want || c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("image %q %s, want %q Always", c.Image, c.ImagePullPolicy, want)
	}
	if !slices.Equal(pod.ImagePullSecrets, []corev1.LocalObjectReference{{Name: "regcred"}}) {
		t.Errorf("imagePullSecrets %v", pod.ImagePullSecrets)
	}
	if want := []string{"daemon", "--all", "--max-processes=64", "--web.config.file=/etc/autoglm/web.yml"}; !slices.Equal(c.Args, want) {
		t.Errorf("args %q, want %q (kubernetesEvents off, extraArgs last)", c.Args, want)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["GODEBUG"] != "madvdontneed=1" || env["GOMEMLIMIT"] != "200MiB" {
		t.Errorf("env %v: want extraEnv's GODEBUG and GOMEMLIMIT 200MiB", env)
	}
	if c.Resources.Limits.Memory().String() != "768Mi" || c.Resources.Requests.Cpu().String() != "100m" {
		t.Errorf("resources %v", c.Resources)
	}
	vol := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "web-config" })
	mnt := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "web-config" })
	if vol < 0 || pod.Volumes[vol].Secret == nil || pod.Volumes[vol].Secret.SecretName != "autoglm-web-config" ||
		mnt < 0 || c.VolumeMounts[mnt].MountPath != "/etc/autoglm" || !c.VolumeMounts[mnt].ReadOnly {
		t.Errorf("volumes %v, mounts %v: want the Secret autoglm-web-config at /etc/autoglm", pod.Volumes, c.VolumeMounts)
	}
	// Maps merge with the defaults.
	if pod.NodeSelector["cloud.google.com/gke-accelerator"] != "nvidia-h100-80gb" || pod.NodeSelector["nvidia.com/gpu.present"] != "true" {
		t.Errorf("nodeSelector %v", pod.NodeSelector)
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Operator != corev1.TolerationOpExists || pod.Tolerations[0].Key != "" {
		t.Errorf("tolerations %v", pod.Tolerations)
	}
	if a := pod.Affinity; a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil ||
		a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Key != "example.com/gpu-pool" {
		t.Errorf("affinity %+v", pod.Affinity)
	}
	tm := ds.Spec.Template.ObjectMeta
	if tm.Annotations["example.com/owner"] != "gpu-platform" || tm.Annotations["container.apparmor.security.beta.kubernetes.io/autoglm-ebpf"] != "runtime/default" {
		t.Errorf("pod annotations %v: want podAnnotations and the AppArmor annotation of podSecurityContext", tm.Annotations)
	}
	if tm.Labels["example.com/team"] != "gpu-platform" || !labelsMatch(sel, tm.Labels) || ds.Labels["example.com/team"] != "" {
		t.Errorf("pod labels %v, DaemonSet labels %v: want podLabels on the pod only", tm.Labels, ds.Labels)
	}
	if psc := pod.SecurityContext; psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeUnconfined ||
		psc.AppArmorProfile == nil || psc.AppArmorProfile.Type != corev1.AppArmorProfileTypeRuntimeDefault || psc.RunAsUser == nil || *psc.RunAsUser != 0 {
		t.Errorf("pod securityContext %+v: want Unconfined seccomp (an older runtime's node), RuntimeDefault AppArmor, runAsUser 0 kept", psc)
	}
	if sc := c.SecurityContext; sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"BPF", "PERFMON"}) ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container securityContext %+v: want BPF and PERFMON added, ALL dropped", sc)
	}
	if us := ds.Spec.UpdateStrategy; us.Type != appsv1.OnDeleteDaemonSetStrategyType || us.RollingUpdate == nil ||
		us.RollingUpdate.MaxUnavailable.String() != "1" || us.RollingUpdate.MaxSurge.String() != "0%" {
		t.Errorf("updateStrategy %+v: want OnDelete, maxUnavailable 1, maxSurge 0%%", us)
	}
	if pod.PriorityClassName != "site-agents" || pod.RuntimeClassName == nil || *pod.RuntimeClassName != "nvidia" || pod.ServiceAccountName != "site-agent" {
		t.Errorf("priorityClassName %q, runtimeClassName %v, serviceAccountName %q", pod.PriorityClassName, pod.RuntimeClassName, pod.ServiceAccountName)
	}
	for _, m := range ms {
		switch m.obj.(type) {
		case *schedulingv1.PriorityClass, *corev1.ServiceAccount, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding:
			t.Errorf("%s rendered with priorityClass, serviceAccount and rbac create=false", m.kind)
		}
	}

	svc := only[*corev1.Service](t, ms)
	if svc.Name != name || !maps.Equal(svc.Spec.Selector, sel) {
		t.Errorf("Service %s selects %v, want %s selecting %v", svc.Name, svc.Spec.Selector, name, sel)
	}
	sm := only[*serviceMonitor](t, ms)
	ep := sm.Spec.Endpoints[0]
	if sm.Name != name || sm.Labels["release"] != "kube-prometheus-stack" || !maps.Equal(sm.Spec.Selector.MatchLabels, sel) ||
		ep.Interval != "30s" || ep.ScrapeTimeout != "20s" || sm.Spec.SampleLimit != 50000 {
		t.Errorf("ServiceMonitor %s: labels %v, selector %v, interval %s, scrapeTimeout %s, sampleLimit %d",
			sm.Name, sm.Labels, sm.Spec.Selector.MatchLabels, ep.Interval, ep.ScrapeTimeout, sm.Spec.SampleLimit)
	}
	// The shipped relabelings stay, the value's come after them.
	if n := len(ep.Relabelings); n != 3 || ep.Relabelings[0].TargetLabel != "node" || ep.Relabelings[2].TargetLabel != "cluster" {
		t.Errorf("ServiceMonitor relabelings %+v", ep.Relabelings)
	}
	if len(ep.MetricRelabelings) != 1 || ep.MetricRelabelings[0].Regex != "go_gc_.*" || ep.MetricRelabelings[0].Action != "drop" {
		t.Errorf("ServiceMonitor metricRelabelings %+v", ep.MetricRelabelings)
	}
	if pr := only[*prometheusRule](t, ms); pr.Name != name || pr.Labels["release"] != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule %s labels %v", pr.Name, pr.Labels)
	}
	if cm := only[*corev1.ConfigMap](t, ms); cm.Name != name+"-dashboard" || cm.Labels["grafana_folder"] != "GPU" || cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap %s labels %v", cm.Name, cm.Labels)
	}

	// What create=false leaves out, with create=true: the ServiceAccount
	// named and annotated, bound to the ClusterRole; the PriorityClass named
	// and valued.
	over := allValues(t)
	over["serviceAccount"].(map[string]any)["create"] = true
	over["rbac"].(map[string]any)["create"] = true
	over["priorityClass"].(map[string]any)["create"] = true
	ms = renderRelease(t, r, over)
	checkRBAC(t, ms)
	sa := only[*corev1.ServiceAccount](t, ms)
	if sa.Name != "site-agent" || sa.Annotations["iam.gke.io/gcp-service-account"] != "gpu-agent@example.iam.gserviceaccount.com" {
		t.Errorf("ServiceAccount %s annotations %v", sa.Name, sa.Annotations)
	}
	if role := only[*rbacv1.ClusterRole](t, ms); role.Name != name {
		t.Errorf("ClusterRole %s, want %s", role.Name, name)
	}
	pc := only[*schedulingv1.PriorityClass](t, ms)
	if pc.Name != "site-agents" || pc.Value != 999999 || only[*appsv1.DaemonSet](t, ms).Spec.Template.Spec.PriorityClassName != pc.Name {
		t.Errorf("PriorityClass %s value %d", pc.Name, pc.Value)
	}
}

// The PriorityClass: the release's own by default, an existing one by
// name, or none (the cluster's default priority).
func TestChartPriorityClass(t *testing.T) {
	ms := renderRelease(t, release{"gpu", "gpu-agents"}, nil)
	if pc := only[*schedulingv1.PriorityClass](t, ms); pc.Name != "gpu-autoglm-ebpf-node-agent" ||
		only[*appsv1.DaemonSet](t, ms).Spec.Template.Spec.PriorityClassName != pc.Name {
		t.Errorf("release gpu: PriorityClass %s, pod's %q", pc.Name, only[*appsv1.DaemonSet](t, ms).Spec.Template.Spec.PriorityClassName)
	}
	ms = renderChart(t, map[string]any{"priorityClass": map[string]any{"create": false}})
	if pcn := only[*appsv1.DaemonSet](t, ms).Spec.Template.Spec.PriorityClassName; pcn != "" {
		t.Errorf("priorityClass.create=false without a name: the pod asks for %q", pcn)
	}
	for _, m := range ms {
		if m.kind == "PriorityClass" {
			t.Errorf("a PriorityClass rendered with priorityClass.create=false")
		}
	}
}

// objectKey names an object as the API server does: kind, namespace (none
// for cluster-scoped objects) and name.
func objectKey(m manifest) string {
	meta := objectMeta(m.obj)
	return m.kind + " " + meta.Namespace + "/" + meta.Name
}

// Two releases share no object, with each other or with the kustomize
// install: in two namespaces, in one namespace (where neither selects the
// other's pods or Service either), and with the longest release name Helm
// allows (names cut to 63 characters, still valid and distinct).
func TestChartTwoReleases(t *testing.T) {
	long := strings.Repeat("r", 53) // Helm's limit on a release name
	for _, rs := range [][2]release{
		{{"gpu-a", "a"}, {"gpu-b", "b"}},
		{{"gpu-a", "gpu"}, {"gpu-b", "gpu"}},
		{{long + "", "gpu"}, {long[:52] + "s", "gpu"}},
	} {
		owner := map[string]string{} // object -> who makes it
		for _, m := range loadManifests(t) {
			owner[objectKey(m)] = "the kustomize install"
		}
		var sets [2][]manifest
		for i, r := range rs {
			sets[i] = renderRelease(t, r, allToggles())
			for _, m := range sets[i] {
				k := objectKey(m)
				if o, dup := owner[k]; dup {
					t.Errorf("release %s in %s renders %s, which %s has too", r.name, r.namespace, k, o)
				}
				owner[k] = "release " + r.name
				checkNames(t, m)
			}
		}
		if rs[0].namespace != rs[1].namespace {
			continue
		}
		a, b := sets[0], sets[1]
		dsA, dsB := only[*appsv1.DaemonSet](t, a), only[*appsv1.DaemonSet](t, b)
		selA, err := metav1.LabelSelectorAsSelector(dsA.Spec.Selector)
		if err != nil {
			t.Fatal(err)
		}
		if selA.Matches(labels.Set(dsB.Spec.Template.Labels)) || labelsMatch(only[*corev1.Service](t, a).Spec.Selector, dsB.Spec.Template.Labels) {
			t.Errorf("releases %s and %s in one namespace: %s's DaemonSet or Service selects %s's pods", rs[0].name, rs[1].name, rs[0].name, rs[1].name)
		}
		if labelsMatch(only[*serviceMonitor](t, a).Spec.Selector.MatchLabels, only[*corev1.Service](t, b).Labels) {
			t.Errorf("releases %s and %s in one namespace: %s's ServiceMonitor selects %s's Service", rs[0].name, rs[1].name, rs[0].name, rs[1].name)
		}
	}
}

// checkNames holds an object's name and labels to what the API server
// takes: a Service's name is a DNS label, every other name a DNS
// subdomain, label values at most 63 characters.
func checkNames(t *testing.T, m manifest) {
	t.Helper()
	meta := objectMeta(m.obj)
	errs := validation.IsDNS1123Subdomain(meta.Name)
	if m.kind == "Service" || m.kind == "DaemonSet" {
		// A DaemonSet's name prefixes its pods' and labels them.
		errs = validation.IsDNS1035Label(meta.Name)
	}
	for k, v := range meta.Labels {
		for _, e := range validation.IsValidLabelValue(v) {
			errs = append(errs, k+": "+e)
		}
	}
	if len(errs) > 0 {
		t.Errorf("%s: %v", objectKey(m), errs)
	}
}
