package deploy

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/gpuxid"
	"github.com/open-autoglm/autoglm-ebpf/pkg/metrics"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var update = flag.Bool("update", false, "regenerate kubernetes/prometheus-operator/prometheusrule.yaml from prometheus/autoglm-rules.yml")

const (
	namespace   = "autoglm-ebpf"
	appName     = "autoglm-ebpf"
	metricsPort = 9464
	// The agent's memory limit. Not below minMemoryLimit: the BPF maps alone
	// are charged ~100 MiB to the pod (measured peak 142 MiB on 2 CPUs), and
	// a map that does not fit is silently not created. Not above
	// maxMemoryLimit: maps for 256 CPUs plus the Go process. See README.md,
	// "Sizing".
	minMemoryLimit = "192Mi"
	maxMemoryLimit = "1Gi"
	rulesFile      = "prometheus/autoglm-rules.yml"
	rulesTestFile  = "prometheus/autoglm-rules.test.yml"
	promConfigFile = "prometheus/prometheus.yml"
	ruleCRFile     = "kubernetes/prometheus-operator/prometheusrule.yaml"
	dashboardFile  = "grafana/autoglm-ebpf.json"
)

// The kustomize components, opt-in parts an overlay adds, and the
// NetworkPolicy's among them.
const (
	componentsDir          = "kubernetes/components"
	networkPolicyComponent = componentsDir + "/networkpolicy"
)

// allowedCapabilities are the only capabilities the agent may add, and why.
var allowedCapabilities = map[corev1.Capability]string{
	"BPF":             "create maps, load programs",
	"PERFMON":         "attach tracepoints and uprobes, read user stacks",
	"SYS_PTRACE":      "read /proc/PID/{fd,maps,root} of other pods' processes",
	"DAC_READ_SEARCH": "read other containers' libraries through /proc/PID/root",
}

// allowedHostPaths are the host directories the agent may mount (read-only).
var allowedHostPaths = map[string]bool{
	"/sys/kernel/tracing": true,
	"/sys/kernel/debug":   true,
	"/sys/kernel/btf":     true,
	"/sys/fs/cgroup":      true,
	"/proc":               true,
}

// ---------------------------------------------------------------- manifests

// manifest is one decoded YAML document of kubernetes/.
type manifest struct {
	file string // relative to deploy/
	doc  int
	kind string
	obj  any // *appsv1.DaemonSet, *corev1.Service, ..., *serviceMonitor, *prometheusRule
}

func (m manifest) String() string { return fmt.Sprintf("%s#%d (%s)", m.file, m.doc, m.kind) }

// manifestTypes are the apiVersion/kind pairs the manifests may hold, each
// with the type it is decoded into.
var manifestTypes = map[string]func() any{
	"v1/Namespace":      func() any { return &corev1.Namespace{} },
	"v1/ServiceAccount": func() any { return &corev1.ServiceAccount{} },
	"v1/Service":        func() any { return &corev1.Service{} },
	"v1/ConfigMap":      func() any { return &corev1.ConfigMap{} },
	"rbac.authorization.k8s.io/v1/ClusterRole":        func() any { return &rbacv1.ClusterRole{} },
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding": func() any { return &rbacv1.ClusterRoleBinding{} },
	"apps/v1/DaemonSet":                               func() any { return &appsv1.DaemonSet{} },
	"scheduling.k8s.io/v1/PriorityClass":              func() any { return &schedulingv1.PriorityClass{} },
	"networking.k8s.io/v1/NetworkPolicy":              func() any { return &networkingv1.NetworkPolicy{} },
	"monitoring.coreos.com/v1/ServiceMonitor":         func() any { return &serviceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule":         func() any { return &prometheusRule{} },
}

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor
// (monitoring.coreos.com/v1) these manifests may use; decoding rejects
// anything else, so a typo in a field name fails.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		SampleLimit       uint64               `json:"sampleLimit,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector"`
		Endpoints []struct {
			Port              string         `json:"port,omitempty"`
			Path              string         `json:"path,omitempty"`
			Scheme            string         `json:"scheme,omitempty"`
			Interval          string         `json:"interval,omitempty"`
			ScrapeTimeout     string         `json:"scrapeTimeout,omitempty"`
			HonorLabels       bool           `json:"honorLabels,omitempty"`
			HonorTimestamps   *bool          `json:"honorTimestamps,omitempty"`
			TLSConfig         map[string]any `json:"tlsConfig,omitempty"`
			Relabelings       []relabeling   `json:"relabelings,omitempty"`
			MetricRelabelings []relabeling   `json:"metricRelabelings,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

type relabeling struct {
	SourceLabels []string `json:"sourceLabels,omitempty"`
	Separator    *string  `json:"separator,omitempty"`
	TargetLabel  string   `json:"targetLabel,omitempty"`
	Regex        string   `json:"regex,omitempty"`
	Modulus      uint64   `json:"modulus,omitempty"`
	Replacement  *string  `json:"replacement,omitempty"`
	Action       string   `json:"action,omitempty"`
}

// prometheusRule is the Prometheus Operator's PrometheusRule; its spec is a
// Prometheus rule file.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              ruleFile `json:"spec"`
}

// ruleFile is a Prometheus rule file (and a PrometheusRule's spec).
type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Limit    int    `json:"limit,omitempty"`
	Rules    []rule `json:"rules"`
}

type rule struct {
	Record        string            `json:"record,omitempty"`
	Alert         string            `json:"alert,omitempty"`
	Expr          string            `json:"expr"`
	For           string            `json:"for,omitempty"`
	KeepFiringFor string            `json:"keep_firing_for,omitempty"`
	Labels        map[string]string `json:"labels,omitempty"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// kustomization is the part of a Kustomization these files may use.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace,omitempty"`
	Resources  []string `json:"resources,omitempty"`
	Components []string `json:"components,omitempty"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// decodeStrict decodes YAML into v, failing on duplicate keys and on fields
// v's type does not have. Field names are matched case-sensitively, as the
// API server does (encoding/json with DisallowUnknownFields would take
// hostPid for hostPID): sigs.k8s.io/json is the API machinery's decoder.
func decodeStrict(data []byte, v any) error {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(j, v)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// splitDocuments splits a multi-document YAML file, dropping empty documents.
func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur []string
	flush := func() {
		doc := strings.Join(cur, "\n")
		cur = nil
		for _, l := range strings.Split(doc, "\n") {
			if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
				docs = append(docs, []byte(doc))
				return
			}
		}
	}
	for _, l := range strings.Split(string(data), "\n") {
		if strings.TrimRight(l, " \t") == "---" {
			flush()
			continue
		}
		cur = append(cur, l)
	}
	flush()
	return docs
}

// yamlFiles returns the .yaml/.yml files under dir (relative to deploy/), sorted.
func yamlFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

func isKustomization(p string) bool {
	b := filepath.Base(p)
	return b == "kustomization.yaml" || b == "kustomization.yml" || b == "Kustomization"
}

// loadManifests decodes every manifest under kubernetes/ strictly into its
// Kubernetes (or local CRD) type.
func loadManifests(t *testing.T) []manifest {
	t.Helper()
	var out []manifest
	for _, f := range yamlFiles(t, "kubernetes") {
		if isKustomization(f) {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, decodeManifests(t, f, data)...)
	}
	if len(out) == 0 {
		t.Fatal("no manifests under kubernetes/")
	}
	return out
}

// decodeManifests decodes the YAML documents of one file strictly.
func decodeManifests(t *testing.T, file string, data []byte) []manifest {
	t.Helper()
	var out []manifest
	for i, doc := range splitDocuments(data) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			t.Fatalf("%s#%d: %v", file, i, err)
		}
		newObj, ok := manifestTypes[tm.APIVersion+"/"+tm.Kind]
		if !ok {
			t.Fatalf("%s#%d: unexpected apiVersion/kind %q/%q (add it to manifestTypes with its type)", file, i, tm.APIVersion, tm.Kind)
		}
		obj := newObj()
		if err := decodeStrict(doc, obj); err != nil {
			t.Fatalf("%s#%d (%s): %v", file, i, tm.Kind, err)
		}
		out = append(out, manifest{file: file, doc: i, kind: tm.Kind, obj: obj})
	}
	return out
}

// only returns the single object of type T among ms.
func only[T any](t *testing.T, ms []manifest) T {
	t.Helper()
	var found []T
	for _, m := range ms {
		if o, ok := m.obj.(T); ok {
			found = append(found, o)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want exactly one %T in the manifests, found %d", zero, len(found))
	}
	return found[0]
}

func TestManifestsDecodeStrictly(t *testing.T) {
	ms := loadManifests(t)
	kinds := map[string]int{}
	names := map[string]string{}
	for _, m := range ms {
		kinds[m.kind]++
		meta := objectMeta(m.obj)
		if meta.Name == "" {
			t.Errorf("%s: no metadata.name", m)
		}
		key := m.kind + "/" + meta.Namespace + "/" + meta.Name
		if prev, dup := names[key]; dup {
			t.Errorf("%s: %s is also defined in %s", m, key, prev)
		}
		names[key] = m.String()
		// Everything namespaced lives in the agent's namespace.
		switch m.obj.(type) {
		case *corev1.Namespace, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, *schedulingv1.PriorityClass:
			if meta.Namespace != "" {
				t.Errorf("%s: cluster-scoped object with namespace %q", m, meta.Namespace)
			}
		default:
			if meta.Namespace != namespace {
				t.Errorf("%s: namespace %q, want %q", m, meta.Namespace, namespace)
			}
		}
		if meta.Labels["app.kubernetes.io/name"] != appName {
			t.Errorf("%s: label app.kubernetes.io/name = %q, want %q", m, meta.Labels["app.kubernetes.io/name"], appName)
		}
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "DaemonSet", "Service", "ServiceMonitor", "PrometheusRule"} {
		if kinds[k] != 1 {
			t.Errorf("%d %s objects, want 1", kinds[k], k)
		}
	}
	ns := only[*corev1.Namespace](t, ms)
	if ns.Name != namespace {
		t.Errorf("Namespace %q, want %q", ns.Name, namespace)
	}
	// The base makes no Namespace: put into another namespace by an
	// overlay, it must not relabel that namespace (PSA) or make one.
	for _, m := range ms {
		if _, ok := m.obj.(*corev1.Namespace); ok && strings.HasPrefix(m.file, "kubernetes/base/") {
			t.Errorf("%s: a Namespace in the base", m)
		}
	}
	// hostPID, hostPath and the added capabilities are beyond "baseline".
	if got := ns.Labels["pod-security.kubernetes.io/enforce"]; got != "privileged" {
		t.Errorf("namespace pod-security enforce = %q, want privileged (hostPID, hostPath, capabilities)", got)
	}
}

func objectMeta(obj any) metav1.ObjectMeta {
	switch o := obj.(type) {
	case *serviceMonitor:
		return o.ObjectMeta
	case *prometheusRule:
		return o.ObjectMeta
	case metav1.Object:
		return metav1.ObjectMeta{Name: o.GetName(), Namespace: o.GetNamespace(), Labels: o.GetLabels()}
	}
	panic(fmt.Sprintf("no metadata in %T", obj))
}

func TestDecodeStrictRejectsUnknownFields(t *testing.T) {
	// The guard the manifest checks rely on: a misspelt field must fail.
	bad := "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      hostPid: true\n"
	if err := decodeStrict([]byte(bad), &appsv1.DaemonSet{}); err == nil {
		t.Error("a DaemonSet with hostPid (for hostPID) decoded without error")
	}
	dup := "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nmetadata: {name: y}\n"
	if err := decodeStrict([]byte(dup), &corev1.Service{}); err == nil {
		t.Error("a duplicate key decoded without error")
	}
	if err := decodeStrict([]byte("spec: {endpoint: []}\n"), &serviceMonitor{}); err == nil {
		t.Error("a ServiceMonitor with endpoint (for endpoints) decoded without error")
	}
}

// ------------------------------------------------------------- the DaemonSet

func TestDaemonSetSecurity(t *testing.T) {
	ms := loadManifests(t)
	checkDaemonSet(t, ms)
	// The shipped tolerations are no blanket one: a node tainted to keep
	// pods off (a dedicated pool) gets no agent.
	pod := only[*appsv1.DaemonSet](t, ms).Spec.Template.Spec
	dedicated := corev1.Taint{Key: "dedicated", Value: "infra", Effect: corev1.TaintEffectNoSchedule}
	if slices.ContainsFunc(pod.Tolerations, func(tl corev1.Toleration) bool { return tolerates(tl, dedicated) }) {
		t.Errorf("tolerations %v tolerate %s", pod.Tolerations, dedicated.ToString())
	}
}

// checkDaemonSet holds the DaemonSet of ms (the kustomize manifests, or
// what the Helm chart renders) to what the agent needs and no more.
func checkDaemonSet(t *testing.T, ms []manifest) {
	t.Helper()
	ds := only[*appsv1.DaemonSet](t, ms)
	pod := ds.Spec.Template.Spec

	if !pod.HostPID {
		t.Error("hostPID is not true: BPF and NVML name processes by host pid")
	}
	if pod.HostNetwork || pod.HostIPC {
		t.Errorf("hostNetwork=%v hostIPC=%v: neither is needed", pod.HostNetwork, pod.HostIPC)
	}
	// Its own class: evicted last, but never preempting a workload (the
	// system classes preempt).
	pc := only[*schedulingv1.PriorityClass](t, ms)
	if pod.PriorityClassName != pc.Name {
		t.Errorf("priorityClassName = %q, want the shipped PriorityClass %q", pod.PriorityClassName, pc.Name)
	}
	if pc.PreemptionPolicy == nil || *pc.PreemptionPolicy != corev1.PreemptNever || pc.GlobalDefault || pc.Value > 1000000000 || pc.Value < 1000000 {
		t.Errorf("PriorityClass %s: preemptionPolicy %v, globalDefault %v, value %d: want Never, false, high but not a system value",
			pc.Name, pc.PreemptionPolicy, pc.GlobalDefault, pc.Value)
	}
	sa := only[*corev1.ServiceAccount](t, ms)
	if pod.ServiceAccountName != sa.Name {
		t.Errorf("serviceAccountName = %q, the ServiceAccount is %q", pod.ServiceAccountName, sa.Name)
	}
	if pod.AutomountServiceAccountToken != nil && !*pod.AutomountServiceAccountToken {
		t.Error("automountServiceAccountToken is false: the daemon watches pods through the API server")
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("selector %v does not match the pod template's labels %v", sel, ds.Spec.Template.Labels)
	}
	if s := ds.Spec.UpdateStrategy; s.Type != appsv1.RollingUpdateDaemonSetStrategyType || s.RollingUpdate == nil || s.RollingUpdate.MaxUnavailable == nil {
		t.Errorf("updateStrategy %+v: want RollingUpdate with maxUnavailable", s)
	}
	if pod.NodeSelector["nvidia.com/gpu.present"] != "true" {
		t.Errorf("nodeSelector %v: want nvidia.com/gpu.present=true", pod.NodeSelector)
	}
	// The image is amd64 and arm64: GPU nodes of both (x86-64, Grace's
	// GH200 and GB200) get the pod, so no architecture is selected.
	if arch, ok := pod.NodeSelector["kubernetes.io/arch"]; ok {
		t.Errorf("nodeSelector %v selects kubernetes.io/arch=%s: want amd64 and arm64 nodes both", pod.NodeSelector, arch)
	}
	if pod.Affinity != nil {
		t.Errorf("affinity %+v: want none (amd64 and arm64 nodes both)", pod.Affinity)
	}
	// GPU nodes' own taint; and the NoExecute taints of GPU health
	// controllers, which would evict the agent from the very nodes whose
	// GPUs fail: tolerated for good, whatever their key.
	for _, taint := range []corev1.Taint{
		{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule},
		{Key: "nvidia.com/gpu", Value: "unhealthy", Effect: corev1.TaintEffectNoExecute},
		{Key: "gpu-health.example.com/xid", Value: "79", Effect: corev1.TaintEffectNoExecute},
		{Key: "example.com/gpu-health", Effect: corev1.TaintEffectNoExecute},
	} {
		if !slices.ContainsFunc(pod.Tolerations, func(tl corev1.Toleration) bool {
			return tolerates(tl, taint) && (taint.Effect != corev1.TaintEffectNoExecute || tl.TolerationSeconds == nil)
		}) {
			t.Errorf("tolerations %v: want %s tolerated (NoExecute: without tolerationSeconds)", pod.Tolerations, taint.ToString())
		}
	}

	containers := append(slices.Clone(pod.InitContainers), pod.Containers...)
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	for _, c := range containers {
		checkContainerSecurity(t, pod.SecurityContext, c)
		checkResources(t, c)
	}
	c := pod.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "daemon" {
		t.Errorf("args %q: want the daemon subcommand first", c.Args)
	}
	if i := strings.LastIndex(c.Image, "/"); !strings.ContainsAny(c.Image[i+1:], ":@") {
		t.Errorf("image %q has no tag or digest", c.Image)
	}
	checkEnv(t, c)
	checkProbes(t, c)
	checkVolumes(t, pod, c)
}

// tolerates reports whether tl tolerates taint, as the scheduler and the
// taint manager judge it.
func tolerates(tl corev1.Toleration, taint corev1.Taint) bool {
	if tl.Effect != "" && tl.Effect != taint.Effect || tl.Key != "" && tl.Key != taint.Key {
		return false
	}
	switch tl.Operator {
	case corev1.TolerationOpExists:
		return true
	case corev1.TolerationOpEqual, "":
		return tl.Key != "" && tl.Value == taint.Value
	}
	return false
}

func checkContainerSecurity(t *testing.T, podSC *corev1.PodSecurityContext, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil {
		t.Errorf("container %s: no securityContext", c.Name)
		return
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Errorf("container %s: privileged", c.Name)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("container %s: allowPrivilegeEscalation is not false", c.Name)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("container %s: readOnlyRootFilesystem is not true", c.Name)
	}
	// uid 0: capabilities reach the effective set only for root.
	uid := sc.RunAsUser
	if uid == nil && podSC != nil {
		uid = podSC.RunAsUser
	}
	if uid == nil || *uid != 0 {
		t.Errorf("container %s: runAsUser is not 0 (added capabilities are effective only for uid 0)", c.Name)
	}
	// The runtimes' default profiles admit bpf() and perf_event_open() with
	// CAP_BPF and CAP_PERFMON (containerd >= 1.6.9, containers/common >=
	// 0.60; make e2e runs the agent under containerd's): no reason to run
	// without a filter.
	prof := sc.SeccompProfile
	if prof == nil && podSC != nil {
		prof = podSC.SeccompProfile
	}
	if prof == nil || prof.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("container %s: seccompProfile %+v, want RuntimeDefault", c.Name, prof)
	}
	caps := sc.Capabilities
	if caps == nil {
		t.Errorf("container %s: no capabilities (must drop ALL)", c.Name)
		return
	}
	if !slices.Contains(caps.Drop, "ALL") {
		t.Errorf("container %s: capabilities.drop = %v, want ALL", c.Name, caps.Drop)
	}
	seen := map[corev1.Capability]bool{}
	for _, a := range caps.Add {
		name := corev1.Capability(strings.TrimPrefix(string(a), "CAP_"))
		if _, ok := allowedCapabilities[name]; !ok {
			t.Errorf("container %s: adds capability %s, allowed are only %v", c.Name, a, keys(allowedCapabilities))
		}
		if seen[name] {
			t.Errorf("container %s: capability %s added twice", c.Name, a)
		}
		seen[name] = true
	}
	for _, need := range []corev1.Capability{"BPF", "PERFMON"} {
		if !seen[need] {
			t.Errorf("container %s: does not add %s, without which no BPF program loads", c.Name, need)
		}
	}
}

func checkResources(t *testing.T, c corev1.Container) {
	t.Helper()
	r := c.Resources
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		req, okReq := r.Requests[name]
		lim, okLim := r.Limits[name]
		if !okReq || !okLim || req.IsZero() || lim.IsZero() {
			t.Errorf("container %s: %s request and limit must both be set (request %v, limit %v)", c.Name, name, req.String(), lim.String())
			continue
		}
		if req.Cmp(lim) > 0 {
			t.Errorf("container %s: %s request %s above its limit %s", c.Name, name, req.String(), lim.String())
		}
	}
	if lim, ok := r.Limits[corev1.ResourceMemory]; ok {
		if lim.Cmp(resource.MustParse(maxMemoryLimit)) > 0 {
			t.Errorf("container %s: memory limit %s above %s", c.Name, lim.String(), maxMemoryLimit)
		}
		if lim.Cmp(resource.MustParse(minMemoryLimit)) < 0 {
			t.Errorf("container %s: memory limit %s below %s: the BPF maps alone are charged ~100 MiB to the pod (README.md, Sizing)", c.Name, lim.String(), minMemoryLimit)
		}
	}
	// GOMEMLIMIT must leave room under the limit (the BPF maps are charged
	// to the pod's memory too).
	for _, e := range c.Env {
		if e.Name != "GOMEMLIMIT" {
			continue
		}
		v := strings.TrimSuffix(e.Value, "B") // Go: 56MiB; Kubernetes quantity: 56Mi
		q, err := resource.ParseQuantity(v)
		if err != nil {
			t.Errorf("container %s: GOMEMLIMIT %q: %v", c.Name, e.Value, err)
			continue
		}
		if lim, ok := r.Limits[corev1.ResourceMemory]; ok && q.Cmp(lim) >= 0 {
			t.Errorf("container %s: GOMEMLIMIT %s not below the memory limit %s", c.Name, e.Value, lim.String())
		}
	}
}

func checkEnv(t *testing.T, c corev1.Container) {
	t.Helper()
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if _, dup := env[e.Name]; dup {
			t.Errorf("env %s set twice", e.Name)
		}
		env[e.Name] = e
	}
	n := env["NODE_NAME"]
	if n.ValueFrom == nil || n.ValueFrom.FieldRef == nil || n.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME = %+v, want valueFrom.fieldRef.fieldPath spec.nodeName", n)
	}
	for name, want := range map[string]string{"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"} {
		if got := env[name]; got.Value != want || got.ValueFrom != nil {
			t.Errorf("%s = %q, want %q", name, got.Value, want)
		}
	}
}

func checkProbes(t *testing.T, c corev1.Container) {
	t.Helper()
	var port *corev1.ContainerPort
	for i, p := range c.Ports {
		if p.Name == "metrics" {
			port = &c.Ports[i]
		}
	}
	if port == nil || port.ContainerPort != metricsPort || (port.Protocol != "" && port.Protocol != corev1.ProtocolTCP) {
		t.Fatalf("ports %+v: want metrics on TCP %d", c.Ports, metricsPort)
	}
	for _, p := range []struct {
		name, path string
		probe      *corev1.Probe
	}{{"liveness", "/healthz", c.LivenessProbe}, {"readiness", "/readyz", c.ReadinessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s probe: want an httpGet on %s", p.name, p.path)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path {
			t.Errorf("%s probe path %q, want %q", p.name, g.Path, p.path)
		}
		if !(g.Port == intstr.FromString("metrics") || g.Port == intstr.FromInt32(metricsPort)) {
			t.Errorf("%s probe port %s, want metrics (%d)", p.name, g.Port.String(), metricsPort)
		}
	}
}

func checkVolumes(t *testing.T, pod corev1.PodSpec, c corev1.Container) {
	t.Helper()
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
		if v.HostPath == nil {
			continue
		}
		if !allowedHostPaths[v.HostPath.Path] {
			t.Errorf("volume %s mounts host path %s; allowed: %v", v.Name, v.HostPath.Path, keys(allowedHostPaths))
		}
	}
	mounted := map[string]string{}
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			t.Errorf("mount %s: no such volume", m.Name)
			continue
		}
		mounted[m.MountPath] = m.Name
		if v.HostPath != nil && !m.ReadOnly {
			t.Errorf("host path %s is mounted writable at %s", v.HostPath.Path, m.MountPath)
		}
		// Propagation from the host needs the host's mount to be shared or
		// slave: on hosts whose mounts are private the pod does not start.
		if m.MountPropagation != nil && *m.MountPropagation != corev1.MountPropagationNone {
			t.Errorf("mount %s asks for %s propagation: the pod fails to start on hosts with private mounts", m.MountPath, *m.MountPropagation)
		}
	}
	for _, p := range []string{"/sys/kernel/tracing", "/sys/kernel/btf", "/sys/fs/cgroup"} {
		name, ok := mounted[p]
		if !ok || vols[name].HostPath == nil || vols[name].HostPath.Path != p {
			t.Errorf("host %s is not mounted at %s", p, p)
		}
	}
	for _, v := range pod.Volumes {
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == v.Name }) {
			t.Errorf("volume %s is not mounted", v.Name)
		}
	}
}

func keys[K ~string, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// --------------------------------------------------------------------- RBAC

func TestRBAC(t *testing.T) {
	checkRBAC(t, loadManifests(t))
}

// checkRBAC holds the ClusterRole of ms to what the daemon does: read
// pods, and write events only with --kubernetes.events, as client-go's
// event recorder writes them (create, and patch for a repeat; both event
// APIs, as the kubelet's role has them).
func checkRBAC(t *testing.T, ms []manifest) {
	t.Helper()
	role := only[*rbacv1.ClusterRole](t, ms)
	if role.AggregationRule != nil {
		t.Errorf("ClusterRole %s: want explicit rules, not aggregated ones", role.Name)
	}
	want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}}
	args := only[*appsv1.DaemonSet](t, ms).Spec.Template.Spec.Containers[0].Args
	if slices.Contains(args, "--kubernetes.events") {
		want = append(want, rbacv1.PolicyRule{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}})
	}
	if !reflect.DeepEqual(role.Rules, want) {
		t.Errorf("ClusterRole %s rules %+v, want %+v for args %q", role.Name, role.Rules, want, args)
	}
	b := only[*rbacv1.ClusterRoleBinding](t, ms)
	sa := only[*corev1.ServiceAccount](t, ms)
	if b.RoleRef != (rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name}) {
		t.Errorf("ClusterRoleBinding roleRef %+v, want ClusterRole %s", b.RoleRef, role.Name)
	}
	if len(b.Subjects) != 1 || b.Subjects[0] != (rbacv1.Subject{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}) {
		t.Errorf("ClusterRoleBinding subjects %+v, want only ServiceAccount %s/%s", b.Subjects, sa.Namespace, sa.Name)
	}
}

// ---------------------------------------------------- Service, ServiceMonitor

func TestServiceAndServiceMonitor(t *testing.T) {
	ms := loadManifests(t)
	ds := only[*appsv1.DaemonSet](t, ms)
	svc := only[*corev1.Service](t, ms)
	sm := only[*serviceMonitor](t, ms)

	if len(svc.Spec.Selector) == 0 || !labelsMatch(svc.Spec.Selector, ds.Spec.Template.Labels) {
		t.Errorf("Service selector %v does not select the DaemonSet's pods %v", svc.Spec.Selector, ds.Spec.Template.Labels)
	}
	if len(svc.Spec.Ports) != 1 {
		t.Fatalf("Service ports %+v: want one", svc.Spec.Ports)
	}
	p := svc.Spec.Ports[0]
	if p.Name != "metrics" || p.Port != metricsPort || !(p.TargetPort == intstr.FromString("metrics") || p.TargetPort == intstr.FromInt32(metricsPort)) {
		t.Errorf("Service port %+v: want metrics, %d, to the container's metrics port", p, metricsPort)
	}

	sel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	if sel.Empty() || !sel.Matches(labels.Set(svc.Labels)) {
		t.Errorf("ServiceMonitor selector %v does not select the Service (labels %v)", sel, svc.Labels)
	}
	// Without a namespaceSelector the operator looks in the ServiceMonitor's
	// own namespace: it follows an overlay's `namespace:` with the Service.
	if sm.Spec.NamespaceSelector.Any || len(sm.Spec.NamespaceSelector.MatchNames) > 0 {
		t.Errorf("ServiceMonitor namespaceSelector %+v: want none (its own namespace, wherever it is applied)", sm.Spec.NamespaceSelector)
	}
	if len(sm.Spec.Endpoints) != 1 {
		t.Fatalf("ServiceMonitor endpoints: %d, want 1", len(sm.Spec.Endpoints))
	}
	ep := sm.Spec.Endpoints[0]
	if ep.Port != p.Name {
		t.Errorf("ServiceMonitor endpoint port %q, the Service's is %q", ep.Port, p.Name)
	}
	if ep.HonorLabels {
		t.Error("honorLabels: the agent pod's target labels would replace the process's empty ones")
	}
	var node, drop bool
	for _, r := range ep.Relabelings {
		if slices.Equal(r.SourceLabels, []string{"__meta_kubernetes_pod_node_name"}) && r.TargetLabel == "node" &&
			(r.Action == "" || r.Action == "replace") {
			node = true
		}
		if r.Action == "labeldrop" {
			re := regexp.MustCompile("^(?:" + r.Regex + ")$")
			drop = re.MatchString("namespace") && re.MatchString("pod") && re.MatchString("container") &&
				!re.MatchString("node") && !re.MatchString("job") && !re.MatchString("instance")
		}
	}
	if !node {
		t.Error("ServiceMonitor does not relabel __meta_kubernetes_pod_node_name into node")
	}
	if !drop {
		t.Error("ServiceMonitor does not drop its namespace/pod/container target labels (they would clash with the process's)")
	}
}

func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// ----------------------------------------------------------- NetworkPolicy

// The component's NetworkPolicy admits the metrics port of the agent's pods
// from the monitoring namespace only.
func TestNetworkPolicy(t *testing.T) {
	ms := loadManifests(t)
	var np *networkingv1.NetworkPolicy
	for _, m := range ms {
		if p, ok := m.obj.(*networkingv1.NetworkPolicy); ok {
			if !strings.HasPrefix(m.file, networkPolicyComponent+"/") || np != nil {
				t.Fatalf("%s: a NetworkPolicy outside %s, or a second one", m, networkPolicyComponent)
			}
			np = p
		}
	}
	if np == nil {
		t.Fatalf("no NetworkPolicy in %s", networkPolicyComponent)
	}
	checkNetworkPolicy(t, np, only[*appsv1.DaemonSet](t, ms))
	from := np.Spec.Ingress[0].From
	want := []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}}
	if !reflect.DeepEqual(from, want) {
		t.Errorf("NetworkPolicy from %+v, want only the namespace monitoring", from)
	}
}

// checkNetworkPolicy checks that np selects the pods of ds, restricts their
// ingress only (the agent must reach the API server) to the container's
// metrics port, and from some peers, not from everyone.
func checkNetworkPolicy(t *testing.T, np *networkingv1.NetworkPolicy, ds *appsv1.DaemonSet) {
	t.Helper()
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	if err != nil {
		t.Fatal(err)
	}
	if sel.Empty() || !sel.Matches(labels.Set(ds.Spec.Template.Labels)) {
		t.Errorf("NetworkPolicy podSelector %v does not select the DaemonSet's pods %v", sel, ds.Spec.Template.Labels)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) || len(np.Spec.Egress) > 0 {
		t.Errorf("NetworkPolicy policyTypes %v, egress %v: want Ingress only", np.Spec.PolicyTypes, np.Spec.Egress)
	}
	if ds.Spec.Template.Spec.HostNetwork {
		t.Error("the DaemonSet is on the host network, where a NetworkPolicy does not apply")
	}
	if len(np.Spec.Ingress) != 1 {
		t.Fatalf("NetworkPolicy ingress %+v: want one rule", np.Spec.Ingress)
	}
	rule := np.Spec.Ingress[0]
	// An empty from admits every source.
	if len(rule.From) == 0 {
		t.Error("NetworkPolicy admits every source (no from)")
	}
	for _, p := range rule.From {
		if p.NamespaceSelector != nil && p.NamespaceSelector.Size() == 0 && p.PodSelector == nil {
			t.Errorf("NetworkPolicy peer %+v selects every namespace", p)
		}
	}
	ports := ds.Spec.Template.Spec.Containers[0].Ports
	tcp := corev1.ProtocolTCP
	if len(rule.Ports) != 1 || rule.Ports[0].Port == nil || *rule.Ports[0].Port != intstr.FromString(ports[0].Name) ||
		rule.Ports[0].Protocol == nil || *rule.Ports[0].Protocol != tcp || ports[0].Name != "metrics" {
		t.Errorf("NetworkPolicy ports %+v, want the container's metrics port (%+v), TCP", rule.Ports, ports)
	}
}

// ------------------------------------------------------------ kustomizations

func TestKustomizationsListEveryFile(t *testing.T) {
	var dirs []string
	for _, f := range yamlFiles(t, "kubernetes") {
		if isKustomization(f) {
			dirs = append(dirs, filepath.Dir(f))
		}
	}
	if !slices.Contains(dirs, "kubernetes") {
		t.Fatal("no kubernetes/kustomization.yaml")
	}
	listed := map[string]bool{} // every file some kustomization lists
	for _, dir := range dirs {
		data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var k kustomization
		if err := decodeStrict(data, &k); err != nil {
			t.Fatalf("%s/kustomization.yaml: %v", dir, err)
		}
		// Under components/ the opt-in parts an overlay adds.
		want := "kustomize.config.k8s.io/v1beta1/Kustomization"
		if strings.HasPrefix(dir, componentsDir+"/") {
			want = "kustomize.config.k8s.io/v1alpha1/Component"
		}
		if got := k.APIVersion + "/" + k.Kind; got != want {
			t.Errorf("%s: apiVersion/kind %s, want %s", dir, got, want)
		}
		if k.Namespace != "" && k.Namespace != namespace {
			t.Errorf("%s: namespace %q, want %q", dir, k.Namespace, namespace)
		}
		for _, r := range append(slices.Clone(k.Resources), k.Components...) {
			p := filepath.Clean(filepath.Join(dir, r))
			if rel, err := filepath.Rel("kubernetes", p); err != nil || strings.HasPrefix(rel, "..") {
				t.Errorf("%s: resource %s is outside kubernetes/", dir, r)
				continue
			}
			st, err := os.Stat(p)
			if err != nil {
				t.Errorf("%s: resource %s: %v", dir, r, err)
				continue
			}
			if st.IsDir() {
				if _, err := os.Stat(filepath.Join(p, "kustomization.yaml")); err != nil {
					t.Errorf("%s: resource %s is a directory without kustomization.yaml", dir, r)
				}
				// kustomize refuses a directory that contains the referrer.
				if rel, _ := filepath.Rel(p, dir); !strings.HasPrefix(rel, "..") {
					t.Errorf("%s: resource %s contains this kustomization (kustomize: cycle detected)", dir, r)
				}
				continue
			}
			listed[p] = true
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			n := e.Name()
			if e.IsDir() || isKustomization(n) || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
				continue
			}
			if !slices.Contains(k.Resources, n) {
				t.Errorf("%s/kustomization.yaml does not list %s", dir, n)
			}
		}
	}
	// And every manifest belongs to some kustomization.
	for _, f := range yamlFiles(t, "kubernetes") {
		if !isKustomization(f) && !listed[filepath.Clean(f)] {
			t.Errorf("%s is in no kustomization", f)
		}
	}
}

// TestKustomizeBuild builds both entry points when kustomize (or kubectl) is
// installed; the other tests do not need it.
func TestKustomizeBuild(t *testing.T) {
	var cmd []string
	if p, err := exec.LookPath("kustomize"); err == nil {
		cmd = []string{p, "build"}
	} else if p, err := exec.LookPath("kubectl"); err == nil {
		cmd = []string{p, "kustomize"}
	} else {
		t.Skip("neither kustomize nor kubectl installed")
	}
	// A component builds only within an overlay: this one adds the
	// NetworkPolicy to the entry point, as deploy/README.md shows.
	overlay := t.TempDir()
	rel := func(dir string) string {
		abs, err := filepath.Abs(dir)
		if err != nil {
			t.Fatal(err)
		}
		r, err := filepath.Rel(overlay, abs)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\ncomponents:\n  - %s\n", rel("kubernetes"), rel(networkPolicyComponent))
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string][]string{
		"kubernetes":                     {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "DaemonSet", "Service"},
		"kubernetes/base":                {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "DaemonSet", "Service"},
		"kubernetes/prometheus-operator": {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "DaemonSet", "Service", "ServiceMonitor", "PrometheusRule"},
		overlay:                          {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "DaemonSet", "Service", "NetworkPolicy"},
	} {
		out, err := exec.Command(cmd[0], append(cmd[1:], dir)...).CombinedOutput()
		if err != nil {
			t.Errorf("%s %s: %v\n%s", strings.Join(cmd, " "), dir, err, out)
			continue
		}
		var got []string
		for _, doc := range splitDocuments(out) {
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatal(err)
			}
			if newObj, ok := manifestTypes[tm.APIVersion+"/"+tm.Kind]; !ok {
				t.Errorf("%s: built an unexpected %s/%s", dir, tm.APIVersion, tm.Kind)
			} else if err := decodeStrict(doc, newObj()); err != nil {
				t.Errorf("%s: built %s: %v", dir, tm.Kind, err)
			}
			got = append(got, tm.Kind)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s builds %v, want %v", dir, got, want)
		}
	}
}

// -------------------------------------------------------------------- rules

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := decodeStrict(data, &rf); err != nil {
		t.Fatalf("%s: %v", rulesFile, err)
	}
	return rf
}

// TestPrometheusRuleMatchesRulesFile keeps the PrometheusRule's groups equal
// to the plain rule file; with -update it regenerates the PrometheusRule.
func TestPrometheusRuleMatchesRulesFile(t *testing.T) {
	rf := loadRules(t)
	if *update {
		writePrometheusRule(t)
	}
	data, err := os.ReadFile(ruleCRFile)
	if err != nil {
		t.Fatal(err)
	}
	var pr prometheusRule
	if err := decodeStrict(data, &pr); err != nil {
		t.Fatalf("%s: %v", ruleCRFile, err)
	}
	if !reflect.DeepEqual(pr.Spec, rf) {
		t.Errorf("%s differs from %s: run go test ./deploy/ -run %s -update", ruleCRFile, rulesFile, t.Name())
	}
}

// writePrometheusRule writes the PrometheusRule: its spec is the rule file
// from `groups:` on, indented, so that it keeps the file's comments and
// layout (the test then checks the data is equal).
func writePrometheusRule(t *testing.T) {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(data), "\ngroups:\n")
	if i < 0 {
		t.Fatalf("%s: no top-level groups:", rulesFile)
	}
	var b strings.Builder
	b.WriteString("# Code generated from deploy/" + rulesFile + " by\n" +
		"#   go test ./deploy/ -run TestPrometheusRuleMatchesRulesFile -update\n" +
		"# DO NOT EDIT: change the rule file and regenerate.\n" +
		"apiVersion: monitoring.coreos.com/v1\n" +
		"kind: PrometheusRule\n" +
		"metadata:\n" +
		"  name: " + appName + "\n" +
		"  namespace: " + namespace + "\n" +
		"  labels:\n" +
		"    app.kubernetes.io/name: " + appName + "\n" +
		"    app.kubernetes.io/instance: " + appName + "\n" +
		"    app.kubernetes.io/part-of: " + appName + "\n" +
		"spec:\n")
	for _, l := range strings.SplitAfter(string(data[i+1:]), "\n") {
		if strings.TrimSpace(l) != "" {
			b.WriteString("  ")
		}
		b.WriteString(l)
	}
	if err := os.WriteFile(ruleCRFile, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// findingAlert returns the finding kind an alert is about ("" for none).
func findingKind(r rule) string {
	m := regexp.MustCompile(`autoglm_finding\{kind="([a-z_]+)"[,}]`).FindStringSubmatch(r.Expr)
	if m == nil {
		return ""
	}
	return m[1]
}

func TestRulesContent(t *testing.T) {
	rf := loadRules(t)
	runbooks, err := os.ReadFile("../docs/runbooks.md")
	if err != nil {
		t.Fatal(err)
	}
	alerts := map[string]rule{}
	byKind := map[string][]string{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: recording rule %s: only alerts are expected", g.Name, r.Record)
				continue
			}
			// One name twice: a finding's warning and critical rules,
			// alike but for their severity and threshold.
			if first, dup := alerts[r.Alert]; dup {
				if pair := []string{first.Labels["severity"], r.Labels["severity"]}; !slices.Equal(pair, []string{"warning", "critical"}) {
					t.Errorf("alert %s defined twice with severities %v, want warning then critical", r.Alert, pair)
				}
				if first.For != r.For || !maps.Equal(first.Annotations, r.Annotations) || findingKind(first) != findingKind(r) {
					t.Errorf("alert %s: its warning and critical rules differ in more than severity and threshold", r.Alert)
				}
				continue
			}
			alerts[r.Alert] = r
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", r.Alert, a)
				}
			}
			// Each alert's runbook: a section of docs/runbooks.md of its name.
			const runbookBase = "https://github.com/open-autoglm/autoglm-ebpf/blob/main/docs/runbooks.md#"
			if got, want := r.Annotations["runbook_url"], runbookBase+strings.ToLower(r.Alert); got != want {
				t.Errorf("%s: runbook_url %q, want %q", r.Alert, got, want)
			}
			if !regexp.MustCompile(`(?m)^## ` + r.Alert + `$`).Match(runbooks) {
				t.Errorf("%s: no section \"## %s\" in docs/runbooks.md", r.Alert, r.Alert)
			}
			// The agent is known by its own series: the scrape
			// configuration names its job as it likes.
			if regexp.MustCompile(`\bjob\s*(=|!=|=~|!~)`).MatchString(r.Expr) {
				t.Errorf("%s: selects a job by name: %s", r.Alert, r.Expr)
			}
			all := r.Annotations["summary"] + r.Annotations["description"]
			// node with a fallback to instance, never node alone.
			if strings.Contains(all, "$labels.node") && !strings.Contains(all, "$labels.instance") {
				t.Errorf("%s: annotations print node without falling back to instance", r.Alert)
			}
			kind := findingKind(r)
			perProcess := strings.Contains(r.Expr, "autoglm_finding") || strings.Contains(r.Expr, "autoglm_open_fds") ||
				strings.Contains(r.Expr, "autoglm_gpu_process_memory_used_bytes")
			if perProcess {
				for _, l := range []string{"$labels.pid", "$labels.comm", "$labels.namespace", "$labels.pod"} {
					if !strings.Contains(all, l) {
						t.Errorf("%s: annotations do not name %s", r.Alert, l)
					}
				}
			}
			if kind != "" {
				byKind[kind] = append(byKind[kind], r.Alert)
				if !strings.Contains(all, "$labels.site") {
					t.Errorf("%s: annotations do not name the call site ($labels.site)", r.Alert)
				}
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" && s != "info" {
				t.Errorf("%s: severity label %q", r.Alert, s)
			}
		}
	}
	kinds := model.Kinds
	// A gpu_xid or gpu_ecc_error finding is a device's fault seen from
	// each process on it: the device's counter alerts once (with the XID),
	// whether or not a watched process used the GPU.
	byDevice := map[string]string{model.KindGPUXID: "AutoglmGpuXid", model.KindGPUECCError: "AutoglmGpuEccError"}
	for _, k := range kinds {
		if a, ok := byDevice[k]; ok {
			if _, ok := alerts[a]; !ok || len(byKind[k]) != 0 {
				t.Errorf("finding kind %s: alerts %v and %s, want %s alone", k, byKind[k], a, a)
			}
			continue
		}
		if len(byKind[k]) != 1 {
			t.Errorf("finding kind %s: alerts %v, want exactly one", k, byKind[k])
		}
	}
	for k := range byKind {
		if !slices.Contains(kinds, k) {
			t.Errorf("alert on unknown finding kind %s", k)
		}
	}
	for _, name := range []string{"AutoglmFdExhaustionPredicted", "AutoglmGpuMemoryExhaustionPredicted",
		"AutoglmGpuProcessMemoryExhaustionPredicted", "AutoglmEbpfEventsLost", "AutoglmEbpfDown"} {
		if _, ok := alerts[name]; !ok {
			t.Errorf("alert %s missing", name)
		}
	}
}

// The XID alerts select the classes of the agent's own catalogue, at the
// severity its gpu_xid findings give them: each selector of an alert
// lists exactly the XIDs of its class (the application's warnings, not
// the cleanup's info), and no other alert reads the XID counter.
func TestXIDRulesFollowCatalogue(t *testing.T) {
	var device, app, known []uint64
	for n, x := range gpuxid.Catalogue {
		switch x.Class {
		case model.XIDDevice:
			device = append(device, n)
			known = append(known, n)
		case model.XIDApplication:
			known = append(known, n)
			if gpuxid.Severity(n) == model.SeverityWarning {
				app = append(app, n)
			}
		}
	}
	join := func(xs []uint64) string {
		slices.Sort(xs)
		var ss []string
		for _, x := range xs {
			ss = append(ss, strconv.FormatUint(x, 10))
		}
		return strings.Join(ss, "|")
	}
	const unclassified = 1 << 40 // an XID no catalogue holds
	want := map[string]struct{ selector, severity string }{
		"AutoglmGpuXid":            {`xid=~"` + join(device) + `"`, gpuxid.Severity(device[0])},
		"AutoglmGpuXidApplication": {`xid=~"` + join(app) + `"`, gpuxid.Severity(app[0])},
		"AutoglmGpuXidUnknown":     {`xid!~"` + join(known) + `"`, gpuxid.Severity(unclassified)},
	}
	re := regexp.MustCompile(`autoglm_gpu_xid_errors_total(\{[^}]*\})?`)
	seen := map[string]bool{}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			ms := re.FindAllStringSubmatch(r.Expr, -1)
			if len(ms) == 0 {
				continue
			}
			w, ok := want[r.Alert]
			if !ok {
				t.Errorf("%s reads autoglm_gpu_xid_errors_total but is no XID class's alert", r.Alert)
				continue
			}
			seen[r.Alert] = true
			for _, m := range ms {
				if m[1] != "{"+w.selector+"}" {
					t.Errorf("%s: selects %q, want {%s} (gpuxid.Catalogue)", r.Alert, m[0], w.selector)
				}
			}
			if r.Labels["severity"] != w.severity {
				t.Errorf("%s: severity %q, want %q as the class's findings", r.Alert, r.Labels["severity"], w.severity)
			}
		}
	}
	for a := range want {
		if !seen[a] {
			t.Errorf("no alert %s", a)
		}
	}
}

// promtoolTestFile is the part of a promtool unit test file the coverage
// check reads.
type promtoolTestFile struct {
	RuleFiles          []string `json:"rule_files"`
	EvaluationInterval string   `json:"evaluation_interval,omitempty"`
	Tests              []struct {
		Name        string `json:"name,omitempty"`
		Interval    string `json:"interval,omitempty"`
		InputSeries []struct {
			Series string `json:"series"`
			Values string `json:"values"`
		} `json:"input_series"`
		AlertRuleTest []struct {
			EvalTime  string `json:"eval_time"`
			Alertname string `json:"alertname"`
			ExpAlerts []struct {
				ExpLabels      map[string]string `json:"exp_labels"`
				ExpAnnotations map[string]string `json:"exp_annotations"`
			} `json:"exp_alerts"`
		} `json:"alert_rule_test,omitempty"`
		PromqlExprTest []promqlExprTest `json:"promql_expr_test,omitempty"`
	} `json:"tests"`
}

type promqlExprTest struct {
	Expr       string `json:"expr"`
	EvalTime   string `json:"eval_time"`
	ExpSamples []struct {
		Labels string  `json:"labels"`
		Value  float64 `json:"value"`
	} `json:"exp_samples"`
}

// TestRuleUnitTestsCoverEveryAlert: every alert has a unit test in which it
// fires and one in which it must stay silent.
func TestRuleUnitTestsCoverEveryAlert(t *testing.T) {
	data, err := os.ReadFile(rulesTestFile)
	if err != nil {
		t.Fatal(err)
	}
	var tf promtoolTestFile
	if err := decodeStrict(data, &tf); err != nil {
		t.Fatalf("%s: %v", rulesTestFile, err)
	}
	if !slices.Contains(tf.RuleFiles, filepath.Base(rulesFile)) {
		t.Errorf("%s does not test %s", rulesTestFile, rulesFile)
	}
	fires, silent := map[string]bool{}, map[string]bool{}
	for _, tc := range tf.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
				for _, e := range a.ExpAlerts {
					if len(e.ExpAnnotations) == 0 {
						t.Errorf("%s at %s: expected alert without expected annotations", a.Alertname, a.EvalTime)
					}
				}
			} else {
				silent[a.Alertname] = true
			}
		}
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if !fires[r.Alert] {
				t.Errorf("alert %s: no unit test where it fires", r.Alert)
			}
			if !silent[r.Alert] {
				t.Errorf("alert %s: no unit test where it must not fire", r.Alert)
			}
		}
	}
}

// promtool returns the promtool binary. Without it the test is skipped,
// unless CI is set: CI must run the rule tests.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not found and CI is set: install it (Debian: apt-get install prometheus)")
		}
		t.Skip("promtool not installed (Debian: apt-get install prometheus); CI unset")
	}
	return p
}

func runPromtool(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestPromtoolCheckRules(t *testing.T) {
	bin := promtool(t)
	runPromtool(t, bin, "check", "rules", rulesFile)
	// The PrometheusRule's groups, as the Operator would hand them over.
	data, err := os.ReadFile(ruleCRFile)
	if err != nil {
		t.Fatal(err)
	}
	var pr prometheusRule
	if err := decodeStrict(data, &pr); err != nil {
		t.Fatal(err)
	}
	body, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(t.TempDir(), "prometheusrule-groups.yml")
	if err := os.WriteFile(f, body, 0o644); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, bin, "check", "rules", f)
}

func TestPromtoolTestRules(t *testing.T) {
	bin := promtool(t)
	out := runPromtool(t, bin, "test", "rules", rulesTestFile)
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules: no SUCCESS in\n%s", out)
	}
}

// TestPromtoolCheckConfig checks the plain Prometheus example. Debian's
// promtool is built without Kubernetes service discovery; then the
// kubernetes_sd_configs are swapped for static targets and the rest checked.
func TestPromtoolCheckConfig(t *testing.T) {
	bin := promtool(t)
	out, err := exec.Command(bin, "check", "config", promConfigFile).CombinedOutput()
	if err == nil {
		return
	}
	if !strings.Contains(string(out), "kubernetes_sd_configs not found") {
		t.Fatalf("promtool check config %s: %v\n%s", promConfigFile, err, out)
	}
	t.Logf("this promtool has no Kubernetes service discovery; checking %s with static targets instead", promConfigFile)
	data, err := os.ReadFile(promConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	jobs, _ := cfg["scrape_configs"].([]any)
	for _, j := range jobs {
		job := j.(map[string]any)
		if _, ok := job["kubernetes_sd_configs"]; ok {
			delete(job, "kubernetes_sd_configs")
			job["static_configs"] = []any{map[string]any{"targets": []any{"localhost:9464"}}}
		}
	}
	body, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rules, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"prometheus.yml": body, filepath.Base(rulesFile): rules} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runPromtool(t, bin, "check", "config", filepath.Join(dir, "prometheus.yml"))
}

// ---------------------------------------------------------------- dashboard

func loadDashboard(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, DashboardJSON()) {
		t.Fatal("the embedded dashboard differs from the file")
	}
	var d map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if v, _ := d["schemaVersion"].(json.Number).Int64(); v < 36 {
		t.Errorf("schemaVersion %v, want >= 36", d["schemaVersion"])
	}
	if d["uid"] == "" || d["title"] == "" {
		t.Error("dashboard without uid or title")
	}
	vars := map[string]map[string]any{}
	for _, v := range d["templating"].(map[string]any)["list"].([]any) {
		v := v.(map[string]any)
		vars[v["name"].(string)] = v
	}
	ds := vars["datasource"]
	if ds == nil || ds["type"] != "datasource" || ds["query"] != "prometheus" {
		t.Errorf("templating: want a datasource variable `datasource` of type prometheus, got %v", ds)
	}
	for _, name := range []string{"cluster", "node", "namespace", "pod"} {
		v := vars[name]
		if v == nil {
			t.Errorf("templating: no %s variable", name)
			continue
		}
		q, _ := v["query"].(string)
		if v["type"] != "query" || !strings.HasPrefix(q, "label_values(") || !strings.HasSuffix(q, ", "+name+")") {
			t.Errorf("variable %s: want a label_values(..., %s) query, got %v %q", name, name, v["type"], q)
		}
		// All must also select series without the label (host processes,
		// a Prometheus without the node relabeling).
		if v["includeAll"] != true || v["allValue"] != ".*" {
			t.Errorf("variable %s: want includeAll with allValue .*", name)
		}
		if uid := v["datasource"].(map[string]any)["uid"]; uid != "${datasource}" {
			t.Errorf("variable %s: datasource %v, want ${datasource}", name, uid)
		}
	}

	matcher := regexp.MustCompile(`\w+=~"\$(\w+)"`)
	ids := map[string]bool{}
	var queries int
	var walk func(panels []any)
	walk = func(panels []any) {
		for _, p := range panels {
			p := p.(map[string]any)
			id := p["id"].(json.Number).String()
			title, _ := p["title"].(string)
			if ids[id] {
				t.Errorf("panel id %s used twice", id)
			}
			ids[id] = true
			g := p["gridPos"].(map[string]any)
			x, _ := g["x"].(json.Number).Int64()
			w, _ := g["w"].(json.Number).Int64()
			if w <= 0 || x+w > 24 {
				t.Errorf("panel %q: gridPos x=%d w=%d outside the 24 columns", title, x, w)
			}
			if p["type"] == "row" {
				if sub, ok := p["panels"].([]any); ok {
					walk(sub)
				}
				continue
			}
			if uid := p["datasource"].(map[string]any)["uid"]; uid != "${datasource}" {
				t.Errorf("panel %q: datasource %v, want ${datasource}", title, uid)
			}
			targets, _ := p["targets"].([]any)
			if len(targets) == 0 {
				t.Errorf("panel %q: no targets", title)
			}
			refs := map[string]bool{}
			for _, tg := range targets {
				tg := tg.(map[string]any)
				expr, _ := tg["expr"].(string)
				ref, _ := tg["refId"].(string)
				if strings.TrimSpace(expr) == "" {
					t.Errorf("panel %q target %s: no expr", title, ref)
				}
				if ref == "" || refs[ref] {
					t.Errorf("panel %q: refId %q missing or repeated", title, ref)
				}
				refs[ref] = true
				if tds, ok := tg["datasource"].(map[string]any); ok && tds["uid"] != "${datasource}" {
					t.Errorf("panel %q target %s: datasource %v", title, ref, tds["uid"])
				}
				// A Prometheus (Thanos, Mimir) holding several clusters:
				// every selector is narrowed by cluster too.
				if n := strings.Count(expr, `cluster=~"$cluster"`); n == 0 || n != strings.Count(expr, "{") {
					t.Errorf("panel %q target %s: %d selectors, %d with cluster=~\"$cluster\": %s", title, ref, strings.Count(expr, "{"), n, expr)
				}
				// Dashboard variables only as regex matcher values.
				rest := matcher.ReplaceAllStringFunc(expr, func(m string) string {
					if vars[matcher.FindStringSubmatch(m)[1]] == nil {
						t.Errorf("panel %q: unknown variable in %s", title, m)
					}
					return ""
				})
				rest = strings.NewReplacer("$__rate_interval", "", "$__interval", "").Replace(rest)
				if regexp.MustCompile(`\$|\[\[`).MatchString(rest) {
					t.Errorf("panel %q: a variable outside a label=~\"$var\" matcher in %q", title, expr)
				}
				queries++
			}
		}
	}
	walk(d["panels"].([]any))

	qs, err := DashboardQueries()
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) != queries || queries == 0 {
		t.Errorf("DashboardQueries returned %d queries, the dashboard has %d", len(qs), queries)
	}
	for _, q := range qs {
		if strings.Contains(q, "$") {
			t.Errorf("query not fully substituted: %s", q)
		}
	}
	// The panels the deployment promises: per container by default, the
	// processes nearest a limit on their own, GPU faults, the agent's own
	// health.
	all := strings.Join(qs, "\n")
	for _, want := range []string{
		"autoglm_container_gpu_memory_used_bytes", "autoglm_container_cuda_live_bytes", "autoglm_container_cuda_untracked_bytes",
		"topk(10, autoglm_gpu_process_memory_used_bytes",
		"autoglm_container_open_fds", "topk(10, autoglm_open_fds", "autoglm_fd_limit", "rate(autoglm_container_fds_opened_total",
		"rate(autoglm_container_context_switches_total",
		"histogram_quantile(0.99, sum by (node, instance, namespace, pod, container, cgroup, comm, le) (rate(autoglm_container_runqueue_latency_seconds_bucket",
		"autoglm_container_sockets", "autoglm_container_gpu_sm_utilization_ratio", "autoglm_finding{",
		"autoglm_gpu_xid_errors_total", "autoglm_gpu_events_total", "autoglm_view_up", "autoglm_bpf_memory_bytes",
		"autoglm_track_failures_total", "process_resident_memory_bytes", "rate(process_cpu_seconds_total",
		"autoglm_bpf_events_lost_total",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("no dashboard query uses %s", want)
		}
	}
	perProcess := perProcessSelector()
	for _, tg := range mustTargets(t) {
		// A panel of per-process series shows the top few: the daemon
		// serves them for the interesting processes only, but
		// --metrics.granularity=process serves them for every one.
		if perProcess.MatchString(tg.Raw) && !strings.Contains(tg.Raw, "topk(") {
			t.Errorf("panel %q %s reads per-process series without topk: %s", tg.Panel, tg.RefID, tg.Raw)
		}
		// Series every exporter has (up, process_*) are the agent's only
		// where its target serves autoglm_build_info; no job is assumed.
		if agentScoped.MatchString(tg.Raw) && !strings.Contains(tg.Raw, "and on (cluster, job, instance) ") {
			t.Errorf("panel %q %s: up or process_* not joined on the agent's targets: %s", tg.Panel, tg.RefID, tg.Raw)
		}
		if strings.Contains(tg.Raw, "job=") {
			t.Errorf("panel %q %s names a job: %s", tg.Panel, tg.RefID, tg.Raw)
		}
		// autoglm_finding is the severity while active, minus it after.
		for _, m := range findingSelector.FindAllStringSubmatch(tg.Raw, -1) {
			if !regexp.MustCompile(`^ (> 0|== [123])\b`).MatchString(m[1]) {
				t.Errorf("panel %q %s: autoglm_finding not compared with > 0 (active) or == a severity: %s", tg.Panel, tg.RefID, tg.Raw)
			}
		}
	}
}

// agentScoped matches a selector of a series that other exporters serve too.
var agentScoped = regexp.MustCompile(`(?:^|[^\w])(?:up|process_\w+|go_\w+)\{`)

// findingSelector matches a selector of autoglm_finding and what follows.
var findingSelector = regexp.MustCompile(`autoglm_finding\{[^}]*\}(.{0,5})`)

// perProcessSelector matches a selector of a per-process series: the views'
// metrics and NVML's per-process ones.
func perProcessSelector() *regexp.Regexp {
	names := []string{"autoglm_gpu_process_memory_used_bytes", "autoglm_gpu_sm_utilization_ratio", "autoglm_gpu_memory_controller_utilization_ratio"}
	for _, sh := range model.Shows {
		for _, vm := range sh.Metrics {
			names = append(names, vm.Name)
		}
	}
	return regexp.MustCompile(`(?:^|[^\w])(?:` + strings.Join(names, "|") + `)(?:_bucket|_sum|_count)?\{`)
}

func mustTargets(t *testing.T) []DashboardTarget {
	t.Helper()
	ts, err := DashboardTargets(DefaultRateInterval)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

func TestSubstituteVariables(t *testing.T) {
	for in, want := range map[string]string{
		`rate(x{node=~"$node", pod=~"${pod}"}[$__rate_interval])`:      `rate(x{node=~".*", pod=~".*"}[5m])`,
		`x{namespace=~"${namespace:regex}", instance=~"[[instance]]"}`: `x{namespace=~".*", instance=~".*"}`,
		`x[$__interval]`: `x[5m]`,
	} {
		got, err := SubstituteVariables(in, "5m")
		if err != nil || got != want {
			t.Errorf("SubstituteVariables(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{`x{a=~"$nosuch"}`, `x{a=~"$datasource"}`, `x[$__range]`} {
		if got, err := SubstituteVariables(in, "5m"); err == nil {
			t.Errorf("SubstituteVariables(%q) = %q, want an error", in, got)
		}
	}
}

// TestDashboardQueriesReturnData runs every dashboard query (and the
// variables' label_values metrics) in promtool over the series pkg/metrics
// serves for two agents' synthetic snapshots (dashboardSeries), and
// requires each to return something: a misspelt metric or label, a series
// the daemon no longer serves, or a join that matches nothing, fails here.
// The agent panels must return the agents' series only, the active
// findings table the active finding only, and a panel of a rare event's
// counter the events of a series that just appeared.
func TestDashboardQueriesReturnData(t *testing.T) {
	bin := promtool(t)
	targets, err := DashboardTargets("1m")
	if err != nil {
		t.Fatal(err)
	}
	exprs := map[string]string{} // expr -> what it is
	for _, tg := range targets {
		exprs[tg.Expr] = fmt.Sprintf("panel %q %s", tg.Panel, tg.RefID)
	}
	lv := regexp.MustCompile(`^label_values\((.+), (\w+)\)$`)
	raw := map[string]any{}
	if err := json.Unmarshal(dashboardJSON, &raw); err != nil {
		t.Fatal(err)
	}
	for _, v := range raw["templating"].(map[string]any)["list"].([]any) {
		v := v.(map[string]any)
		if v["type"] != "query" {
			continue
		}
		m := lv.FindStringSubmatch(v["query"].(string))
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", v["name"], v["query"])
			continue
		}
		sel, err := SubstituteVariables(m[1], "1m")
		if err != nil {
			t.Fatal(err)
		}
		// The label must be there: label_values lists its values.
		if strings.HasSuffix(sel, "}") {
			sel = strings.TrimSuffix(sel, "}") + fmt.Sprintf(`, %s!=""}`, m[2])
		} else {
			sel += fmt.Sprintf(`{%s!=""}`, m[2])
		}
		exprs[fmt.Sprintf(`group by (%s) (%s)`, m[2], sel)] = fmt.Sprintf("variable %s", v["name"])
	}

	type sample struct {
		Labels string  `json:"labels"`
		Value  float64 `json:"value"`
	}
	type exprTest struct {
		Expr       string   `json:"expr"`
		EvalTime   string   `json:"eval_time"`
		ExpSamples []sample `json:"exp_samples"`
	}
	input := dashboardSeries(t)
	var tests []exprTest
	var order []string
	for e := range exprs {
		order = append(order, e)
	}
	sort.Strings(order)
	for _, e := range order {
		// 1 when the query returns at least one series (nothing otherwise).
		tests = append(tests, exprTest{Expr: "count(" + e + ") > bool 0", EvalTime: "10m", ExpSamples: []sample{{"{}", 1}}})
	}
	// Some must return exactly so many series: up and process_* of the
	// agents, not of the other exporter beside them; the active finding,
	// not the ended one.
	for _, tg := range targets {
		n := 0
		switch {
		case agentScoped.MatchString(tg.Raw):
			n = agents
		case strings.Contains(tg.Raw, "autoglm_finding{") && strings.HasSuffix(tg.Raw, "} > 0"):
			n = 1
		default:
			continue
		}
		exprs["count("+tg.Expr+")"] = fmt.Sprintf("panel %q %s returns other than %d series", tg.Panel, tg.RefID, n)
		tests = append(tests, exprTest{Expr: "count(" + tg.Expr + ")", EvalTime: "10m", ExpSamples: []sample{{"{}", float64(n)}}})
	}
	// A counter of rare events (XIDs, failures) is made by its first
	// event: a panel counts those when the series appears, as increase()
	// alone does not. The input's such series appear at 5m.
	var late []string
	for _, s := range input {
		if strings.HasPrefix(s["values"], "_") {
			late = append(late, s["series"][:strings.Index(s["series"], "{")]+"{")
		}
	}
	for _, tg := range targets {
		for _, m := range late {
			if strings.Contains(tg.Raw, m) {
				e := "sum(" + tg.Expr + ") > bool 0"
				exprs[e] = fmt.Sprintf("panel %q %s misses the first events of a new series", tg.Panel, tg.RefID)
				tests = append(tests, exprTest{Expr: e, EvalTime: "5m", ExpSamples: []sample{{"{}", 1}}})
				break
			}
		}
	}
	file := map[string]any{
		"rule_files": []string{},
		"tests": []any{map[string]any{
			"interval":         "15s",
			"input_series":     input,
			"promql_expr_test": tests,
		}},
	}
	body, err := yaml.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := filepath.Join(dir, "dashboard.test.yml")
	if err := os.WriteFile(f, body, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "test", "rules", f).CombinedOutput()
	if err != nil {
		// Name the queries that returned nothing: promtool prints each
		// failed expression quoted.
		for _, m := range regexp.MustCompile(`expr: ("(?:[^"\\]|\\.)*")`).FindAllStringSubmatch(string(out), -1) {
			q, uerr := strconv.Unquote(m[1])
			if uerr != nil {
				continue
			}
			if what, ok := exprs[q]; ok {
				t.Errorf("%s: %s", what, q)
				continue
			}
			q = strings.TrimSuffix(strings.TrimPrefix(q, "count("), ") > bool 0")
			t.Errorf("%s returns nothing: %s", exprs[q], q)
		}
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

// dashboardSeries are 10 minutes of what two agents export
// (dashboard_series_test.go: pkg/metrics's own series for two nodes'
// snapshots), what only the daemon's command adds, each agent's up, and
// another exporter's up and process_* series beside agent1, which the
// agent panels must leave out.
func dashboardSeries(t *testing.T) []map[string]string {
	t.Helper()
	first, last := agent1Snapshots()
	out := servedSeries(t, agent1Labels, first, last)
	first, last = agent2Snapshots()
	out = append(out, servedSeries(t, agent2Labels, first, last)...)
	add := func(series, values string) {
		out = append(out, map[string]string{"series": series, "values": values})
	}
	for _, a := range []string{agent1Labels, agent2Labels} {
		add(`up{`+a+`}`, "1x40")
		add(`autoglm_watched_processes{`+a+`}`, "12x40")
		add(`autoglm_processes_over_cap_total{`+a+`}`, "0x40")
	}
	add(`up{`+otherLabels+`}`, "1x40")
	add(`process_resident_memory_bytes{`+otherLabels+`}`, "20000000x40")
	add(`process_cpu_seconds_total{`+otherLabels+`}`, "0+0.1x40")
	return out
}

// ------------------------------------------------- metric names, Dockerfile

// TestMetricNamesExist: every autoglm_* metric the rules and the dashboard
// use is one the Go code exports (or a pending daemon-only one).
func TestMetricNamesExist(t *testing.T) {
	defined := map[string]bool{}
	lit := regexp.MustCompile(`"(autoglm_[a-z0-9_]+)"`)
	err := filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "deploy", ".git", "testdata", "bin", "vendor":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range lit.FindAllStringSubmatch(string(data), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The views' per-container sums are named after their metrics.
	for _, sh := range model.Shows {
		for _, vm := range sh.Metrics {
			if !vm.OwnOnly {
				defined[metrics.ContainerName(vm.Name)] = true
			}
		}
	}
	used := map[string]string{}
	name := regexp.MustCompile(`\bautoglm_[a-z0-9_]+`)
	for _, f := range []string{rulesFile, dashboardFile} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// The whole file: annotations and descriptions name metrics too,
		// and those must be real as well.
		for _, m := range name.FindAllString(string(data), -1) {
			used[m] = f
		}
	}
	for m, f := range used {
		base := m
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(m, suf); ok && defined[b] {
				base = b
			}
		}
		switch {
		case defined[base]:
		default:
			t.Errorf("%s uses %s, which no Go code exports", f, m)
		}
	}
}

// The Dockerfile is hermetic: no syntax frontend to pull, no base image
// (FROM scratch, the files `make image-root` prepared), the labels and
// entrypoint of `make image`'s archive. deploy/image's test builds it with
// podman and runs it.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(data)
	for _, want := range []string{
		"FROM scratch\n",
		"ARG TARGETARCH\n",
		"COPY bin/image-root-${TARGETARCH}/ /\n",
		"org.opencontainers.image.version=",
		"org.opencontainers.image.revision=",
		"org.opencontainers.image.source=",
		`ENTRYPOINT ["/usr/local/bin/autoglm-ebpf"]`,
		`CMD ["daemon"]`,
		"EXPOSE 9464",
	} {
		if !strings.Contains(df, want) {
			t.Errorf("Dockerfile: missing %q", want)
		}
	}
	if froms := regexp.MustCompile(`(?m)^FROM `).FindAllString(df, -1); len(froms) != 1 {
		t.Errorf("Dockerfile: %d FROM lines; want FROM scratch alone (nothing pulled)", len(froms))
	}
	if regexp.MustCompile(`(?m)^#\s*syntax=`).MatchString(df) || regexp.MustCompile(`(?m)^RUN `).MatchString(df) {
		t.Error("Dockerfile: a syntax frontend or a RUN step (which needs a base image)")
	}
	// The image the manifests run is the one built here.
	ds := only[*appsv1.DaemonSet](t, loadManifests(t))
	if img := ds.Spec.Template.Spec.Containers[0].Image; !strings.HasPrefix(img, "ghcr.io/open-autoglm/autoglm-ebpf:") {
		t.Errorf("DaemonSet image %q", img)
	}
}
