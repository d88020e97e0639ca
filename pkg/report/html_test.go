package report

import (
	"bytes"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/history"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// hostile is a comm a traced process could pick: the page must show it as
// text.
const hostile = `<img src=x onerror=alert(1)>`

// run feeds a Writer n snapshots at step apart, as the pipeline would for
// two processes and one GPU: pid 100 leaks fds from 40 % of the run,
// bursts GPU memory between two polls at 50 % and piles up CLOSE_WAIT
// sockets from 60 %; pid 200 (a hostile comm) has a context-switch storm
// at 20–30 %. The findings say so, with stacks.
func run(t testing.TB, n int, step time.Duration, out Outputs) {
	t.Helper()
	w := New("v-test", out)
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * step) }
	frac := func(i int) float64 { return float64(i) / float64(n) }
	findings := []model.Finding{
		{Kind: model.KindCtxSwitchStorm, PID: 200, Comm: hostile, Severity: model.SeverityWarning, FirstSeen: at(n / 5), LastSeen: at(3 * n / 10),
			Summary: "context switches 60000/s", Stack: []model.Frame{{Kind: model.FramePython, Function: "<script>alert(2)</script>", File: "w.py", Line: 1}, {Kind: model.FrameNative, Function: "spin", Module: "w", Offset: 0x10}}, Evidence: model.CtxSwitchStormEvidence{RatePerSecond: 60000}},
		{Kind: model.KindFDLeak, PID: 100, Comm: "trainer", Severity: model.SeverityCritical, FirstSeen: at(n / 2), LastSeen: at(n), Active: true,
			Summary: "fd leak at leak_fn", Stack: testutil.Frames("__open64+0x51 (libc.so.6)", "leak_fn+0x1a (trainer)", "main+0x11a (trainer)"),
			Evidence: model.FDLeakEvidence{OpenFDs: 1000, TopSites: []model.FDLeakSite{{Stack: slices.Repeat(testutil.Frames("leak_fn+0x1a (trainer)"), 20)}}}},
		{Kind: model.KindGPUAllocBurst, PID: 100, Comm: "trainer", Severity: model.SeverityWarning, FirstSeen: at(n / 2), LastSeen: at(n / 2),
			Summary: "3 GiB in one interval", Stack: testutil.Frames("warmup+0x35 (trainer)")},
		{Kind: model.KindSocketLeak, PID: 100, Comm: "trainer", Severity: model.SeverityWarning, FirstSeen: at(7 * n / 10), LastSeen: at(8 * n / 10),
			Summary: "CLOSE_WAIT sockets pile up", Stack: testutil.Frames("accept4+0x20 (libc.so.6)", "serve+0x44 (trainer)")},
	}
	var vol, opened uint64
	for i := 1; i <= n; i++ {
		f := frac(i)
		open := 20
		if f > 0.4 {
			open += int((f - 0.4) * 2000)
		}
		opened += uint64(20 + open/100)
		closeWait := 0
		if f > 0.6 {
			closeWait = int((f - 0.6) * 100)
		}
		trainer := &model.Process{PID: 100, Comm: "trainer", Started: t0,
			FD:    model.FDStats{Open: open, Limit: 4096, Opened: map[string]uint64{"file": opened}, Closed: map[string]uint64{"file": opened - uint64(open)}},
			Sched: model.SchedStats{Voluntary: uint64(i) * 900, Involuntary: uint64(i) * 40},
			Sock:  model.SockStats{TCPByState: map[string]int{"ESTABLISHED": 4, "CLOSE_WAIT": closeWait}},
			CUDA: model.CUDAStats{LiveBytes: 2 << 30, LivePeakBytes: 2 << 30, HasNVML: true,
				NVMLUsedBytes: 2<<30 + 300<<20, NVMLMinBytes: 2<<30 + 250<<20, NVMLMaxBytes: 2<<30 + 350<<20, Libraries: []string{"libcudart.so.12"},
				GPUUtil: []model.GPUUtil{{Device: 0, SM: 0.9 - 0.6*f, Memory: 0.3, Source: model.UtilProcess}}},
		}
		if i == n/2 {
			trainer.CUDA.LivePeakBytes = 5 << 30 // came and went between two polls
		}
		rate := uint64(2000)
		if f > 0.2 && f <= 0.3 {
			rate = 60000
		}
		vol += rate * uint64(step/time.Second)
		other := &model.Process{PID: 200, Comm: hostile, Started: t0,
			FD:    model.FDStats{Open: 8, Limit: 1024},
			Sched: model.SchedStats{Voluntary: vol, RunqLatency: model.Histogram{Bounds: []float64{1e-5, 1e-3}, Counts: []uint64{uint64(i), uint64(i / 100)}, Count: uint64(i + i/100)}},
		}
		var active []model.Finding
		for _, fd := range findings {
			if !fd.FirstSeen.After(at(i)) {
				fd := fd
				fd.Active = fd.Active || !fd.LastSeen.Before(at(i))
				active = append(active, fd)
			}
		}
		w.Update(&model.Snapshot{Time: at(i), Start: t0, Targets: []int{100, 200}, Processes: []*model.Process{trainer, other}, Findings: active,
			GPUs: []model.GPU{{Index: 0, UUID: "GPU-aaaa", Name: "H100", MemoryUsed: 30 << 30, MemoryUsedMin: 29 << 30, MemoryUsedMax: 33 << 30, MemoryTotal: 80 << 30}}})
	}
	if err := w.Close(nil); err != nil {
		t.Fatal(err)
	}
}

// The page opens in a real browser: the screenshot is not blank and shows
// the series' colours, the DOM has every chart of every process, each
// finding marked on its chart with its card and stack, the script ran on
// the embedded report, and what the traced process controls stays text.
func TestHTMLInBrowser(t *testing.T) {
	browser := testutil.Chromium(t)
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	run(t, 120, time.Second, Outputs{HTML: page})
	html, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	offline(t, html)

	img := testutil.Screenshot(t, browser, page, 1400, 2000)
	white, colours := 0, map[color.RGBA]bool{}
	var blues, purples int // open fds and others; voluntary switches
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			colours[c] = true
			if c.R > 245 && c.G > 245 && c.B > 245 {
				white++
			}
			if near(c, blue) {
				blues++
			}
			if near(c, purple) {
				purples++
			}
		}
	}
	total := b.Dx() * b.Dy()
	inked := 1 - float64(white)/float64(total)
	t.Logf("screenshot: %.1f %% not white, %d colours, %d blue and %d purple pixels", 100*inked, len(colours), blues, purples)
	if inked < 0.03 || len(colours) < 50 {
		t.Errorf("screenshot looks blank: %.1f %% not white, %d colours", 100*inked, len(colours))
	}
	// A line across a chart is some 800 pixels; a legend swatch 64.
	if blues < 2000 || purples < 1000 {
		t.Errorf("screenshot lacks the series lines: %d blue pixels (want 2000), %d purple (want 1000)", blues, purples)
	}

	dom := string(testutil.Headless(t, browser, page, "--dump-dom"))
	if !strings.Contains(dom, `data-script="ok"`) {
		t.Error("the page's script did not run to its end (embedded report unreadable?)")
	}
	charts := chartsIn(dom)
	want := map[string][]string{
		"100": {model.ChartOpenFDs, model.ChartGPUMemory, model.ChartGPUUtil, model.ChartFDRates, model.ChartContextSwitches, model.ChartRunqueue, model.ChartTCP},
		"200": {model.ChartOpenFDs, model.ChartFDRates, model.ChartContextSwitches, model.ChartRunqueue, model.ChartTCP},
		"0":   {ChartDeviceMemory},
	}
	for pid, ids := range want {
		if got := charts[pid]; !slices.Equal(got, ids) {
			t.Errorf("pid %s charts %v, want %v (one per figure)", pid, got, ids)
		}
	}
	if n := strings.Count(dom, `<path class="line"`); n < 12 {
		t.Errorf("%d series lines drawn, want at least 12", n)
	}
	markers := regexp.MustCompile(`<a href="#finding-(\d)" class="finding-marker" data-kind="([a-z_]+)"`).FindAllStringSubmatch(dom, -1)
	var got []string
	for _, m := range markers {
		got = append(got, m[1]+" "+m[2])
	}
	if want := []string{"2 fd_leak", "3 gpu_alloc_burst", "4 socket_leak", "1 ctx_switch_storm"}; !slices.Equal(got, want) {
		t.Errorf("finding markers %v, want %v", got, want)
	}
	for _, s := range []string{`id="finding-2" data-kind="fd_leak"`, "<li>leak_fn+0x1a (trainer)</li>", "<li>serve+0x44 (trainer)</li>",
		"&lt;script&gt;alert(2)&lt;/script&gt;", "&lt;img src=x onerror=alert(1)&gt;", "fd limit 4096", "total 80.0 GiB"} {
		if !strings.Contains(dom, s) {
			t.Errorf("DOM lacks %q", s)
		}
	}
	if strings.Contains(dom, "<img") || strings.Count(dom, "<script") != 2 {
		t.Error("the traced process's strings became markup")
	}
}

// A page for 24 hours of history at 1 s stays under sizeBound24h, and opens
// with all its charts.
func TestHTMLDaySize(t *testing.T) {
	dir := t.TempDir()
	page, js := filepath.Join(dir, "day.html"), filepath.Join(dir, "day.json")
	run(t, 24*3600, time.Second, Outputs{JSON: js, HTML: page})
	fi, err := os.Stat(page)
	if err != nil {
		t.Fatal(err)
	}
	jfi, err := os.Stat(js)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("24 h at 1 s, 2 processes and a GPU: HTML %d bytes, JSON %d bytes", fi.Size(), jfi.Size())
	if fi.Size() > sizeBound24h {
		t.Errorf("HTML report of 24 h is %d bytes, bound %d", fi.Size(), sizeBound24h)
	}
	browser := testutil.Chromium(t)
	dom := string(testutil.Headless(t, browser, page, "--dump-dom"))
	if !strings.Contains(dom, `data-script="ok"`) || len(chartsIn(dom)["100"]) != len(charts) {
		t.Errorf("the 24 h page did not render: script %v, charts %v", strings.Contains(dom, `data-script="ok"`), chartsIn(dom))
	}
}

// sizeBound24h bounds the HTML page of a 24-hour run at 1 s with two
// processes (one with every series, GPU included) and a GPU: measured at
// 0.95 MB (docs/REPORT.md), GPU utilization included.
const sizeBound24h = 1 << 20

// The page rendered at the end of a run and the one rendered later from
// its JSON file are the same.
func TestHTMLFromFile(t *testing.T) {
	dir := t.TempDir()
	js, page := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.html")
	run(t, 60, time.Second, Outputs{JSON: js, HTML: page})
	r, err := Read(js)
	if err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if err := WriteHTML(&again, r); err != nil {
		t.Fatal(err)
	}
	live, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(live, again.Bytes()) {
		t.Error("the page rendered from the JSON file differs from the one written at the end of the run")
	}
}

func TestReadErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		path, msg string
	}{
		{filepath.Join(dir, "missing.json"), "no such file"},
		{write("text.json", "hello"), "not a valid JSON report"},
		{write("other.json", `{"name": "x"}`), "not an autoglm-ebpf report"},
		{write("newer.json", `{"schema_version": 99, "start": "2025-01-02T03:04:05Z", "processes": []}`), "newer"},
		// The charts read every column by point: one short made the
		// page's renderer panic.
		{write("columns.json", `{"start": "2025-01-02T03:04:05Z", "processes": [{"pid": 7, "history": {"time_unix_ms": [1, 2], "span_ms": [1, 1],
			"series": {"open_fds": {"unit": "", "min": [1], "max": [1, 2], "last": [1, 2]}}}}]}`), "history of process 7: series open_fds: 1 min values for 2 points"},
		{write("spans.json", `{"start": "2025-01-02T03:04:05Z", "processes": [], "gpus": [{"index": 1, "history": {"time_unix_ms": [1], "span_ms": []}}]}`),
			"history of GPU 1: 0 spans for 1 points"},
	} {
		if _, err := Read(c.path); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("Read(%s) = %v, want an error with %q", filepath.Base(c.path), err, c.msg)
		}
	}
	// A report from before history renders, saying so.
	old := write("v1.json", `{"version": "v0.3.0", "start": "2025-01-02T03:04:05Z", "end": "2025-01-02T03:05:05Z",
		"processes": [{"pid": 7, "comm": "w", "open_fds": 3, "fd_limit": 1024}], "findings": []}`)
	r, err := Read(old)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WriteHTML(&b, r); err != nil {
		t.Fatal(err)
	}
	if s := b.String(); !strings.Contains(s, "no history in this report") || strings.Count(s, `data-chart=`) != 5 { // those not Optional
		t.Errorf("schema 1 page: %d charts, no-history note %v", strings.Count(s, `data-chart=`), strings.Contains(s, "no history in this report"))
	}
}

// A report's times are its own: the axis of a run of centuries (or of
// the longest Duration, where stepping by days wrapped around and never
// ended) has ten ticks or so, of an hour a few, of a negative span none.
func TestTicksBounded(t *testing.T) {
	for _, c := range []struct {
		span     time.Duration
		min, max int
	}{
		{0, 1, 1}, {time.Hour, 5, 11}, {30 * 24 * time.Hour, 5, 11}, {100 * 365 * 24 * time.Hour, 5, 11},
		{math.MaxInt64, 5, 11}, {-time.Hour, 0, 0},
	} {
		ax := axis{start: t0, end: t0.Add(c.span)}
		if n := len(ax.ticks()); n < c.min || n > c.max {
			t.Errorf("a span of %v: %d ticks, want %d to %d", c.span, n, c.min, c.max)
		}
	}
}

// Axes: bytes in binary units, a reference line that would flatten the
// data shown as a note, marker labels that would collide on two rows.
func TestChartParts(t *testing.T) {
	for _, c := range []struct {
		top  float64
		unit string
	}{{3 << 30, "GiB"}, {300 << 20, "MiB"}, {512, "bytes"}} {
		if sc := newScale("bytes", c.top); sc.unit != c.unit || sc.max < c.top {
			t.Errorf("scale for %v bytes: %q up to %v", c.top, sc.unit, sc.max)
		}
	}
	ax := axis{t0, t0.Add(100 * time.Second)}
	times := []int64{t0.Add(50 * time.Second).UnixMilli(), t0.Add(100 * time.Second).UnixMilli()}
	fds := []plot{{name: "open_fds", vals: []float64{10, 20}, min: []float64{10, 20}, max: []float64{10, 20}}}
	if c := newChart("x", 1, "", "fds", "", ax, times, fds, []ref{{1024, "limit"}}); len(c.Lines) != 1 || !c.Lines[0].Off {
		t.Errorf("a limit 50 times the data: %+v, want a note above the scale", c.Lines)
	}
	if c := newChart("x", 1, "", "fds", "", ax, times, fds, []ref{{64, "limit"}}); len(c.Lines) != 1 || c.Lines[0].Off || c.YTicks[len(c.YTicks)-1].Label != "80" {
		t.Errorf("a limit near the data: %+v, ticks %+v; want it drawn, axis to 80", c.Lines, c.YTicks)
	}
	c := newChart("x", 1, "", "fds", "none", ax, times, nil, nil)
	if c.Note != "none" {
		t.Errorf("empty chart note %q", c.Note)
	}
	c.addMarker(marker{Label: "#1 gpu_alloc_burst"}, 300, 300)
	c.addMarker(marker{Label: "#2 gpu_alloc_failure"}, 320, 400)
	c.addMarker(marker{Label: "#3 fd_leak"}, 700, 800)
	if m := c.Markers; !m[0].Instant || m[0].LabelY == m[1].LabelY || m[2].LabelY != m[0].LabelY || math.Abs(m[1].W-80) > 1e-9 {
		t.Errorf("markers %+v", m)
	}
}

// offline checks that a page loads nothing from anywhere.
func offline(t *testing.T, html []byte) {
	t.Helper()
	if m := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?\s*(https?:|//)|<link|@import|url\(`).Find(html); m != nil {
		t.Errorf("the page refers to something outside it: %q", m)
	}
}

// chartsIn lists the chart ids in a DOM by pid, in page order.
func chartsIn(dom string) map[string][]string {
	out := map[string][]string{}
	for _, m := range regexp.MustCompile(`<svg class="chart" data-chart="([a-z_0-9]+)" data-pid="(\d+)"`).FindAllStringSubmatch(dom, -1) {
		out[m[2]] = append(out[m[2]], m[1])
	}
	return out
}

// near reports whether c is the colour hex (#rrggbb) or close to it.
func near(c color.RGBA, hex string) bool {
	v, _ := strconv.ParseUint(hex[1:], 16, 32)
	d := func(a uint8, b uint64) int { return int(a) - int(b) }
	r, g, b := d(c.R, v>>16), d(c.G, v>>8&0xff), d(c.B, v&0xff)
	return r*r+g*g+b*b < 20*20
}

// Every finding kind is marked on one chart.
func TestEveryKindHasAChart(t *testing.T) {
	marked := map[string]int{}
	for _, c := range charts {
		for _, k := range c.Marks {
			marked[k]++
		}
	}
	for _, k := range model.Kinds {
		if marked[k] != 1 {
			t.Errorf("finding kind %s is marked on %d charts, want 1", k, marked[k])
		}
	}
}

// The views' charts draw series their figures record, in colours the page
// has, and no two charts share an id.
func TestChartsDrawFigures(t *testing.T) {
	ids := map[string]bool{}
	for _, c := range charts {
		if ids[c.ID] {
			t.Errorf("chart id %s twice", c.ID)
		}
		ids[c.ID] = true
		for _, l := range c.Lines {
			if unit, _ := history.Unit(l.Series); unit != c.Unit {
				t.Errorf("chart %s: line %s is in %q, the chart in %q (no figure records it?)", c.ID, l.Series, unit, c.Unit)
			}
			if colors[l.Color] == "" || !slices.Contains(model.Colors, l.Color) {
				t.Errorf("chart %s: line %s has colour %q, not one of %v", c.ID, l.Series, l.Color, model.Colors)
			}
		}
	}
}
