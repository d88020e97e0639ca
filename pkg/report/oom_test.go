package report

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// kvStack is where the failing process (pid 100) holds most of its memory:
// the runtime's frame, then its Python lines.
var kvStack = []model.Frame{
	{Kind: model.FrameNative, Function: "cudaMalloc", Module: "libcudart.so.12", Offset: 0x10},
	{Kind: model.FramePython, Function: "allocate_kv_cache", File: "engine.py", Line: 210},
	{Kind: model.FramePython, Function: "main", File: "serve.py", Line: 12},
}

// oomFailure is an out of memory of pid 100 on GPU 3 with its snapshot:
// 22 GiB live, 18 GiB of it at allocate_kv_cache, a 4 GiB burst at
// prefill freed right after; pod batch/embed-7 (pid 77, watched) held
// 51 GiB on the device, a process not watched 1 GiB.
func oomFailure() model.Finding {
	at := t0.Add(20 * time.Second)
	nvml, gap, neighbourLive, selfLive := uint64(25<<30), int64(3<<30), uint64(50<<30), uint64(22<<30)
	nvmlBefore := uint64(21 << 30)
	prefill := []model.Frame{{Kind: model.FramePython, Function: "prefill", File: "engine.py", Line: 300}}
	snap := &model.GPUMemorySnapshot{
		Time: at, API: "cudaMalloc", Error: "cudaErrorMemoryAllocation", Code: 2, SizeBytes: 2 << 30, Stack: kvStack, Why: model.SnapshotOutOfMemory,
		LiveBytes: 22 << 30, LiveAllocations: 40, FreedAfterBytes: 4 << 30, MissedFrees: 3, OtherSitesBytes: 0,
		Sites: []model.SnapshotSite{
			{Bytes: 18 << 30, Allocations: 2, OldestAgeSeconds: 120, Stack: kvStack},
			{Bytes: 4 << 30, Allocations: 38, OldestAgeSeconds: 0.5, FreedAfterBytes: 4 << 30, Stack: prefill},
		},
		History: []model.MemoryPoint{
			{Time: at.Add(-2 * time.Second), LiveBytes: 18 << 30, PeakBytes: 19 << 30, NVMLBytes: &nvmlBefore},
			{Time: at, LiveBytes: 22 << 30, PeakBytes: 22 << 30, NVMLBytes: &nvml},
		},
		Devices: []model.SnapshotDevice{{Index: 3, UUID: "GPU-3333", Name: "H100", MemoryUsedBytes: 78 << 30, MemoryTotalBytes: 80 << 30, SampledAt: at,
			Processes: []model.SnapshotProcess{
				{PID: 77, Comm: "python", Pod: model.Pod{Namespace: "batch", Name: "embed-7"}, UsedBytes: 51 << 30, Watched: true, LiveBytes: &neighbourLive,
					TopSites: []model.SnapshotSite{{Bytes: 50 << 30, Allocations: 1, OldestAgeSeconds: 600,
						Stack: []model.Frame{{Kind: model.FramePython, Function: "load_embeddings", File: "embed.py", Line: 44}}}}},
				{PID: 100, Comm: "vllm", UsedBytes: 25 << 30, Self: true, Watched: true, LiveBytes: &selfLive},
				{PID: 555, UsedBytes: 1 << 30},
			}}},
		NVMLUsedBytes: &nvml, GapBytes: &gap, Profile: "/tmp/pprof/100-gpu-oom-20250102T030425.pb.gz",
	}
	return model.Finding{Kind: model.KindGPUAllocFailure, PID: 100, Comm: "vllm", Severity: model.SeverityCritical, FirstSeen: at, LastSeen: at.Add(time.Second), Active: true,
		Summary: "GPU allocation failed: cudaMalloc returned cudaErrorMemoryAllocation (out of memory) for 2.0 GiB. " + snap.Describe(func(s []model.Frame) string { return s[1].String() }),
		Stack:   kvStack,
		Evidence: model.GPUAllocFailureEvidence{API: "cudaMalloc", Code: 2, Count: 3, Error: "cudaErrorMemoryAllocation", FirstFailure: at, LastFailure: at,
			LiveBytes: 18 << 30, SizeBytes: 2 << 30, MaxSizeBytes: 2 << 30, Snapshot: snap, Snapshots: 1}}
}

// oomReport writes a report of pid 100 with the failure into out.
func oomReport(t testing.TB, out Outputs, findings ...model.Finding) {
	t.Helper()
	w := New("v-test", out)
	p := proc(100, "vllm", 10, false)
	p.CUDA = model.CUDAStats{LiveBytes: 18 << 30, AllocBytes: map[string]uint64{"cudaMalloc": 30 << 30}, Libraries: []string{"libcudart.so.12"}}
	if err := w.Close(&model.Snapshot{Time: t0.Add(30 * time.Second), Start: t0, Targets: []int{100}, Processes: []*model.Process{p}, Findings: findings}); err != nil {
		t.Fatal(err)
	}
}

// A failure's snapshot is in the JSON report and reads back as it was
// written; the card shows it: its figures, its sites with their stacks,
// the device's processes with the failing one marked, the neighbour's own
// sites, the minute before. A failure without one (an older report's)
// shows what it showed before.
func TestFailureSnapshotCard(t *testing.T) {
	f := oomFailure()
	old := oomFailure()
	old.FirstSeen = old.FirstSeen.Add(time.Second)
	ev := old.Evidence.(model.GPUAllocFailureEvidence)
	ev.Snapshot, ev.Snapshots = nil, 0
	old.Evidence = ev
	old.Summary = "GPU allocation failed"

	w, buf := toStdout()
	if err := w.Close(&model.Snapshot{Time: t0.Add(30 * time.Second), Start: t0, Processes: []*model.Process{proc(100, "vllm", 10, false)}, Findings: []model.Finding{f, old}}); err != nil {
		t.Fatal(err)
	}
	if strings.Count(buf.String(), `"snapshot":`) != 1 || strings.Count(buf.String(), `"snapshots":`) != 1 {
		t.Errorf("the JSON report has %d snapshot keys, want those of the one failure with a snapshot", strings.Count(buf.String(), `"snapshot`))
	}
	r, err := Decode(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Findings) != 2 || !reflect.DeepEqual(r.Findings[0].Evidence, f.Evidence) || !reflect.DeepEqual(r.Findings[1].Evidence, old.Evidence) {
		t.Fatalf("evidence read back\n%#v\nwant\n%#v", r.Findings, []model.Evidence{f.Evidence, old.Evidence})
	}

	var page bytes.Buffer
	if err := WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	cards := regexp.MustCompile(`(?s)<div class="finding sev-critical" id="finding-\d+" data-kind="gpu_alloc_failure">.*?</table>\n</div>`).FindAllString(page.String(), -1)
	if len(cards) != 2 {
		t.Fatalf("%d failure cards, want 2", len(cards))
	}
	card := cards[0]
	for _, s := range []string{
		`title="snapshot">snapshot</td><td>at 03:04:25, of cudaMalloc, for 2.0 GiB</td>`,
		`title="snapshot.why">taken for</td><td>out of memory</td>`,
		`title="snapshot.live_bytes">live at the failure</td><td>22.0 GiB</td>`,
		`title="snapshot.freed_after_bytes">of it freed right after</td><td>4.0 GiB</td>`,
		`title="snapshot.missed_frees">frees after it not kept</td><td>3</td>`,
		`title="snapshot.nvml_used_bytes">NVML used</td><td>25.0 GiB</td>`,
		`<td>3.0 GiB</td>`, // the gap
		`<td>/tmp/pprof/100-gpu-oom-20250102T030425.pb.gz</td>`,
		`<tr><td>18.0 GiB</td><td>2</td><td>2 min</td><td>0 B</td></tr>`,
		`<div>allocate_kv_cache (engine.py:210)</div>`,
		`<tr><td>4.0 GiB</td><td>38</td><td>500.00 ms</td><td>4.0 GiB</td></tr>`,
		`title="snapshot.devices">GPU 3</td><td>H100, used 78.0 GiB, of 80.0 GiB, sampled at 03:04:25</td>`,
		`title="snapshot.devices.processes">processes on GPU 3</td>`,
		`<tr><td>77</td><td>python</td><td>batch/embed-7</td><td>51.0 GiB</td><td>yes</td><td>50.0 GiB</td></tr>`,
		`<tr><td>100 (self)</td><td>vllm</td><td>–</td><td>25.0 GiB</td><td>yes</td><td>22.0 GiB</td></tr>`,
		`<tr><td>555</td><td></td><td>–</td><td>1.0 GiB</td><td>no</td><td>–</td></tr>`,
		`<tr><td>77</td><td>50.0 GiB</td><td>1</td><td>10 min</td></tr>`,
		`<div>load_embeddings (embed.py:44)</div>`,
		`title="snapshot.history">the minute before</td><td>live least 18.0 GiB, most 22.0 GiB, peak 22.0 GiB, NVML least 21.0 GiB, most 25.0 GiB, polls 2</td>`,
	} {
		if !strings.Contains(card, s) {
			t.Errorf("the failure's card lacks %s:\n%s", s, card)
		}
	}
	if strings.Contains(cards[1], "snapshot") {
		t.Errorf("the card of a failure without a snapshot shows one:\n%s", cards[1])
	}
	rows := regexp.MustCompile(`title="([a-z_]+)"`).FindAllStringSubmatch(cards[1], -1)
	var keys []string
	for _, m := range rows {
		keys = append(keys, m[1])
	}
	if got := strings.Join(keys, " "); got != "api error size_bytes max_size_bytes count first_failure last_failure live_bytes" {
		t.Errorf("a failure without a snapshot has rows %s, want those it had before snapshots", got)
	}
}

// In the browser, the process shows a flame graph of the memory live at
// the failure, titled with its time and call, and the failure's card the
// device's processes, the neighbour among them; the page from the JSON
// report is the same.
func TestFailureSnapshotInBrowser(t *testing.T) {
	browser := testutil.Chromium(t)
	dir := t.TempDir()
	page, js := filepath.Join(dir, "r.html"), filepath.Join(dir, "r.json")
	oomReport(t, Outputs{HTML: page, JSON: js}, oomFailure())
	r, err := Read(js)
	if err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if err := WriteHTML(&again, r); err != nil {
		t.Fatal(err)
	}
	if html, err := os.ReadFile(page); err != nil || string(html) != again.String() {
		t.Error("the page from the JSON report differs from the run's")
	}

	dom := string(testutil.Headless(t, browser, page, "--dump-dom"))
	if !strings.Contains(dom, `data-script="ok"`) {
		t.Error("the page's script did not run to its end")
	}
	i := strings.Index(dom, `data-flame="gpu_failure"`)
	if i < 0 {
		t.Fatalf("no flame graph of the failure's memory:\n%s", dom)
	}
	fl := dom[i:]
	fl = fl[:strings.Index(fl, "</figure>")]
	for _, s := range []string{
		"GPU memory live when cudaMalloc failed (out of memory) at 03:04:25, by stack",
		"<title>allocate_kv_cache (engine.py:210): 18.0 GiB (81.8 %)</title>",
		"<title>prefill (engine.py:300): 4.0 GiB (18.2 %)</title>",
	} {
		if !strings.Contains(fl, s) {
			t.Errorf("the failure's flame graph lacks %q:\n%s", s, fl)
		}
	}
	card := dom[strings.Index(dom, `data-kind="gpu_alloc_failure"`):]
	for _, s := range []string{`title="snapshot.devices.processes"`, "<td>batch/embed-7</td>", "<td>100 (self)</td>",
		"pod batch/embed-7 held 51.0 GiB on the same GPU"} {
		if !strings.Contains(card, s) {
			t.Errorf("the failure's card in the browser lacks %q", s)
		}
	}
}

// The flame graphs of failures are one per failure finding with a
// snapshot, the newest few, oldest first.
func TestFailureFlamesBounded(t *testing.T) {
	var findings []model.Finding
	for i := range failureFlames + 2 {
		f := oomFailure()
		ev := f.Evidence.(model.GPUAllocFailureEvidence)
		s := *ev.Snapshot
		s.Time = t0.Add(time.Duration(failureFlames+2-i) * time.Second) // newest first
		ev.Snapshot = &s
		f.Evidence = ev
		findings = append(findings, f)
	}
	ev := findings[0].Evidence.(model.GPUAllocFailureEvidence)
	ev.Snapshot = nil // none: no graph
	findings = append(findings, model.Finding{Kind: model.KindGPUAllocFailure, Evidence: ev})
	clock := func(t time.Time) string { return t.Format(time.TimeOnly) }
	var titles []string
	for _, fl := range processFlames(&Process{}, findings, clock) {
		if fl.ID == FlameGPUFailure {
			titles = append(titles, fl.Title[strings.Index(fl.Title, " at ")+4:])
		}
	}
	if want := "03:04:08, by stack|03:04:09, by stack|03:04:10, by stack|03:04:11, by stack"; strings.Join(titles, "|") != want {
		t.Errorf("failure graphs at %v, want %s", titles, want)
	}
}
