package kubeevents

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

const node = "gpu-node-1"

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// newSink is a Sink writing to a fake API server. Its flush may take long:
// the tests count what reached the API after Close, and a flush that
// never came would show as events missing, not as a test that hangs.
func newSink(t *testing.T, opts record.CorrelatorOptions) (*Sink, *fake.Clientset) {
	t.Helper()
	cs := fake.NewClientset()
	s := New(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")}, node, opts)
	s.flushWait = 30 * time.Second
	return s, cs
}

// stored lists the events the fake API server holds, oldest first.
func stored(t *testing.T, cs *fake.Clientset) []corev1.Event {
	t.Helper()
	list, err := cs.CoreV1().Events(metav1.NamespaceAll).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Names end in the event's time in hex nanoseconds.
	slices.SortFunc(list.Items, func(a, b corev1.Event) int { return strings.Compare(a.Name, b.Name) })
	return list.Items
}

// line is an event as `kubectl get events` shows it.
func line(e corev1.Event) string {
	return fmt.Sprintf("%s %s %s/%s x%d: %s", e.Type, e.Reason, e.InvolvedObject.Namespace, e.InvolvedObject.Name, e.Count, e.Message)
}

func pod(name string) model.Pod {
	return model.Pod{UID: "uid-" + name, ContainerID: "c0ffee", Namespace: "ml", Name: name, Container: "server"}
}

func snap(sec int, procs []*model.Process, fs ...model.Finding) *model.Snapshot {
	return &model.Snapshot{Time: t0.Add(time.Duration(sec) * time.Second), Processes: procs, Findings: fs}
}

func fdLeak(pid int, summary string) model.Finding {
	return model.Finding{Kind: model.KindFDLeak, PID: pid, Comm: "serve", Severity: model.SeverityWarning, FirstSeen: t0, Active: true,
		Summary: summary, Stack: testutil.Frames("__open64+0x51 (libc.so.6)", "cache_tokenizer (demo.c:37)")}
}

// A finding's life is three events on its pod, kubelet style: when it
// becomes active, when it escalates, when it ends; none for figures that
// move, for a severity that falls, nor for processes in no pod or in one
// whose name is unknown.
func TestFindingLifecycle(t *testing.T) {
	s, cs := newSink(t, record.CorrelatorOptions{})
	serve := &model.Process{PID: 42, Comm: "serve", Pod: pod("vllm-0")}
	host := &model.Process{PID: 7, Comm: "train"}
	unnamed := &model.Process{PID: 8, Comm: "serve", Pod: model.Pod{UID: "0e3b7d1a-5c2f-4f61-8d0e-7a9c4b2e1f30", ContainerID: "beef"}}
	procs := []*model.Process{serve, host, unnamed}
	leak := fdLeak(42, "fd leak: 480 open fds growing 19.8/s; 40 unclosed fds older than 3s opened at cache_tokenizer (demo.c:37)")
	elsewhere := []model.Finding{fdLeak(7, "fd leak: 90 open fds growing 2.0/s"), fdLeak(8, "fd leak: 60 open fds growing 1.0/s")}
	burst := model.Finding{Kind: model.KindGPUAllocBurst, PID: 42, Comm: "serve", Severity: model.SeverityInfo, FirstSeen: t0.Add(5 * time.Second),
		Active: true, Summary: "GPU allocation burst: 3.0 GiB in 2s", Stack: testutil.Frames("cudaMalloc+0x10 (libcudart.so.11.0)", "warmup_kv_cache (demo.c:52)")}

	s.Update(snap(0, procs))
	s.Update(snap(1, procs, append([]model.Finding{leak}, elsewhere...)...))
	leak.Summary = "fd leak: 520 open fds growing 19.9/s; 44 unclosed fds older than 3s opened at cache_tokenizer (demo.c:37)"
	s.Update(snap(2, procs, append([]model.Finding{leak}, elsewhere...)...))
	leak.Severity = model.SeverityCritical
	leak.Summary += "; limit 1024 reached in ~25s"
	s.Update(snap(3, procs, append([]model.Finding{leak}, elsewhere...)...))
	leak.Severity = model.SeverityWarning
	s.Update(snap(4, procs, append([]model.Finding{leak}, elsewhere...)...))
	leak.Active = false
	leak.Summary = "fd leak ended: 530 open fds, none opened at cache_tokenizer (demo.c:37) still growing"
	s.Update(snap(5, procs, append([]model.Finding{leak, burst}, elsewhere...)...))
	// The process exits: the pipeline ends its findings.
	burst.Active = false
	serve.Exited = true
	final := snap(6, procs, append([]model.Finding{leak, burst}, elsewhere...)...)
	if err := s.Close(final); err != nil {
		t.Fatal(err)
	}

	const who = "pid 42 (serve) in container server"
	want := []string{
		"Warning FdLeak ml/vllm-0 x1: fd leak: 480 open fds growing 19.8/s; 40 unclosed fds older than 3s opened at cache_tokenizer (demo.c:37) [warning; " + who + "]",
		"Warning FdLeak ml/vllm-0 x1: fd leak: 520 open fds growing 19.9/s; 44 unclosed fds older than 3s opened at cache_tokenizer (demo.c:37); limit 1024 reached in ~25s [critical, was warning; " + who + "]",
		"Normal FdLeakEnded ml/vllm-0 x1: fd leak ended: 530 open fds, none opened at cache_tokenizer (demo.c:37) still growing [ended; " + who + "]",
		"Normal GpuAllocBurst ml/vllm-0 x1: GPU allocation burst: 3.0 GiB in 2s at warmup_kv_cache (demo.c:52) [info; " + who + "]",
		"Normal GpuAllocBurstEnded ml/vllm-0 x1: GPU allocation burst: 3.0 GiB in 2s at warmup_kv_cache (demo.c:52) [ended; " + who + ", exited]",
	}
	events := stored(t, cs)
	var got []string
	for _, e := range events {
		got = append(got, line(e))
		ref := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "ml", Name: "vllm-0", UID: "uid-vllm-0"}
		if e.InvolvedObject != ref || e.Namespace != "ml" {
			t.Errorf("%s: in namespace %s about %+v, want the pod %+v", e.Reason, e.Namespace, e.InvolvedObject, ref)
		}
		if e.Source != (corev1.EventSource{Component: "autoglm-ebpf", Host: node}) || e.ReportingController != "autoglm-ebpf" || e.ReportingInstance != node {
			t.Errorf("%s: source %+v, reporting %s/%s", e.Reason, e.Source, e.ReportingController, e.ReportingInstance)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// An event that comes again (a leak that stops and starts again alike) is
// one event counted twice, as the correlator counts the kubelet's.
func TestRepeatCounted(t *testing.T) {
	s, cs := newSink(t, record.CorrelatorOptions{})
	procs := []*model.Process{{PID: 42, Comm: "serve", Pod: pod("vllm-0")}}
	leak := fdLeak(42, "fd leak: 480 open fds growing 19.8/s")
	s.Update(snap(0, procs, leak))
	ended := leak
	ended.Active = false
	again := leak
	again.FirstSeen = t0.Add(time.Minute)
	s.Update(snap(60, procs, ended, again))
	if err := s.Close(nil); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range stored(t, cs) {
		got = append(got, e.Reason+" x"+fmt.Sprint(e.Count))
	}
	if want := []string{"FdLeak x2", "FdLeakEnded x1"}; !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
	patched := slices.ContainsFunc(cs.Actions(), func(a k8stesting.Action) bool { return a.GetVerb() == "patch" })
	if !patched {
		t.Errorf("the repeat was not a patch of the first event: %v", cs.Actions())
	}
}

// Many similar events on one pod (twelve workers leaking alike) are
// combined from the tenth on into one event, counted.
func TestSimilarCombined(t *testing.T) {
	s, cs := newSink(t, record.CorrelatorOptions{})
	var procs []*model.Process
	var fs []model.Finding
	for pid := 100; pid < 112; pid++ {
		procs = append(procs, &model.Process{PID: pid, Comm: "worker", Pod: pod("train-0")})
		fs = append(fs, fdLeak(pid, "fd leak: 480 open fds growing 19.8/s"))
	}
	s.Update(snap(0, procs, fs...))
	if err := s.Close(nil); err != nil {
		t.Fatal(err)
	}
	events := stored(t, cs)
	if len(events) != 10 {
		t.Fatalf("%d events, want 9 and one combining the rest:\n%s", len(events), lines(events))
	}
	last := events[9]
	if !strings.HasPrefix(last.Message, "(combined from similar events): fd leak") || last.Count != 3 || last.Reason != "FdLeak" {
		t.Errorf("the 10th event: %s", line(last))
	}
}

// The correlator's rate limit holds per pod: a pod past its burst gets no
// more events, another pod still gets its own.
func TestRateLimitedPerPod(t *testing.T) {
	clock := testingclock.NewFakeClock(t0)
	s, cs := newSink(t, record.CorrelatorOptions{BurstSize: 3, QPS: 1. / 3600, Clock: clock})
	noisy := &model.Process{PID: 42, Comm: "serve", Pod: pod("noisy")}
	quiet := &model.Process{PID: 43, Comm: "serve", Pod: pod("quiet-0")}
	var fs []model.Finding
	for _, kind := range []string{model.KindFDLeak, model.KindSocketLeak, model.KindCtxSwitchStorm, model.KindGPUMemoryLeak, model.KindGPUAllocChurn} {
		fs = append(fs, model.Finding{Kind: kind, PID: 42, Comm: "serve", Severity: model.SeverityWarning, FirstSeen: t0, Active: true, Summary: kind})
	}
	fs = append(fs, model.Finding{Kind: model.KindFDLeak, PID: 43, Comm: "serve", Severity: model.SeverityWarning, FirstSeen: t0, Active: true, Summary: "fd leak"})
	s.Update(snap(0, []*model.Process{noisy, quiet}, fs...))
	if err := s.Close(nil); err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	events := stored(t, cs)
	for _, e := range events {
		per[e.InvolvedObject.Name]++
	}
	if per["noisy"] != 3 || per["quiet-0"] != 1 {
		t.Errorf("events per pod %v, want noisy 3 (its burst), quiet-0 1:\n%s", per, lines(events))
	}
}

// Close writes what was queued before it: the broadcaster's Shutdown
// alone drops what its goroutine has not taken yet.
func TestCloseFlushes(t *testing.T) {
	s, cs := newSink(t, record.CorrelatorOptions{})
	var procs []*model.Process
	var fs []model.Finding
	for pid := 1000; pid < 1300; pid++ {
		procs = append(procs, &model.Process{PID: pid, Comm: "serve", Pod: pod(fmt.Sprintf("pod-%d", pid))})
		fs = append(fs, fdLeak(pid, "fd leak: 480 open fds growing 19.8/s"))
	}
	if err := s.Close(snap(0, procs, fs...)); err != nil {
		t.Fatal(err)
	}
	if n := len(stored(t, cs)); n != len(fs) {
		t.Errorf("%d events after Close, want %d", n, len(fs))
	}
}

// An API server that takes no event holds up neither the pipeline (Update)
// nor the daemon's exit (Close) beyond the flush's bound.
func TestStuckAPIServer(t *testing.T) {
	s, cs := newSink(t, record.CorrelatorOptions{})
	s.flushWait = 100 * time.Millisecond
	release := make(chan struct{})
	cs.PrependReactor("create", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-release
		return false, nil, nil
	})
	t.Cleanup(func() { close(release) })
	var procs []*model.Process
	var fs []model.Finding
	// More than the broadcaster queues (1000): the rest are dropped.
	for pid := 1000; pid < 2500; pid++ {
		procs = append(procs, &model.Process{PID: pid, Comm: "serve", Pod: pod(fmt.Sprintf("pod-%d", pid))})
		fs = append(fs, fdLeak(pid, "fd leak: 480 open fds growing 19.8/s"))
	}
	start := time.Now()
	s.Update(snap(0, procs, fs...))
	if err := s.Close(nil); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Update and Close took %v with the API server stuck", d)
	}
}

func lines(events []corev1.Event) string {
	var out []string
	for _, e := range events {
		out = append(out, line(e))
	}
	return strings.Join(out, "\n")
}
