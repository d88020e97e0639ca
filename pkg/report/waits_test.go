package report

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// The host's waits on the GPU: totals, quantiles and threads under cuda,
// each site under sites.wait (most waited first), and the HTML table of
// them with each site's stack.
func TestWaits(t *testing.T) {
	h := model.Histogram{Bounds: []float64{math.Ldexp(1, -20), math.Ldexp(1, -10), math.Ldexp(1, -2)}, Counts: []uint64{0, 99, 1}, Count: 100, Sum: 0.6}
	p := proc(100, "trainer", 10, false)
	p.CUDA.Libraries = []string{"/usr/lib/libcudart.so.12"}
	p.CUDA.Waits = model.CUDAWaits{Calls: 100, Seconds: 0.6, Histogram: h, Share: 0.75,
		Threads: []model.ThreadWait{{TID: 101, Name: "pt_main", Calls: 100, Seconds: 0.6, Share: 0.75}},
		Sites: []model.CUDAWaitSite{
			{API: "cudaMemcpy", Stack: []model.Frame{{Kind: model.FramePython, Function: "log_loss", File: "/srv/train.py", Line: 42}}, Calls: 1, Seconds: 0.25, MaxSeconds: 0.25, Histogram: model.Histogram{Bounds: h.Bounds, Counts: []uint64{0, 0, 1}, Count: 1, Sum: 0.25}},
			{API: "cudaStreamSynchronize", Stack: []model.Frame{{Kind: model.FramePython, Function: "step", File: "/srv/train.py", Line: 17}}, Calls: 99, Seconds: 0.35, MaxSeconds: 0.001, Histogram: model.Histogram{Bounds: h.Bounds, Counts: []uint64{0, 99, 0}, Count: 99, Sum: 0.35}},
		}}
	p.CUDA.Launches = &model.CUDALaunches{Calls: map[string]uint64{"cudaLaunchKernel": 5000}}
	w, buf := toStdout()
	if err := w.Close(&model.Snapshot{Time: t0.Add(10 * time.Second), Start: t0, Targets: []int{100}, Processes: []*model.Process{p}}); err != nil {
		t.Fatal(err)
	}
	r := decode(t, buf.Bytes())
	c := r.Processes[0].CUDA
	if c == nil || c.Waits == nil || c.Waits.Calls != 100 || c.Waits.Share != 0.75 || *c.Waits.P50Seconds != math.Ldexp(1, -10) || *c.Waits.P99Seconds != math.Ldexp(1, -10) ||
		len(c.Waits.Threads) != 1 || c.Waits.Threads[0].Name != "pt_main" || c.Launches["cudaLaunchKernel"] != 5000 {
		t.Fatalf("cuda = %+v", c)
	}
	s := r.Processes[0].Sites
	if s == nil || len(s.Wait) != 2 || s.Wait[0].API != "cudaStreamSynchronize" || s.Wait[0].Calls != 99 || s.Wait[1].Stack[0].Line != 42 || *s.Wait[1].P99Seconds != 0.25 {
		t.Fatalf("wait sites = %+v", s)
	}
	for _, key := range []string{`"waits"`, `"share"`, `"p99_seconds"`, `"wait"`, `"max_seconds"`, `"launches"`} {
		if !bytes.Contains(buf.Bytes(), []byte(key)) {
			t.Errorf("report lacks %s", key)
		}
	}
	var html bytes.Buffer
	if err := WriteHTML(&html, &r); err != nil {
		t.Fatal(err)
	}
	page := html.String()
	for _, want := range []string{"Host waits on the GPU, by call site", "<td>cudaStreamSynchronize</td><td>99</td>", "step (/srv/train.py:17)", "log_loss (/srv/train.py:42)"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	// Most waited first.
	if strings.Index(page, "train.py:17") > strings.Index(page, "train.py:42") {
		t.Error("the wait sites are not most waited first")
	}
}
