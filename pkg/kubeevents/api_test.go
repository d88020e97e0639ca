package kubeevents

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/open-autoglm/autoglm-ebpf/pkg/kubeclient"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// eventsServer answers event writes as the API server does, in protobuf,
// and refuses them in the namespace "locked" as RBAC does without the
// events rule. It keeps each request's method, path, content type and,
// for a patch, its body.
type eventsServer struct {
	t        *testing.T
	codecs   serializer.CodecFactory
	enc      runtime.Encoder
	mu       sync.Mutex
	requests []string
}

func newEventsServer(t *testing.T) (*eventsServer, *rest.Config) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	codecs := serializer.NewCodecFactory(scheme)
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	s := &eventsServer{t: t, codecs: codecs, enc: codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion)}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, &rest.Config{Host: srv.URL}
}

func (s *eventsServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req := r.Method + " " + r.URL.Path + " " + r.Header.Get("Content-Type")
	if r.Method == http.MethodPatch {
		req += " " + string(body)
	}
	s.mu.Lock()
	s.requests = append(s.requests, req)
	s.mu.Unlock()
	w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
	if strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/locked/") {
		st := apierrors.NewForbidden(corev1.Resource("events"), "",
			errors.New(`User "system:serviceaccount:autoglm-ebpf:autoglm-ebpf" cannot create resource "events" in API group "" in the namespace "locked"`)).Status()
		w.WriteHeader(http.StatusForbidden)
		_ = s.enc.Encode(&st, w)
		return
	}
	e := &corev1.Event{}
	if r.Method != http.MethodPatch {
		if _, _, err := s.codecs.UniversalDeserializer().Decode(body, nil, e); err != nil {
			s.t.Errorf("%s: %v", req, err)
		}
	}
	e.Name = "vllm-0.1" // what a patch names
	e.Count++
	w.WriteHeader(http.StatusCreated)
	if err := s.enc.Encode(e, w); err != nil {
		s.t.Error(err)
	}
}

func (s *eventsServer) took() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// The daemon's own client writes events where client-go's typed client
// does, in protobuf, and patches a repeat with a strategic merge patch;
// the API server's refusal reaches the broadcaster as the API error that
// it does not retry.
func TestAPISink(t *testing.T) {
	srv, cfg := newEventsServer(t)
	client, err := kubeclient.CoreV1(cfg)
	if err != nil {
		t.Fatal(err)
	}
	a := apiSink{client}
	e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "vllm-0.1", Namespace: "ml"}, Reason: "FdLeak", Message: "fd leak"}
	got, err := a.Create(e)
	if err != nil || got.Reason != "FdLeak" || got.Count != 1 {
		t.Errorf("Create: %+v, %v", got, err)
	}
	if got, err = a.Update(e); err != nil || got.Message != "fd leak" {
		t.Errorf("Update: %+v, %v", got, err)
	}
	if _, err = a.Patch(e, []byte(`{"count":2}`)); err != nil {
		t.Errorf("Patch: %v", err)
	}
	_, err = a.Create(&corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "p.2", Namespace: "locked"}})
	var status *apierrors.StatusError
	if !errors.As(err, &status) || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `cannot create resource "events"`) {
		t.Errorf("Create refused: %T %v, want the API server's Forbidden", err, err)
	}
	want := []string{
		"POST /api/v1/namespaces/ml/events " + runtime.ContentTypeProtobuf,
		"PUT /api/v1/namespaces/ml/events/vllm-0.1 " + runtime.ContentTypeProtobuf,
		`PATCH /api/v1/namespaces/ml/events/vllm-0.1 application/strategic-merge-patch+json {"count":2}`,
		"POST /api/v1/namespaces/locked/events " + runtime.ContentTypeProtobuf,
	}
	if got := srv.took(); !slices.Equal(got, want) {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// Through the broadcaster: a refused event is not tried again.
	before := len(srv.took())
	s := New(apiSink{client}, node, record.CorrelatorOptions{})
	s.flushWait = 30 * time.Second
	procs := []*model.Process{{PID: 42, Comm: "serve", Pod: model.Pod{UID: "uid-p", Namespace: "locked", Name: "p"}}}
	s.Update(snap(0, procs, fdLeak(42, "fd leak")))
	if err := s.Close(nil); err != nil {
		t.Fatal(err)
	}
	if got := srv.took()[before:]; len(got) != 1 {
		t.Errorf("requests for a refused event: %q, want one", got)
	}
}
