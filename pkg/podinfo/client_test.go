package podinfo

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// apiServer answers pod lists and watches in protobuf, as the API server
// does, with the pods of this node: vllm-0 at first, vllm-2 once a watch
// is under way. It checks that the client narrows every request to the node
// and asks for protobuf, and that nothing but pods is asked for.
type apiServer struct {
	t          *testing.T
	watchList  bool // stream the first list as a watch (sendInitialEvents)
	refuse     bool // answer everything as RBAC does without the ClusterRole
	enc        runtime.Encoder
	stream     runtime.Serializer
	framer     runtime.Framer
	mu         sync.Mutex
	violations []string
}

func newAPIServer(t *testing.T, watchList, refuse bool) *rest.Config {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	codecs := serializer.NewCodecFactory(scheme)
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		t.Fatal("no protobuf serializer")
	}
	s := &apiServer{t: t, watchList: watchList, refuse: refuse,
		enc:    codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion),
		stream: info.StreamSerializer.Serializer, framer: info.StreamSerializer.Framer}
	srv := httptest.NewServer(s)
	t.Cleanup(func() {
		srv.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, v := range s.violations {
			t.Error(v)
		}
	})
	return &rest.Config{Host: srv.URL}
}

func (s *apiServer) violation(r *http.Request, what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.violations = append(s.violations, r.URL.String()+": "+what)
}

func (s *apiServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if r.URL.Path != "/api/v1/pods" {
		s.violation(r, "not the pods of all namespaces")
	}
	if sel := q.Get("fieldSelector"); sel != "spec.nodeName="+node {
		s.violation(r, "field selector "+sel)
	}
	if a := r.Header.Get("Accept"); !strings.HasPrefix(a, runtime.ContentTypeProtobuf) {
		s.violation(r, "Accept "+a)
	}
	w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
	switch {
	case s.refuse:
		st := apierrors.NewForbidden(podsGVR.GroupResource(), "",
			errors.New(`User "system:serviceaccount:monitoring:autoglm-ebpf" cannot list resource "pods" in API group "" at the cluster scope`)).Status()
		s.reply(w, http.StatusForbidden, &st)
	case q.Get("watch") != "true":
		s.reply(w, http.StatusOK, &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "10"},
			Items: []corev1.Pod{*pod(node, "infer", "vllm-0", uid1, "server", "containerd://"+cid1)}})
	case q.Get("sendInitialEvents") == "true" && !s.watchList:
		// What an API server without the WatchList feature answers; the
		// reflector falls back to a list.
		st := apierrors.NewInvalid(metav1.SchemeGroupVersion.WithKind("ListOptions").GroupKind(), "", field.ErrorList{
			field.Forbidden(field.NewPath("sendInitialEvents"), "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"),
		}).Status()
		s.reply(w, http.StatusUnprocessableEntity, &st)
	default:
		s.watch(w, r, q.Get("sendInitialEvents") == "true")
	}
}

func (s *apiServer) reply(w http.ResponseWriter, code int, obj runtime.Object) {
	w.WriteHeader(code)
	if err := s.enc.Encode(obj, w); err != nil {
		s.t.Error(err)
	}
}

// watch streams watch events until the client goes: with initial events,
// vllm-0 and the bookmark that ends them; then vllm-2, created since.
func (s *apiServer) watch(w http.ResponseWriter, r *http.Request, initial bool) {
	w.Header().Set("Content-Type", runtime.ContentTypeProtobuf+";stream=watch")
	w.WriteHeader(http.StatusOK)
	events := streaming.NewEncoder(s.framer.NewFrameWriter(w), s.stream)
	send := func(typ watch.EventType, p *corev1.Pod) {
		raw, err := runtime.Encode(s.enc, p)
		if err == nil {
			err = events.Encode(&metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: raw}})
		}
		if err != nil {
			s.t.Error(err)
		}
		w.(http.Flusher).Flush()
	}
	if initial {
		first := pod(node, "infer", "vllm-0", uid1, "server", "containerd://"+cid1)
		first.ResourceVersion = "10"
		send(watch.Added, first)
		send(watch.Bookmark, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "10",
			Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
	}
	late := pod(node, "infer", "vllm-2", uid6, "server", "containerd://"+cid8)
	late.ResourceVersion = "11"
	send(watch.Added, late)
	<-r.Context().Done()
}

// The client NewInClusterResolver builds speaks protobuf with a scheme of
// core/v1 alone: it decodes lists, watch events and a refusal's Status, on
// API servers with and without streamed lists.
func TestInClusterClient(t *testing.T) {
	for _, tt := range []struct {
		what      string
		watchList bool
	}{
		{"list, then watch", false},
		{"list streamed as a watch", true},
	} {
		t.Run(tt.what, func(t *testing.T) {
			l := captureLogs(t)
			pods, err := allPods(newAPIServer(t, tt.watchList, false))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			r := NewResolver(ctx, pods, node)
			if !r.informer.HasSynced() {
				t.Fatal("not synced after NewResolver")
			}
			if ns, name, c, ok := r.Lookup(uid1, cid1); !ok || ns != "infer" || name != "vllm-0" || c != "server" {
				t.Errorf("Lookup(uid1, cid1) = %s, %s, %s, %v", ns, name, c, ok)
			}
			testutil.Eventually(t, 20*time.Second, "the watched pod to be found", func() bool {
				_, name, c, ok := r.Lookup(uid6, cid8)
				return ok && name == "vllm-2" && c == "server"
			})
			if w := l.warnings(); len(w) != 0 {
				t.Errorf("warnings on a working API server: %q", w)
			}
		})
	}

	t.Run("forbidden", func(t *testing.T) {
		l := captureLogs(t)
		pods, err := allPods(newAPIServer(t, true, true))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		r := NewResolver(ctx, pods, node)
		// The Status's message, decoded, not client-go's guess from the code.
		wantOneWarning(t, l, `cannot list resource "pods"`)
		if _, _, _, ok := r.Lookup(uid1, cid1); ok {
			t.Error("Lookup succeeded without a pod list")
		}
	})
}
