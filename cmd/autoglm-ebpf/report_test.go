package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/report"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// logLine is a line of the log view about one process: its time (to the
// second, local) and open fds.
var logLine = regexp.MustCompile(`(?m)^(\d\d:\d\d:\d\d) pid=(\d+) \(([^)]*)\) open=(\d+) findings=\d+`)

// The demo worker, run to its end: the history in the JSON report has the
// open fds the log view printed at the same times, and the GPU burst
// between two polls at its peak; the HTML page marks the fd leak, the
// burst and the failed allocation on their charts, and `report` renders
// the same page from the JSON file.
func TestDemoReport(t *testing.T) {
	testutil.RequireRoot(t)
	browser := testutil.Chromium(t)
	demo := testutil.Fixture(t, "demo")
	cudart := testutil.CUDAStubs(t)
	dir := t.TempDir()
	js, page := filepath.Join(dir, "report.json"), filepath.Join(dir, "report.html")
	// 17 s of requests: the burst comes at request 240, the failure at
	// 300, and the run ends when the worker does.
	cmd := exec.Command(binary, "run", "--json", js, "--html", page, "--", demo, "17", cudart)
	cmd.Env = append(os.Environ(), "CUDA_STUB_LIMIT=1073741824")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("run: %v\n%s\n%s", err, stdout.Bytes(), stderr.Bytes())
	}
	r := readReport(t, js)
	if r.SchemaVersion != report.SchemaVersion || len(r.Processes) != 1 || r.Processes[0].History == nil {
		t.Fatalf("report: schema %d, processes %+v", r.SchemaVersion, r.Processes)
	}
	p := r.Processes[0]
	h := p.History

	// Every line of the log view is a point of the history: same second,
	// same open fds, in order; and every change of open fds in the history
	// was printed.
	lines := logLine.FindAllStringSubmatch(stdout.String(), -1)
	if len(lines) < 10 {
		t.Fatalf("%d log lines about the worker:\n%s", len(lines), stdout.Bytes())
	}
	label := func(i int) string { return time.UnixMilli(h.Time[i]).Format(time.TimeOnly) }
	open := h.Series[model.SeriesOpenFDs].Last
	printed := map[string]bool{}
	j := 0
	for _, l := range lines {
		if l[2] != strconv.Itoa(p.PID) {
			t.Fatalf("log line about another process: %q", l[0])
		}
		want, _ := strconv.ParseFloat(l[4], 64)
		printed[l[1]+" "+l[4]] = true
		for j < len(h.Time) && (label(j) != l[1] || open[j] != want) {
			j++
		}
		if j == len(h.Time) {
			t.Fatalf("log line %q has no point in the history (time %s, open fds %v)", l[0], l[1], want)
		}
		j++
	}
	for i := 1; i < len(h.Time); i++ {
		if open[i] != open[i-1] && !printed[label(i)+" "+strconv.FormatFloat(open[i], 'f', -1, 64)] {
			t.Errorf("history point %s open=%v changed but no log line says so", label(i), open[i])
		}
	}

	// The burst (48 x 64 MiB, held a second) at its peak, whether or not
	// a poll fell while it was held.
	gpu := h.Series[model.SeriesGPULiveBytes]
	if gpu == nil {
		t.Fatalf("no GPU series: %v", h.Series)
	}
	var peak float64
	for _, v := range gpu.Max {
		peak = max(peak, v)
	}
	if peak < 3<<30 {
		t.Errorf("GPU live bytes peaked at %v, want the 3 GiB burst", peak)
	}

	dom := string(testutil.Headless(t, browser, page, "--dump-dom"))
	if !strings.Contains(dom, `data-script="ok"`) {
		t.Error("the page's script did not run")
	}
	for kind, chart := range map[string]string{"fd_leak": "open_fds", "gpu_alloc_burst": "gpu_memory", "gpu_alloc_failure": "gpu_memory"} {
		re := regexp.MustCompile(`data-chart="` + chart + `"[^>]*>(?s:.*?)</svg>`)
		svg := re.FindString(dom)
		if !strings.Contains(svg, `class="finding-marker" data-kind="`+kind+`"`) {
			t.Errorf("no %s marker on the %s chart", kind, chart)
		}
	}
	for _, frame := range []string{"cache_tokenizer", "warmup_kv_cache", "load_adapter"} {
		if !strings.Contains(dom, "<li>"+frame+" (demo.c:") {
			t.Errorf("no finding card with %s in its stack", frame)
		}
	}

	again := filepath.Join(dir, "again.html")
	if out, code := cli(t, nil, "report", js, "--html", again); code != 0 {
		t.Fatalf("report: exit %d\n%s", code, out)
	}
	a, err1 := os.ReadFile(page)
	b, err2 := os.ReadFile(again)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Error("`report --html` renders a different page from the JSON than the run wrote")
	}
}

// `report` needs one file and --html; a file that is not a report fails
// with a clear message.
func TestReportCommand(t *testing.T) {
	dir := t.TempDir()
	notJSON := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(notJSON, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(dir, "old.json")
	if err := os.WriteFile(old, []byte(`{"version": "v0.3.0", "start": "2025-01-02T03:04:05Z", "end": "2025-01-02T03:05:05Z",
		"targets": [7], "processes": [{"pid": 7, "comm": "w", "open_fds": 3, "fd_limit": 1024}], "findings": []}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.html")
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"report"}, exitUsage, "accepts 1 arg"},
		{[]string{"report", old}, exitUsage, "--html FILE or --pprof DIR is required"},
		// A report from before call sites were recorded has none to profile.
		{[]string{"report", old, "--pprof", filepath.Join(dir, "prof")}, exitRuntime, "the report has no call sites to profile"},
		{[]string{"report", old, "--html", "-"}, exitUsage, "--html needs a file name"},
		{[]string{"attach", "--pid", "1", "--html", "-"}, exitUsage, "--html needs a file name"},
		{[]string{"report", filepath.Join(dir, "missing.json"), "--html", out}, exitRuntime, "no such file"},
		{[]string{"report", notJSON, "--html", out}, exitRuntime, "not a valid JSON report"},
		{[]string{"report", old, "--html", filepath.Join(dir, "missing", "out.html")}, exitRuntime, "writing"},
		{[]string{"report", old, "--html", out}, exitOK, ""},
	} {
		got, code := cli(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(got, tc.msg) {
			t.Errorf("%v: exit %d, want %d; output %q should contain %q", tc.args, code, tc.code, got, tc.msg)
		}
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "pid 7 (w)") {
		t.Errorf("page of a report without history lacks its process:\n%.500s", page)
	}
}
