package podinfo

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/open-autoglm/autoglm-ebpf/pkg/kubeclient"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// syncWait bounds how long NewResolver holds up start-up for the first
// list of pods; after it the informer keeps trying in the background.
var syncWait = 5 * time.Second

// fallbackMsg is the one warning a Resolver logs when it has no pod names.
const fallbackMsg = "pod names unavailable from the Kubernetes API; labels fall back to cgroup ids only"

// mirrorAnnotation holds, on the API server's mirror of a static pod, the
// UID the kubelet uses for the static pod's cgroups (the mirror has its own).
const mirrorAnnotation = "kubernetes.io/config.mirror"

// uidIndex indexes the cached pods by the UIDs their cgroups can carry.
const uidIndex = "uid"

// Pod is what is known about the pod and container of one process.
type Pod struct {
	UID, ContainerID, Cgroup   string // from /proc/PID/cgroup; see Cgroup
	Namespace, Name, Container string // from the API server; empty when unknown
}

// Resolver maps pod UIDs and container ids to names from an informer on
// this node's pods. A nil *Resolver is valid and resolves nothing, so
// callers off the cluster need no special case.
type Resolver struct {
	informer cache.SharedIndexInformer
	warnOnce sync.Once
	fellBack chan struct{} // closed when the warning is logged
}

// NewInClusterResolver builds a Resolver from the service account of the
// pod it runs in. Off the cluster, or when the client cannot be built, it
// logs one warning and returns nil.
func NewInClusterResolver(ctx context.Context, node string) *Resolver {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		slog.Warn(fallbackMsg, "err", err)
		return nil
	}
	pods, err := allPods(cfg)
	if err != nil {
		slog.Warn(fallbackMsg, "err", err)
		return nil
	}
	return NewResolver(ctx, pods, node)
}

// allPods lists and watches the pods of every node on the API server of
// cfg, which it adjusts; NewResolver adds the selector for its node.
func allPods(cfg *rest.Config) (cache.ListerWatcher, error) {
	client, err := kubeclient.CoreV1(cfg)
	if err != nil {
		return nil, err
	}
	// No options of its own: the field selector is NewResolver's to set.
	return cache.NewFilteredListWatchFromClient(client, "pods", metav1.NamespaceAll, func(*metav1.ListOptions) {}), nil
}

// NewResolver starts an informer on the pods scheduled to node and waits for
// its first list at most syncWait. pods lists and watches the pods of every
// node; NewResolver asks it for node's only, with a spec.nodeName field
// selector. If the list fails (API server unreachable, RBAC forbids listing
// pods) or takes longer, it logs one warning and goes on trying in the
// background; Lookup fails until the list arrives. Without a node name it
// would have to watch the whole cluster's pods, so it logs the warning and
// returns nil. The informer stops when ctx is done.
func NewResolver(ctx context.Context, pods cache.ListerWatcher, node string) *Resolver {
	if node == "" {
		slog.Warn(fallbackMsg, "err", "no node name (set NODE_NAME from spec.nodeName)")
		return nil
	}
	selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
	all := cache.ToListerWatcherWithContext(pods)
	onNode := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return all.ListWithContext(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return all.WatchWithContext(ctx, o)
		},
	}
	// The reflector streams its first list as a watch unless pods says it
	// cannot (a fake clientset says so); the wrapper passes that on.
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(onNode, pods),
		&corev1.Pod{}, 0, cache.Indexers{uidIndex: podUIDs})
	r := &Resolver{informer: inf, fellBack: make(chan struct{})}
	// Both setters fail only once the informer runs; it does not yet.
	_ = inf.SetTransform(strip)
	_ = inf.SetWatchErrorHandlerWithContext(r.watchError)

	// client-go logs through the logr logger in its context; hand it ours
	// so its messages obey the daemon's handler and level.
	go inf.RunWithContext(logr.NewContext(ctx, logr.FromSlogHandler(slog.Default().Handler())))

	synced := inf.HasSyncedChecker().Done()
	timer := time.NewTimer(syncWait)
	defer timer.Stop()
	select {
	case <-synced:
		return r
	case <-ctx.Done():
		return r
	case <-r.fellBack:
	case <-timer.C:
		r.warn(errors.New("no pod list from the API server within " + syncWait.String()))
	}
	go func() {
		select {
		case <-synced:
			slog.Info("pod names from the Kubernetes API available now")
		case <-ctx.Done():
		}
	}()
	return r
}

// watchError replaces client-go's handler, which logs every failed retry.
// Before the first list a failure means there are no names: one warning.
// After it the cache keeps the last state while the reflector re-lists.
func (r *Resolver) watchError(_ context.Context, _ *cache.Reflector, err error) {
	if r.informer.HasSynced() {
		slog.Debug("pod watch interrupted", "err", err)
		return
	}
	r.warn(err)
}

func (r *Resolver) warn(err error) {
	r.warnOnce.Do(func() {
		slog.Warn(fallbackMsg, "err", err)
		close(r.fellBack)
	})
}

// Lookup returns the namespace and name of the pod with podUID and the name
// of its container with containerID (a bare id, as in Cgroup). ok is false
// when the pod is unknown; container is empty when the pod has no such
// container in its status (a pause container, or one too new to be there).
func (r *Resolver) Lookup(podUID, containerID string) (namespace, pod, container string, ok bool) {
	if r == nil || podUID == "" {
		return "", "", "", false
	}
	// ByIndex fails only for an index that was never registered.
	objs, _ := r.informer.GetIndexer().ByIndex(uidIndex, podUID)
	if len(objs) == 0 {
		return "", "", "", false
	}
	p := objs[0].(*corev1.Pod)
	if containerID != "" {
		for _, s := range p.Status.ContainerStatuses {
			if bareContainerID(s.ContainerID) == containerID {
				container = s.Name
				break
			}
		}
	}
	return p.Namespace, p.Name, container, true
}

// ForPID reads the cgroup of pid through fs and names its pod and
// container where r knows them.
func (r *Resolver) ForPID(fs procinfo.FS, pid int) (Pod, error) {
	cg, err := ReadCgroup(fs, pid)
	if err != nil {
		return Pod{}, err
	}
	p := Pod{UID: cg.PodUID, ContainerID: cg.ContainerID, Cgroup: cg.Path}
	p.Namespace, p.Name, p.Container, _ = r.Lookup(p.UID, p.ContainerID)
	return p, nil
}

// bareContainerID drops the runtime scheme of a status containerID
// (containerd://, cri-o://, docker://), leaving the id cgroups carry.
func bareContainerID(id string) string {
	if _, bare, ok := strings.Cut(id, "://"); ok {
		return bare
	}
	return id
}

// podUIDs is the uidIndex function: a pod's own UID, plus for a static
// pod's mirror the UID its cgroups carry.
func podUIDs(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	uids := []string{string(p.UID)}
	if h := p.Annotations[mirrorAnnotation]; h != "" {
		uids = append(uids, h)
	}
	return uids, nil
}

// strip keeps of a pod only what Lookup and the cache need, so the cache
// costs a few hundred bytes a pod instead of the full spec and status. All
// container statuses (init, ephemeral) go into ContainerStatuses so Lookup
// searches one list; the result is stripped again unchanged, as client-go
// asks of a transform. ResourceVersion stays because the store records the
// last one it holds.
func strip(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil // a tombstone of a deleted pod
	}
	s := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name:            p.Name,
		Namespace:       p.Namespace,
		UID:             p.UID,
		ResourceVersion: p.ResourceVersion,
	}}
	if h, ok := p.Annotations[mirrorAnnotation]; ok {
		s.Annotations = map[string]string{mirrorAnnotation: h}
	}
	all := [][]corev1.ContainerStatus{p.Status.ContainerStatuses, p.Status.InitContainerStatuses, p.Status.EphemeralContainerStatuses}
	for _, list := range all {
		for _, c := range list {
			if c.ContainerID == "" {
				continue // not started yet: nothing in a cgroup to match
			}
			s.Status.ContainerStatuses = append(s.Status.ContainerStatuses,
				corev1.ContainerStatus{Name: c.Name, ContainerID: c.ContainerID})
		}
	}
	return s, nil
}
