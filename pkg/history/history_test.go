package history

import (
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/pipeline"
)

// The recorder is fed the way every sink is.
var _ pipeline.Sink = (*Recorder)(nil)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

const gib = 1 << 30

var nan = math.NaN()

// same compares columns, NaN equal to NaN.
func same(a, b Values) bool {
	return slices.EqualFunc(a, b, func(x, y float64) bool { return x == y || math.IsNaN(x) && math.IsNaN(y) })
}

func at(d time.Duration, procs ...*model.Process) *model.Snapshot {
	return &model.Snapshot{Time: t0.Add(d), Start: t0, Processes: procs}
}

// state is what a test process shows at one poll.
type state struct {
	open                   int
	opened, closed         uint64
	vol, invol             uint64
	runq                   []uint64 // cumulative counts per bucket
	tcp                    map[string]int
	cuda                   bool
	live, peak             uint64
	nvml, nvmlMin, nvmlMax uint64
	hasNVML, exited        bool
}

var bounds = []float64{1e-6, 1e-3, 1}

func (s state) process(pid int, started time.Time) *model.Process {
	p := &model.Process{PID: pid, Comm: "w", Started: started, Exited: s.exited}
	p.FD = model.FDStats{Open: s.open, Opened: map[string]uint64{"file": s.opened}, Closed: map[string]uint64{"file": s.closed}}
	p.Sched = model.SchedStats{Voluntary: s.vol, Involuntary: s.invol}
	if s.runq != nil {
		h := model.Histogram{Bounds: bounds, Counts: s.runq}
		for _, c := range s.runq {
			h.Count += c
		}
		p.Sched.RunqLatency = h
	}
	p.Sock.TCPByState = s.tcp
	if s.cuda {
		p.CUDA = model.CUDAStats{LiveBytes: s.live, LivePeakBytes: s.peak, Libraries: []string{"libcudart.so"}}
	}
	if s.hasNVML {
		p.CUDA.HasNVML, p.CUDA.NVMLUsedBytes, p.CUDA.NVMLMinBytes, p.CUDA.NVMLMaxBytes = true, s.nvml, s.nvmlMin, s.nvmlMax
	}
	return p
}

// Each series from cumulative counters and gauges: rates per second
// between points, the interval's p99, TCP states with zeros where none,
// the kernel's peak as the GPU's max, NVML's window; nothing after exit.
func TestSeries(t *testing.T) {
	r := New(DefaultConfig())
	polls := []struct {
		at time.Duration
		s  state
	}{
		{10 * time.Millisecond, state{open: 10, opened: 5, vol: 100, runq: []uint64{1, 0, 0}}},
		{time.Second, state{open: 20, opened: 25, closed: 5, vol: 300, invol: 10, runq: []uint64{1, 99, 0},
			tcp: map[string]int{"ESTABLISHED": 2}, cuda: true, live: 1 * gib, peak: 3 * gib,
			hasNVML: true, nvml: 2 * gib, nvmlMin: 1 * gib, nvmlMax: 4 * gib}},
		{2 * time.Second, state{open: 30, opened: 45, closed: 5, vol: 500, invol: 10, runq: []uint64{1, 99, 0},
			tcp: map[string]int{"ESTABLISHED": 1, "CLOSE_WAIT": 3}, cuda: true, live: 0, peak: 1 * gib}},
		{3 * time.Second, state{open: 35, opened: 50, closed: 10, vol: 500, invol: 30, runq: []uint64{1, 99, 0}, exited: true}},
		{4 * time.Second, state{open: 99, opened: 99, exited: true}}, // its exit was already reported
	}
	for _, p := range polls {
		r.Update(at(p.at, p.s.process(100, t0)))
	}
	if err := r.Close(at(5*time.Second, polls[4].s.process(100, t0))); err != nil {
		t.Fatal(err)
	}
	h := r.Process(100, t0)
	if h == nil {
		t.Fatal("no history for pid 100")
	}
	ms := func(d time.Duration) int64 { return t0.Add(d).UnixMilli() }
	if want := []int64{ms(10 * time.Millisecond), ms(time.Second), ms(2 * time.Second), ms(3 * time.Second)}; !reflect.DeepEqual(h.Time, want) {
		t.Errorf("time = %v, want %v", h.Time, want)
	}
	if want := []int64{10, 990, 1000, 1000}; !reflect.DeepEqual(h.Span, want) {
		t.Errorf("span = %v, want %v", h.Span, want)
	}
	for _, c := range []struct {
		name string
		col  func(*Series) Values
		want Values
	}{
		{model.SeriesOpenFDs, last, Values{10, 20, 30, 35}},
		// The first poll's events count in the second point, over the
		// second since watching began.
		{model.SeriesFDsOpened, mean, Values{nan, 25, 20, 5}},
		{model.SeriesFDsClosed, mean, Values{nan, 5, 0, 5}},
		{model.SeriesVoluntarySwitches, mean, Values{nan, 300, 200, 0}},
		{model.SeriesInvoluntarySwitches, mean, Values{nan, 10, 0, 20}},
		{model.SeriesRunqueueP99, last, Values{1e-6, 1e-3, nan, nan}},
		{model.SeriesTCPPrefix + "ESTABLISHED", last, Values{0, 2, 1, 0}},
		{model.SeriesTCPPrefix + "CLOSE_WAIT", last, Values{0, 0, 3, 0}},
		{model.SeriesGPULiveBytes, last, Values{nan, 1 * gib, 0, nan}},
		{model.SeriesGPULiveBytes, greatest, Values{nan, 3 * gib, 1 * gib, nan}},
		{model.SeriesGPULiveBytes, least, Values{nan, 1 * gib, 0, nan}},
		{model.SeriesNVMLUsedBytes, last, Values{nan, 2 * gib, nan, nan}},
		{model.SeriesNVMLUsedBytes, least, Values{nan, 1 * gib, nan, nan}},
		{model.SeriesNVMLUsedBytes, greatest, Values{nan, 4 * gib, nan, nan}},
	} {
		s := h.Series[c.name]
		if s == nil {
			t.Errorf("no series %s", c.name)
			continue
		}
		if got := c.col(s); !same(got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	if u := h.Series[model.SeriesFDsOpened]; u.Unit != model.UnitFDRate || u.Last != nil {
		t.Errorf("%s: unit %q, last %v; want fds/s, a rate without last", model.SeriesFDsOpened, u.Unit, u.Last)
	}
	if len(h.Series) != 10 {
		t.Errorf("%d series, want 10", len(h.Series))
	}
	if r.Process(100, t0.Add(time.Second)) != nil {
		t.Error("a history for a process never seen")
	}
}

func last(s *Series) Values     { return s.Last }
func mean(s *Series) Values     { return s.Mean }
func least(s *Series) Values    { return s.Min }
func greatest(s *Series) Values { return s.Max }

// A pid reused by another process gets a history of its own.
func TestReusedPID(t *testing.T) {
	r := New(DefaultConfig())
	r.Update(at(time.Second, state{open: 3, exited: true}.process(100, t0)))
	later := t0.Add(2 * time.Second)
	r.Update(at(3*time.Second, state{open: 7}.process(100, later)))
	if a, b := r.Process(100, t0), r.Process(100, later); len(a.Time) != 1 || len(b.Time) != 1 ||
		a.Series[model.SeriesOpenFDs].Last[0] != 3 || b.Series[model.SeriesOpenFDs].Last[0] != 7 {
		t.Errorf("histories %+v and %+v", a, b)
	}
}

// Beyond the recent window points are merged: the count stays bounded,
// every figure's least and greatest value survives, a merged rate is the
// events of its intervals over their time, and the recent points are as
// measured.
func TestDownsample(t *testing.T) {
	cfg := Config{Recent: 4, Coarse: 4}
	r := New(cfg)
	const n = 40
	var opened uint64
	events := map[int64]uint64{} // by the end of each interval, ms
	open := func(i int) int {
		switch i {
		case 5:
			return 1000 // a spike long gone by the end
		case 7:
			return 0
		}
		return 100 + i
	}
	for i := 1; i <= n; i++ {
		e := uint64(10)
		if i == 9 {
			e = 100
		}
		opened += e
		end := time.Duration(i) * time.Second
		events[t0.Add(end).UnixMilli()] = e
		r.Update(at(end, state{open: open(i), opened: opened}.process(100, t0)))
		if h := r.Process(100, t0); len(h.Time) > cfg.Recent+cfg.Coarse {
			t.Fatalf("after %d intervals: %d points, cap %d", i, len(h.Time), cfg.Recent+cfg.Coarse)
		}
	}
	h := r.Process(100, t0)
	fds, rate := h.Series[model.SeriesOpenFDs], h.Series[model.SeriesFDsOpened]
	if got := slices.Max(fds.Max); got != 1000 {
		t.Errorf("greatest open fds kept %v, want 1000", got)
	}
	if got := slices.Min(fds.Min); got != 0 {
		t.Errorf("least open fds kept %v, want 0", got)
	}
	if got := slices.Max(rate.Max); got != 100 {
		t.Errorf("greatest rate kept %v, want 100", got)
	}
	var span int64
	for _, s := range h.Span {
		span += s
	}
	if span != n*1000 {
		t.Errorf("points cover %d ms, want %d", span, n*1000)
	}
	// The recent points are the last intervals as measured.
	k := len(h.Time) - cfg.Recent
	for j := range cfg.Recent {
		i := n - cfg.Recent + 1 + j
		if h.Time[k+j] != t0.Add(time.Duration(i)*time.Second).UnixMilli() || fds.Last[k+j] != float64(open(i)) || h.Span[k+j] != 1000 {
			t.Errorf("recent point %d: time %d, open %v, span %d; want interval %d", j, h.Time[k+j], fds.Last[k+j], h.Span[k+j], i)
		}
	}
	// Each merged rate is its intervals' events over their seconds. The
	// first point has no rate: its events count in the second.
	prev := t0.UnixMilli()
	for j := range k {
		var sum uint64
		var secs float64
		for end, e := range events {
			if end > prev && end <= h.Time[j] && end != t0.Add(time.Second).UnixMilli() {
				sum += e
				secs++
			}
		}
		if h.Time[j] >= t0.Add(2*time.Second).UnixMilli() && prev < t0.Add(2*time.Second).UnixMilli() {
			sum += events[t0.Add(time.Second).UnixMilli()]
			secs++
		}
		if secs > 0 && math.Abs(rate.Mean[j]-float64(sum)/secs) > 1e-9 {
			t.Errorf("merged point %d (%d ms): mean rate %v, want %v", j, h.Span[j], rate.Mean[j], float64(sum)/secs)
		}
		prev = h.Time[j]
	}
}

// A day at one-second intervals ends within the cap, the recent ten
// minutes at full resolution, and an hour-old spike still shows.
func TestDay(t *testing.T) {
	r := New(DefaultConfig())
	const day = 24 * 3600
	for i := 1; i <= day; i++ {
		open := 50
		if i == 3*3600 {
			open = 5000
		}
		s := at(time.Duration(i)*time.Second, state{open: open, opened: uint64(i)}.process(100, t0))
		s.GPUs = []model.GPU{{Index: 0, UUID: "GPU-1", MemoryUsed: gib, MemoryUsedMin: gib / 2, MemoryUsedMax: 2 * gib}}
		r.Update(s)
	}
	for name, h := range map[string]*History{"process": r.Process(100, t0), "GPU": r.GPU("GPU-1", 0)} {
		cfg := DefaultConfig()
		if n := len(h.Time); n > cfg.Recent+cfg.Coarse || n < cfg.Recent {
			t.Errorf("%s: %d points, want between %d and %d", name, n, cfg.Recent, cfg.Recent+cfg.Coarse)
		}
		// 85 800 older seconds in points of 128 s: 671 of them.
		if n := len(h.Time) - cfg.Recent; n != 671 {
			t.Errorf("%s: %d coarse points, want 671", name, n)
		}
		if h.Span[0] != 128000 || h.Span[len(h.Span)-1] != 1000 {
			t.Errorf("%s: first point spans %d ms, last %d; want 128000 and 1000", name, h.Span[0], h.Span[len(h.Span)-1])
		}
	}
	if got := slices.Max(r.Process(100, t0).Series[model.SeriesOpenFDs].Max); got != 5000 {
		t.Errorf("spike at 3 h: greatest open fds kept %v, want 5000", got)
	}
	if s := r.GPU("GPU-1", 0).Series[MemoryUsedBytes]; slices.Max(s.Max) != 2*gib || slices.Min(s.Min) != gib/2 {
		t.Errorf("GPU memory range %v–%v, want 0.5–2 GiB", slices.Min(s.Min), slices.Max(s.Max))
	}
}

// Values write null for NaN, integers exactly, others with six
// significant digits, and read back.
func TestValuesJSON(t *testing.T) {
	v := Values{nan, 3 * gib, 0.1234567, -2, 4.096e-6}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if want := `[null,3221225472,0.123457,-2,4.096e-06]`; string(b) != want {
		t.Errorf("marshal = %s, want %s", b, want)
	}
	var back Values
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if want := (Values{nan, 3 * gib, 0.123457, -2, 4.096e-6}); !same(back, want) {
		t.Errorf("unmarshal = %v, want %v", back, want)
	}
}
