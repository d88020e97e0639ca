// Package kubeevents reports findings as Kubernetes events on their pods,
// where `kubectl describe pod` and `kubectl get events` show them beside
// the kubelet's own: a finding that becomes active, escalates or ends is
// one event. Events go through client-go's event broadcaster, as the
// kubelet's do: its correlator counts a repeated event on the one object,
// combines many similar events of a pod into one, and rate-limits each pod.
package kubeevents

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/open-autoglm/autoglm-ebpf/pkg/changes"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/stack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/kubeclient"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// component is the events' source, as `kubectl get events` shows it.
const component = "autoglm-ebpf"

// requestTimeout bounds one write to the API server: events are written
// one after the other, and a request never answered would hold back every
// later one.
const requestTimeout = 10 * time.Second

// flushWait bounds how long Close waits for the events queued before it to
// be written: a slow API server must not hold up the daemon's exit.
const flushWait = 5 * time.Second

// flushUID marks the event Close queues last, which never reaches the API
// server (flushSink); a pod's UID is a UUID and cannot be it.
const flushUID types.UID = "autoglm-ebpf-flush"

// Sink is a pipeline sink that records an event on a finding's pod each
// time the finding becomes active, its severity rises, or it ends. A
// process in no pod, or in one whose name is unknown (no RBAC to read
// pods), gets none. Update never waits for the API server: the broadcaster
// queues events (dropping them past 1000) and writes them from a goroutine
// of its own.
type Sink struct {
	changes     *changes.Tracker
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	flushed     chan struct{}
	flushWait   time.Duration
}

// NewInCluster builds a Sink writing to the API server of the pod it runs
// in, with its service account, as podinfo.NewInClusterResolver reads it.
// node names the events' source host (the kubelet's is its node too).
func NewInCluster(node string) (*Sink, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, err
	}
	cfg.Timeout = requestTimeout
	client, err := kubeclient.CoreV1(cfg)
	if err != nil {
		return nil, err
	}
	return New(apiSink{client}, node, record.CorrelatorOptions{}), nil
}

// New builds a Sink writing to sink through a broadcaster whose
// correlator has opts (the zero value: the kubelet's defaults, a burst of
// 25 events per pod then one every 5 minutes, and similar events combined
// from the 10th in 10 minutes).
func New(sink record.EventSink, node string, opts record.CorrelatorOptions) *Sink {
	// client-go logs through the logr logger in its context (the
	// broadcaster's) or given to it (the recorder's); hand it ours so its
	// messages obey the daemon's handler and level.
	log := logr.FromSlogHandler(slog.Default().Handler())
	b := record.NewBroadcaster(record.WithCorrelatorOptions(opts), record.WithContext(logr.NewContext(context.Background(), log)))
	s := &Sink{changes: changes.NewTracker(), broadcaster: b, flushed: make(chan struct{}), flushWait: flushWait}
	b.StartRecordingToSink(&flushSink{EventSink: sink, flushed: s.flushed})
	// The scheme would name the kind of an object passed whole; a
	// reference names its own.
	s.recorder = b.NewRecorder(runtime.NewScheme(), corev1.EventSource{Component: component, Host: node}).WithLogger(log)
	return s
}

// Update records the events of the changes since the previous snapshot.
func (s *Sink) Update(snap *model.Snapshot) {
	for _, c := range s.changes.Next(snap) {
		if c.Process == nil {
			continue
		}
		// The name comes from the API server; a finding raised before it
		// came (seconds at most after a pod starts) has no event.
		pod := c.Process.Pod
		if pod.UID == "" || pod.Namespace == "" || pod.Name == "" {
			continue
		}
		if c.Event == changes.Updated && model.SeverityLevel(c.Finding.Severity) <= model.SeverityLevel(c.Was) {
			continue // it calmed down: nothing a user must look at
		}
		ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID)}
		s.recorder.Event(ref, eventType(c), reason(c), message(c))
	}
}

// Close records the final changes, waits (at most flushWait) for the events
// queued to be written, and shuts the broadcaster down.
func (s *Sink) Close(final *model.Snapshot) error {
	if final != nil {
		s.Update(final)
	}
	// The broadcaster hands events to the sink one after the other, in
	// order: when the sink sees this one, those before it are written or
	// given up on. Shutdown alone would drop those still queued.
	s.recorder.Event(&corev1.ObjectReference{UID: flushUID}, corev1.EventTypeNormal, "Flush", "")
	select {
	case <-s.flushed:
	case <-time.After(s.flushWait):
		slog.Warn("Kubernetes events still queued at exit are dropped: the API server did not take them in time", "waited", s.flushWait)
	}
	s.broadcaster.Shutdown()
	return nil
}

// flushSink passes events on to the API server's sink, except Close's
// marker, which it reports.
type flushSink struct {
	record.EventSink
	flushed chan struct{}
}

func (f *flushSink) Create(e *corev1.Event) (*corev1.Event, error) {
	if e.InvolvedObject.UID == flushUID {
		close(f.flushed)
		return e, nil
	}
	return f.EventSink.Create(e)
}

// reason is a change's event reason: the finding's kind in CamelCase
// (fd_leak: FdLeak), with Ended after it for its end (FdLeakEnded).
func reason(c changes.Change) string {
	var b strings.Builder
	for part := range strings.SplitSeq(c.Finding.Kind, "_") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	if c.Event == changes.Ended {
		b.WriteString("Ended")
	}
	return b.String()
}

// eventType is Warning for an active warning or critical finding; Normal
// for an info one, and for any end.
func eventType(c changes.Change) string {
	if c.Event == changes.Ended || model.SeverityLevel(c.Finding.Severity) < model.SeverityLevel(model.SeverityWarning) {
		return corev1.EventTypeNormal
	}
	return corev1.EventTypeWarning
}

// message is the finding's summary, its call site where the summary does
// not name it, and in brackets what changed and the process:
//
//	fd leak: 480 open fds growing 19.8/s; 40 unclosed fds older than 3s opened at cache_tokenizer (demo.c:37) [warning; pid 1234 (demo) in container fds]
func message(c changes.Change) string {
	f := c.Finding
	var b strings.Builder
	b.WriteString(f.Summary)
	if site := stack.CallSite(f.Stack); site != "" && !strings.Contains(f.Summary, site) {
		fmt.Fprintf(&b, " at %s", site)
	}
	switch c.Event {
	case changes.Active:
		fmt.Fprintf(&b, " [%s", f.Severity)
	case changes.Updated:
		fmt.Fprintf(&b, " [%s, was %s", f.Severity, c.Was)
	case changes.Ended:
		b.WriteString(" [ended")
	}
	fmt.Fprintf(&b, "; pid %d (%s)", f.PID, f.Comm)
	if name := c.Process.Pod.Container; name != "" {
		fmt.Fprintf(&b, " in container %s", name)
	}
	if c.Event == changes.Ended && c.Process.Exited {
		b.WriteString(", exited")
	}
	b.WriteString("]")
	return b.String()
}
