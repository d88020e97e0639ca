package ctxstorm

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// Run-queue histogram bounds as the source reports them (seconds).
var bounds = []float64{1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1}

// sim is a process whose threads switch at a rate a scenario sets; it is
// sampled into the form the scheduler source produces.
type sim struct {
	pid     int
	threads []model.ThreadSched
	runq    model.Histogram
	rng     *rand.Rand
	now     time.Time
}

func newSim(nThreads int, seed uint64) *sim {
	s := &sim{pid: 100, rng: rand.New(rand.NewPCG(seed, 1)), now: t0,
		runq: model.Histogram{Bounds: bounds, Counts: make([]uint64, len(bounds))}}
	for i := range nThreads {
		s.threads = append(s.threads, model.ThreadSched{TID: 100 + i, Name: "worker"})
	}
	return s
}

// step advances one second in which the process switched rate times (spread
// over its threads, voluntary share vol), with relative noise, and waited in
// the run queue for about wait seconds each time.
func (s *sim) step(rate, vol, noise, wait float64) *model.Process {
	s.now = s.now.Add(time.Second)
	n := max(0, rate*(1+noise*(2*s.rng.Float64()-1)))
	for i := range s.threads {
		share := uint64(n / float64(len(s.threads)))
		v := uint64(float64(share) * vol)
		s.threads[i].Voluntary += v
		s.threads[i].Involuntary += share - v
	}
	b := len(bounds) - 1
	for i, ub := range bounds {
		if wait <= ub {
			b = i
			break
		}
	}
	s.runq.Counts[b] += uint64(n)
	s.runq.Count += uint64(n)
	s.runq.Sum += wait * n
	return s.sample()
}

func (s *sim) sample() *model.Process {
	p := &model.Process{PID: s.pid, Comm: "schedwork", Sched: model.SchedStats{AllowedCPUs: 2}}
	p.Sched.Threads = append([]model.ThreadSched(nil), s.threads...)
	for _, th := range s.threads {
		p.Sched.Voluntary += th.Voluntary
		p.Sched.Involuntary += th.Involuntary
	}
	p.Sched.RunqLatency = model.Histogram{Bounds: bounds, Counts: append([]uint64(nil), s.runq.Counts...), Count: s.runq.Count, Sum: s.runq.Sum}
	return p
}

// phase is a stretch of seconds at one rate.
type phase struct {
	secs        int
	rate, vol   float64
	noise, wait float64
}

// run feeds the phases to d after an initial sample and returns, for every
// second (1-based), the findings d returned.
func run(d *Detector, s *sim, phases ...phase) [][]model.Finding {
	out := [][]model.Finding{d.Observe(s.now, s.sample())}
	for _, ph := range phases {
		for range ph.secs {
			p := s.step(ph.rate, ph.vol, ph.noise, ph.wait)
			out = append(out, d.Observe(s.now, p))
		}
	}
	return out
}

// firstActive returns the second at which the first active finding came, or -1.
func firstActive(res [][]model.Finding) int {
	for i, fs := range res {
		for _, f := range fs {
			if f.Active {
				return i
			}
		}
	}
	return -1
}

func TestStormAfterWarmUp(t *testing.T) {
	d := New(Config{})
	s := newSim(8, 1)
	// 15 s of an ordinary server, then 6 s of preemption churn at 20k/s:
	// below the ceiling, so only the baseline can tell; then calm again.
	res := run(d, s,
		phase{secs: 15, rate: 800, vol: 0.8, noise: 0.2, wait: 5e-6},
		phase{secs: 6, rate: 20000, vol: 0.1, noise: 0.05, wait: 5e-3},
		phase{secs: 6, rate: 800, vol: 0.8, noise: 0.2, wait: 5e-6})
	if got := firstActive(res); got != 15+3 {
		t.Fatalf("storm flagged at second %d, want %d (after 3 intervals over)", got, 15+3)
	}
	f := res[18][0]
	if f.Kind != model.KindCtxSwitchStorm || f.PID != 100 || f.Comm != "schedwork" || !f.FirstSeen.Equal(t0.Add(18*time.Second)) {
		t.Errorf("finding = %+v", f)
	}
	ev := f.Evidence.(model.CtxSwitchStormEvidence)
	if ev.Hint != hintInvoluntary || !strings.Contains(f.Summary, "involuntary") {
		t.Errorf("hint = %v, summary %q; want involuntary", ev.Hint, f.Summary)
	}
	if r := ev.RatePerSecond; r < 18000 || r > 22000 {
		t.Errorf("rate_per_second = %v, want about 20000", r)
	}
	if ev.BaselineMean == nil || ev.RunqueueP99Seconds == nil {
		t.Fatalf("baseline_mean %v, runqueue_p99_seconds %v: want both", ev.BaselineMean, ev.RunqueueP99Seconds)
	}
	if b := *ev.BaselineMean; b < 600 || b > 1000 {
		t.Errorf("baseline_mean = %v, want about 800 (the storm must not be learned)", b)
	}
	if p := *ev.RunqueueP99Seconds; p != 1e-2 {
		t.Errorf("runqueue_p99_seconds = %v, want 0.01 (the storm's waits, not the calm ones)", p)
	}
	if ev.AllowedCPUs != 2 || ev.Threads != 8 {
		t.Errorf("allowed_cpus, threads = %v, %v", ev.AllowedCPUs, ev.Threads)
	}
	top := ev.TopThreads
	if len(top) != topThreads || top[0].Name != "worker" || top[0].Rate < 2000 {
		t.Errorf("top_threads = %+v", top)
	}
	if f.Severity != model.SeverityWarning {
		t.Errorf("severity = %s below the ceiling", f.Severity)
	}
	// Active through the storm, then ended once after 3 calm intervals.
	for sec := 18; sec <= 23; sec++ {
		if len(res[sec]) != 1 || !res[sec][0].Active {
			t.Errorf("second %d: %+v, want one active finding", sec, res[sec])
		}
	}
	if len(res[24]) != 1 || res[24][0].Active || !strings.HasPrefix(res[24][0].Summary, "context-switch storm ended") {
		t.Errorf("second 24: %+v, want the finding ended", res[24])
	}
	for sec := 25; sec < len(res); sec++ {
		if len(res[sec]) != 0 {
			t.Errorf("second %d: %+v after the end", sec, res[sec])
		}
	}
}

func TestStormFromAttach(t *testing.T) {
	d := New(Config{})
	s := newSim(8, 2)
	// Pipe ping-pong from the first sample: far above the ceiling, mostly
	// voluntary. The baseline never gets the chance to learn it.
	res := run(d, s, phase{secs: 8, rate: 300000, vol: 0.97, noise: 0.1, wait: 5e-5})
	if got := firstActive(res); got != 3 {
		t.Fatalf("storm flagged at second %d, want 3 (during warm-up, by the ceiling)", got)
	}
	f := res[3][0]
	ev := f.Evidence.(model.CtxSwitchStormEvidence)
	if ev.Hint != hintVoluntary || f.Severity != model.SeverityCritical {
		t.Errorf("hint %v, severity %s; want voluntary, critical", ev.Hint, f.Severity)
	}
	if r := ev.VoluntaryRatio; r < 0.95 {
		t.Errorf("voluntary_ratio = %v", r)
	}
	if ev.BaselineMean != nil {
		t.Errorf("baseline_mean = %v, want null: nothing was learned", *ev.BaselineMean)
	}
}

func TestQuiet(t *testing.T) {
	for _, c := range []struct {
		name   string
		phases []phase
	}{
		// A CPU-bound thread is preempted by the tick now and then.
		{"cpu-bound", []phase{{secs: 40, rate: 250, vol: 0.02, noise: 0.3}}},
		{"idle server", []phase{{secs: 40, rate: 3, vol: 1, noise: 1}}},
		{"steady moderate", []phase{{secs: 60, rate: 2000, vol: 0.9, noise: 0.3}}},
		// Above the floor but ordinary for this process, with noise.
		{"steady busy", []phase{{secs: 60, rate: 8000, vol: 0.9, noise: 0.15}}},
		// A very steady process whose load rises by a third: a tight
		// variance alone would call that far above the baseline.
		{"load step", []phase{{secs: 20, rate: 8000, vol: 0.9, noise: 0.01}, {secs: 20, rate: 11000, vol: 0.9, noise: 0.01}}},
		// One busy interval, and later two: bursts, not storms.
		{"spikes", []phase{
			{secs: 15, rate: 1000, vol: 0.8, noise: 0.2},
			{secs: 1, rate: 200000, vol: 0.9},
			{secs: 10, rate: 1000, vol: 0.8, noise: 0.2},
			{secs: 2, rate: 30000, vol: 0.9},
			{secs: 10, rate: 1000, vol: 0.8, noise: 0.2},
		}},
		// Busy from attach, but under the ceiling: the baseline learns it.
		{"busy from attach", []phase{{secs: 30, rate: 30000, vol: 0.9, noise: 0.1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for seed := range uint64(20) {
				res := run(New(Config{}), newSim(4, seed), c.phases...)
				if got := firstActive(res); got >= 0 {
					t.Fatalf("seed %d: flagged at second %d: %s", seed, got, res[got][0].Summary)
				}
			}
		})
	}
}

// The baseline does not learn from a spike: after one, the same storm is
// found as fast as without it.
func TestSpikeNotLearned(t *testing.T) {
	d := New(Config{})
	res := run(d, newSim(4, 3),
		phase{secs: 12, rate: 1000, vol: 0.8, noise: 0.1},
		phase{secs: 1, rate: 45000, vol: 0.8},
		phase{secs: 3, rate: 1000, vol: 0.8, noise: 0.1},
		phase{secs: 5, rate: 9000, vol: 0.8, noise: 0.05})
	if got := firstActive(res); got != 16+3 {
		t.Fatalf("storm after a spike flagged at second %d, want %d", got, 16+3)
	}
}

func TestFloorAndSustainConfigurable(t *testing.T) {
	// 3000/s is under the default floor...
	ph := []phase{{secs: 12, rate: 100, vol: 0.8, noise: 0.1}, {secs: 4, rate: 3000, vol: 0.8, noise: 0.05}}
	if got := firstActive(run(New(Config{}), newSim(4, 4), ph...)); got >= 0 {
		t.Fatalf("3000/s flagged at second %d with the default floor", got)
	}
	// ...and over a lower one; one interval is enough when Sustain is 1.
	if got := firstActive(run(New(Config{Floor: 1000, Sustain: 1}), newSim(4, 4), ph...)); got != 13 {
		t.Fatalf("3000/s with floor 1000, sustain 1: flagged at second %d, want 13", got)
	}
}

func TestResetAndForget(t *testing.T) {
	d := New(Config{})
	s := newSim(4, 5)
	run(d, s, phase{secs: 2, rate: 300000, vol: 0.9})
	// Totals that go down (not monotonic) restart the series: no rate,
	// no finding from the difference.
	s2 := newSim(4, 5)
	s2.now = s.now.Add(time.Second)
	if fs := d.Observe(s2.now, s2.sample()); fs != nil {
		t.Fatalf("findings after a counter reset: %+v", fs)
	}
	// Two more storm intervals: the count of intervals over the ceiling
	// started again, so three are needed.
	res := run(d, s2, phase{secs: 2, rate: 300000, vol: 0.9})
	if got := firstActive(res); got >= 0 {
		t.Fatalf("flagged at second %d after a reset", got)
	}
	d.Forget(100)
	if d.procs.Len() != 0 {
		t.Fatal("Forget kept state")
	}
}

// The process exits during a storm: its last sample has totals and no
// threads, over an interval partly after the exit. The finding keeps the
// storm's figures (the guests' runs ended with "452 switches/s over 0
// threads" on a storm of 8 k/s).
func TestExitKeepsStormFigures(t *testing.T) {
	d := New(Config{})
	s := newSim(4, 6)
	res := run(d, s, phase{secs: 12, rate: 100, vol: 0.8, noise: 0.1}, phase{secs: 4, rate: 20000, vol: 0.9})
	last := res[len(res)-1]
	if len(last) != 1 || !last[0].Active {
		t.Fatalf("no storm before the exit: %+v", last)
	}
	exit := s.step(400, 0.9, 0, 0)
	exit.Sched.Threads = nil
	if fs := d.Observe(s.now, exit); fs != nil {
		t.Fatalf("the exit's interval changed the storm: %s", fs[0].Summary)
	}
	if !strings.Contains(last[0].Summary, "20k switches/s (90% voluntary) over 4 threads") {
		t.Fatalf("storm figures: %s", last[0].Summary)
	}
}

func TestQuantile(t *testing.T) {
	h := model.Histogram{Bounds: []float64{1, 2, 4}, Counts: []uint64{50, 49, 1}, Count: 100}
	for q, want := range map[float64]float64{0.5: 1, 0.99: 2, 1: 4} {
		if got, ok := h.Quantile(q); !ok || got != want {
			t.Errorf("Quantile(%v) = %v %v, want %v", q, got, ok, want)
		}
	}
	// Observations above the last bound read as the last bound.
	over := model.Histogram{Bounds: []float64{1, 2}, Counts: []uint64{1, 0}, Count: 10}
	if got, _ := over.Quantile(0.99); got != 2 {
		t.Errorf("overflow quantile = %v, want 2", got)
	}
	if _, ok := (model.Histogram{}).Quantile(0.99); ok {
		t.Error("empty histogram has a quantile")
	}
	d := h.Sub(model.Histogram{Bounds: h.Bounds, Counts: []uint64{50, 0, 0}, Count: 50})
	if got, _ := d.Quantile(0.5); got != 2 || d.Count != 50 {
		t.Errorf("delta: p50 %v count %d, want 2, 50", got, d.Count)
	}
}
