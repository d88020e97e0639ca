package podinfo

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

const node = "gpu-node-a"

var podsGVR = corev1.SchemeGroupVersion.WithResource("pods")

// fakeClient is a fake clientset holding pods. The fake ignores field
// selectors, so its list and watch are made to honour spec.nodeName, and
// pods of other nodes reach the resolver only if it forgets to ask for its
// node's.
func fakeClient(pods ...runtime.Object) *fake.Clientset {
	c := fake.NewClientset(pods...)
	onNode := func(sel fields.Selector, obj runtime.Object) bool {
		p, ok := obj.(*corev1.Pod)
		return !ok || sel.Matches(fields.Set{"spec.nodeName": p.Spec.NodeName})
	}
	c.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		l := a.(k8stesting.ListActionImpl)
		obj, err := c.Tracker().List(podsGVR, l.GetKind(), l.GetNamespace(), l.ListOptions)
		if err != nil {
			return true, nil, err
		}
		list := obj.(*corev1.PodList)
		var kept []corev1.Pod
		for _, p := range list.Items {
			if onNode(l.GetListRestrictions().Fields, &p) {
				kept = append(kept, p)
			}
		}
		list.Items = kept
		return true, list, nil
	})
	c.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		wa := a.(k8stesting.WatchActionImpl)
		w, err := c.Tracker().Watch(podsGVR, wa.GetNamespace(), wa.ListOptions)
		if err != nil {
			return true, nil, err
		}
		return true, watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			return e, onNode(wa.GetWatchRestrictions().Fields, e.Object)
		}), nil
	})
	return c
}

// fakePods lists and watches the pods of every node through c, as allPods
// does through the API server. It says, as c does, that the fake cannot
// stream a list as a watch.
func fakePods(c *fake.Clientset) cache.ListerWatcher {
	pods := c.CoreV1().Pods(metav1.NamespaceAll)
	return cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return pods.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return pods.Watch(ctx, o)
		},
	}, c)
}

func pod(nodeName, ns, name, uid string, containers ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec:       corev1.PodSpec{NodeName: nodeName},
	}
	for i := 0; i < len(containers); i += 2 {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses,
			corev1.ContainerStatus{Name: containers[i], ContainerID: containers[i+1], Image: "nvcr.io/nvidia/tritonserver:25.01-py3"})
	}
	return p
}

// logs records what the package logs through slog's default logger.
type logs struct {
	mu  sync.Mutex
	rec []slog.Record
}

func captureLogs(t *testing.T) *logs {
	l := &logs{}
	old := slog.Default()
	slog.SetDefault(slog.New(l))
	t.Cleanup(func() { slog.SetDefault(old) })
	return l
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logs) WithGroup(string) slog.Handler            { return l }

func (l *logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rec = append(l.rec, r.Clone())
	return nil
}

// warnings lists records at Warn or above as "message: err".
func (l *logs) warnings() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.rec {
		if r.Level < slog.LevelWarn {
			continue
		}
		s := r.Message
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "err" {
				s += ": " + a.Value.String()
			}
			return true
		})
		out = append(out, s)
	}
	return out
}

func (l *logs) has(msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.rec {
		if r.Message == msg {
			return true
		}
	}
	return false
}

// wantOneWarning checks that exactly one warning was logged, the fallback
// one, with an error containing errPart.
func wantOneWarning(t *testing.T, l *logs, errPart string) {
	t.Helper()
	w := l.warnings()
	if len(w) != 1 || !strings.HasPrefix(w[0], fallbackMsg+": ") || !strings.Contains(w[0], errPart) {
		t.Fatalf("warnings %q, want one: %q with %q", w, fallbackMsg, errPart)
	}
}

func TestResolver(t *testing.T) {
	l := captureLogs(t)
	vllm := pod(node, "infer", "vllm-0", uid1,
		"server", "containerd://"+cid1,
		"sidecar", "") // waiting: no container id yet
	vllm.Labels = map[string]string{"app": "vllm"}
	vllm.Annotations = map[string]string{"kubectl.kubernetes.io/last-applied-configuration": strings.Repeat("x", 4096)}
	vllm.Spec.Containers = []corev1.Container{{Name: "server", Image: "vllm/vllm-openai:v0.9.0", Args: []string{"--model", "llama"}}}
	vllm.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "fetch-weights", ContainerID: "containerd://" + cid2}}
	vllm.Status.EphemeralContainerStatuses = []corev1.ContainerStatus{{Name: "debugger-x7k2q", ContainerID: "containerd://" + cid3}}
	triton := pod(node, "serving", "triton-7d9f", uid5, "triton", "cri-o://"+cid6)
	legacy := pod(node, "batch", "train-1", uid2, "trainer", "docker://"+cid7)
	// The API server's mirror of a static pod: its own UID, the kubelet's in
	// the annotation.
	static := pod(node, "kube-system", "gpu-monitor-"+node, uid3, "monitor", "containerd://"+cid5)
	static.Annotations = map[string]string{mirrorAnnotation: staticUID, "kubernetes.io/config.source": "file"}
	other := pod("gpu-node-b", "infer", "vllm-1", uid4, "server", "containerd://"+cid4)
	client := fakeClient(vllm, triton, legacy, static, other)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	start := time.Now()
	r := NewResolver(ctx, fakePods(client), node)
	if !r.informer.HasSynced() {
		t.Fatalf("not synced after NewResolver (%v)", time.Since(start))
	}

	type result struct {
		ns, pod, container string
		ok                 bool
	}
	tests := []struct {
		what     string
		uid, cid string
		want     result
	}{
		{"containerd", uid1, cid1, result{"infer", "vllm-0", "server", true}},
		{"init container", uid1, cid2, result{"infer", "vllm-0", "fetch-weights", true}},
		{"ephemeral container", uid1, cid3, result{"infer", "vllm-0", "debugger-x7k2q", true}},
		{"pod only (no container id)", uid1, "", result{"infer", "vllm-0", "", true}},
		{"pause container: pod, no container", uid1, cid8, result{"infer", "vllm-0", "", true}},
		{"CRI-O", uid5, cid6, result{"serving", "triton-7d9f", "triton", true}},
		{"docker", uid2, cid7, result{"batch", "train-1", "trainer", true}},
		{"static pod by the kubelet's UID", staticUID, cid5, result{"kube-system", "gpu-monitor-" + node, "monitor", true}},
		{"container of another pod", uid5, cid1, result{"serving", "triton-7d9f", "", true}},
		{"pod of another node", uid4, cid4, result{}},
		{"no pod", "", "", result{}},
	}
	for _, tt := range tests {
		var got result
		got.ns, got.pod, got.container, got.ok = r.Lookup(tt.uid, tt.cid)
		if got != tt.want {
			t.Errorf("%s: Lookup(%q, %q) = %+v, want %+v", tt.what, tt.uid, tt.cid, got, tt.want)
		}
	}

	// The fixture's pid 100 is vllm-0's server container.
	got, err := r.ForPID(procFS(t, "testdata/proc"), 100)
	want := Pod{UID: uid1, ContainerID: cid1, Cgroup: slice1 + "/cri-containerd-" + cid1 + ".scope",
		Namespace: "infer", Name: "vllm-0", Container: "server"}
	if err != nil || got != want {
		t.Errorf("ForPID(100) = %+v, %v; want %+v", got, err, want)
	}

	// A pod scheduled here after start is found once the watch delivers it;
	// one scheduled elsewhere, created first, is not.
	late := pod(node, "infer", "vllm-2", uid6, "server", "containerd://"+cid8)
	elsewhere := pod("gpu-node-b", "infer", "vllm-3", "5d1c7a52-0b8e-4d4f-9c41-7f3b2e9a6d10", "server", "containerd://"+cid4)
	for _, p := range []*corev1.Pod{elsewhere, late} {
		if _, err := client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 20*time.Second, "the new pod to be found", func() bool {
		_, name, c, ok := r.Lookup(uid6, cid8)
		return ok && name == "vllm-2" && c == "server"
	})
	if _, _, _, ok := r.Lookup(string(elsewhere.UID), cid4); ok {
		t.Error("a pod created on another node was resolved")
	}

	if err := client.CoreV1().Pods("infer").Delete(ctx, "vllm-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the deleted pod to go", func() bool {
		_, _, _, ok := r.Lookup(uid1, cid1)
		return !ok
	})

	if w := l.warnings(); len(w) != 0 {
		t.Errorf("warnings on a working API server: %q", w)
	}
}

// The cache holds only what Lookup needs.
func TestResolverStripsPods(t *testing.T) {
	captureLogs(t)
	p := pod(node, "infer", "vllm-0", uid1, "server", "containerd://"+cid1, "sidecar", "")
	p.Labels = map[string]string{"app": "vllm"}
	p.ResourceVersion = "4711"
	p.Annotations = map[string]string{mirrorAnnotation: staticUID, "note": "big"}
	p.Spec.Containers = []corev1.Container{{Name: "server", Image: "vllm/vllm-openai:v0.9.0"}}
	p.Status.Phase = corev1.PodRunning
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "init", ContainerID: "containerd://" + cid2, Image: "busybox"}}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r := NewResolver(ctx, fakePods(fakeClient(p)), node)
	objs := r.informer.GetStore().List()
	if len(objs) != 1 {
		t.Fatalf("cache holds %d objects, want 1", len(objs))
	}
	got := objs[0].(*corev1.Pod)
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "infer", Name: "vllm-0", UID: uid1,
			ResourceVersion: "4711", Annotations: map[string]string{mirrorAnnotation: staticUID}},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
			{Name: "server", ContainerID: "containerd://" + cid1},
			{Name: "init", ContainerID: "containerd://" + cid2},
		}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("cached pod\n%+v\nwant\n%+v", got, want)
	}
	// Stripping what is stripped changes nothing, as client-go asks.
	if again, _ := strip(got); !reflect.DeepEqual(again, want) {
		t.Errorf("stripped twice:\n%+v", again)
	}
}

// RBAC forbids listing pods: one warning, however often the informer
// retries, and no names.
func TestResolverForbidden(t *testing.T) {
	l := captureLogs(t)
	client := fakeClient(pod(node, "infer", "vllm-0", uid1, "server", "containerd://"+cid1))
	var lists atomic.Int32
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists.Add(1)
		return true, nil, apierrors.NewForbidden(podsGVR.GroupResource(), "",
			errors.New(`User "system:serviceaccount:monitoring:autoglm-ebpf" cannot list resource "pods" in API group "" at the cluster scope`))
	})

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	start := time.Now()
	r := NewResolver(ctx, fakePods(client), node)
	if d := time.Since(start); d >= syncWait {
		t.Errorf("NewResolver waited %v on a refused list", d)
	}
	testutil.Eventually(t, 20*time.Second, "the informer to retry", func() bool { return lists.Load() >= 2 })
	wantOneWarning(t, l, "forbidden")
	if _, _, _, ok := r.Lookup(uid1, cid1); ok {
		t.Error("Lookup succeeded without a pod list")
	}
	got, err := r.ForPID(procFS(t, "testdata/proc"), 100)
	if err != nil || got != (Pod{UID: uid1, ContainerID: cid1, Cgroup: slice1 + "/cri-containerd-" + cid1 + ".scope"}) {
		t.Errorf("ForPID(100) = %+v, %v; want the cgroup ids only", got, err)
	}
}

// An API server that does not answer holds start-up for syncWait only; the
// names arrive when it does answer.
func TestResolverSlowAPIServer(t *testing.T) {
	l := captureLogs(t)
	old := syncWait
	syncWait = 50 * time.Millisecond
	t.Cleanup(func() { syncWait = old })

	client := fakeClient(pod(node, "infer", "vllm-0", uid1, "server", "containerd://"+cid1))
	answer := make(chan struct{})
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-answer
		return false, nil, nil // on to the reactor that lists
	})

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	start := time.Now()
	r := NewResolver(ctx, fakePods(client), node)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("NewResolver took %v", d)
	}
	wantOneWarning(t, l, "no pod list from the API server within 50ms")
	if _, _, _, ok := r.Lookup(uid1, cid1); ok {
		t.Error("Lookup succeeded without a pod list")
	}

	close(answer)
	testutil.Eventually(t, 20*time.Second, "the pod to be found", func() bool {
		_, _, c, ok := r.Lookup(uid1, cid1)
		return ok && c == "server"
	})
	testutil.Eventually(t, 20*time.Second, "the names to be announced", func() bool {
		return l.has("pod names from the Kubernetes API available now")
	})
	wantOneWarning(t, l, "within 50ms")
}

// Off the cluster, or without a node name, there is one warning and a nil
// Resolver, which still gives the cgroup ids.
func TestResolverUnavailable(t *testing.T) {
	for _, tt := range []struct {
		what    string
		resolve func(ctx context.Context) *Resolver
		err     string
	}{
		{"off the cluster", func(ctx context.Context) *Resolver {
			t.Setenv("KUBERNETES_SERVICE_HOST", "")
			return NewInClusterResolver(ctx, node)
		}, "KUBERNETES_SERVICE_HOST"},
		{"no node name", func(ctx context.Context) *Resolver {
			return NewResolver(ctx, fakePods(fakeClient()), "")
		}, "NODE_NAME"},
	} {
		l := captureLogs(t)
		r := tt.resolve(t.Context())
		if r != nil {
			t.Errorf("%s: got a resolver", tt.what)
		}
		wantOneWarning(t, l, tt.err)
		if _, _, _, ok := r.Lookup(uid1, cid1); ok {
			t.Errorf("%s: nil resolver looked up a pod", tt.what)
		}
		got, err := r.ForPID(procFS(t, "testdata/proc"), 105)
		if err != nil || got != (Pod{UID: uid5, ContainerID: cid6, Cgroup: slice5 + "/crio-" + cid6 + ".scope"}) {
			t.Errorf("%s: ForPID(105) = %+v, %v; want the cgroup ids", tt.what, got, err)
		}
	}
}

// ForPID passes on cgroup errors.
func TestForPIDError(t *testing.T) {
	var r *Resolver
	if _, err := r.ForPID(procFS(t, "testdata/proc"), 200); err == nil || !strings.Contains(err.Error(), "pid 200") {
		t.Errorf("ForPID(200): %v, want the parse error", err)
	}
}
