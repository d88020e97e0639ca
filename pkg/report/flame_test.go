package report

import (
	"image/color"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// flameReport is a run of one process that holds GPU memory from two
// sites (load_weights 3 GiB, cache_kv 1 GiB), had a burst whose interval
// allocated 18 GiB at burst_step, and holds fds from two sites.
func flameReport(t *testing.T, out Outputs) {
	t.Helper()
	w := New("v-test", out)
	main := model.Frame{Kind: model.FrameNative, Function: "main", Module: "trainer", File: "/src/trainer.c", Line: 90}
	at := func(fn string, line int) []model.Frame {
		return []model.Frame{{Kind: model.FrameNative, Function: fn, Module: "trainer", File: "/src/trainer.c", Line: line}, main}
	}
	p := &model.Process{PID: 100, Comm: "trainer", Started: t0,
		CUDA: model.CUDAStats{LiveBytes: 4 << 30, AllocBytes: map[string]uint64{"cudaMalloc": 40 << 30}, Sites: []model.CUDASite{
			{StackID: 1, Stack: at("load_weights", 12), Bytes: 3 << 30, AllocBytes: 3 << 30, AllocCalls: 12},
			{StackID: 2, Stack: at("cache_kv", 20), Bytes: 1 << 30, AllocBytes: 1 << 30, AllocCalls: 4},
			{StackID: 3, Stack: at("burst_step", 31), AllocBytes: 36 << 30, AllocCalls: 600, FreeBytes: 36 << 30, FreeCalls: 600},
		}},
		FD: model.FDStats{Open: 30, Sites: []model.FDSite{
			{StackID: 4, Stack: append([]model.Frame{{Kind: model.FrameNative, Function: "__open64", Module: "libc.so.6"}}, at("cache_shard", 40)...), Opened: make([]time.Time, 25), OpenedTotal: 25},
			{StackID: 5, Stack: at("accept_conn", 50), Opened: make([]time.Time, 5), OpenedTotal: 900, ClosedTotal: 895},
		}},
	}
	burst := model.Finding{Kind: model.KindGPUAllocBurst, PID: 100, Comm: "trainer", Severity: model.SeverityWarning, FirstSeen: t0.Add(3 * time.Second), LastSeen: t0.Add(4 * time.Second),
		Summary: "GPU allocation burst: 18.8 GiB", Stack: at("burst_step", 31),
		Evidence: model.GPUAllocBurstEvidence{LargestBurstBytes: 18 << 30, TopSites: []model.BurstSite{{Stack: at("burst_step", 31), Bytes: 18 << 30}}}}
	w.Update(&model.Snapshot{Time: t0.Add(5 * time.Second), Start: t0, Processes: []*model.Process{p}, Findings: []model.Finding{burst}})
	if err := w.Close(nil); err != nil {
		t.Fatal(err)
	}
}

// The page draws, per process, the GPU memory held at the end, what the
// largest burst's interval allocated and the open fds, each as an icicle
// graph in the browser; the same page comes from the JSON report.
func TestFlameGraphs(t *testing.T) {
	browser := testutil.Chromium(t)
	dir := t.TempDir()
	page, js := filepath.Join(dir, "r.html"), filepath.Join(dir, "r.json")
	flameReport(t, Outputs{HTML: page, JSON: js})
	r, err := Read(js)
	if err != nil {
		t.Fatal(err)
	}
	again := filepath.Join(dir, "again.html")
	if err := WriteHTMLFile(again, r); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(page)
	b, _ := os.ReadFile(again)
	if string(a) != string(b) {
		t.Error("the page from the JSON report differs from the run's")
	}
	dom := string(testutil.Headless(t, browser, page, "--dump-dom"))
	flames := regexp.MustCompile(`data-flame="([a-z_]+)"`).FindAllStringSubmatch(dom, -1)
	var ids []string
	for _, m := range flames {
		ids = append(ids, m[1])
	}
	if strings.Join(ids, " ") != "gpu_held gpu_burst fd_open" {
		t.Fatalf("flame graphs %v, want gpu_held gpu_burst fd_open", ids)
	}
	for _, s := range []string{
		"<title>load_weights (trainer.c:12): 3.0 GiB (75.0 %)</title>",
		"<title>cache_kv (trainer.c:20): 1.0 GiB (25.0 %)</title>",
		"<title>burst_step (trainer.c:31): 18.0 GiB (100.0 %)</title>",
		"<title>cache_shard (trainer.c:40): 25 fds (83.3 %)</title>",
		">load_weights (trainer.c:12)</text>",
	} {
		if !strings.Contains(dom, s) {
			t.Errorf("DOM lacks %q", s)
		}
	}
	// Held memory: burst_step holds nothing and is not drawn there.
	held := dom[strings.Index(dom, `data-flame="gpu_held"`):strings.Index(dom, `data-flame="gpu_burst"`)]
	if strings.Contains(held, "burst_step") {
		t.Error("the held-memory graph shows burst_step, which holds nothing")
	}
	img := testutil.Screenshot(t, browser, page, 1400, 2600)
	orange := 0
	bounds := img.Bounds()
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			if near(color.RGBAModel.Convert(img.At(x, y)).(color.RGBA), "#fdba74") {
				orange++
			}
		}
	}
	// Three graphs of a few full-width rows of 17 px.
	if orange < 20000 {
		t.Errorf("%d pixels of the boxes' colour, want the graphs drawn", orange)
	}
}
