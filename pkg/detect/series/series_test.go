package series

import (
	"math"
	"slices"
	"testing"
	"time"
)

var t0 = time.Unix(1000, 0)

func at(secs ...float64) []time.Time {
	out := make([]time.Time, len(secs))
	for i, s := range secs {
		out[i] = t0.Add(time.Duration(s * float64(time.Second)))
	}
	return out
}

func TestSlope(t *testing.T) {
	for _, tc := range []struct {
		name string
		ts   []time.Time
		vs   []int
		want float64
	}{
		{"one sample", at(0), []int{5}, 0},
		{"same time", at(1, 1, 1), []int{1, 2, 3}, 0},
		{"flat", at(0, 1, 2, 3), []int{4, 4, 4, 4}, 0},
		{"two per second", at(0, 1, 2, 3), []int{10, 12, 14, 16}, 2},
		{"uneven times", at(0, 0.5, 2), []int{0, 1, 4}, 2},
		{"falling", at(0, 2, 4), []int{8, 4, 0}, -2},
		{"noisy fit", at(0, 1, 2), []int{0, 2, 1}, 0.5},
	} {
		if got := Slope(tc.ts, tc.vs); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: Slope = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSpreadRise(t *testing.T) {
	for _, tc := range []struct {
		name  string
		vals  []int64
		share float64
		want  int64
	}{
		{"even steps", []int64{0, 2, 4, 6, 8}, 0.5, 8},
		{"falls", []int64{8, 6, 4}, 0.5, 0},
		{"flat", []int64{3, 3, 3}, 0.5, 0},
		{"one big step", []int64{0, 0, 10, 10}, 0.5, 0},
		{"step at the share", []int64{0, 5, 10}, 0.5, 10},
		{"big drop inside", []int64{0, 10, 4, 8}, 0.5, 0},
		{"looser share", []int64{0, 0, 10, 10}, 1, 10},
	} {
		if got := SpreadRise(tc.vals, tc.share); got != tc.want {
			t.Errorf("%s: SpreadRise = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestLateRise(t *testing.T) {
	for _, tc := range []struct {
		vals []int
		want int
	}{
		{[]int{0, 1, 2, 3}, 1},
		{[]int{0, 1, 2, 3, 4}, 2},
		{[]int{0, 9, 9, 9}, 0},
		{[]int{5, 3, 1}, -2},
	} {
		if got := LateRise(tc.vals); got != tc.want {
			t.Errorf("LateRise(%v) = %d, want %d", tc.vals, got, tc.want)
		}
	}
}

func TestSteady(t *testing.T) {
	th := Steadiness{MinRisingShare: 0.6, MinRiseOfMean: 0.25, MaxStepShare: 0.5, MinLateShare: 0.25}
	for _, tc := range []struct {
		name string
		vals []int
		want bool
	}{
		{"ramp", []int{0, 2, 4, 6, 8, 10}, true},
		{"ramp with a pause", []int{0, 2, 4, 4, 6, 8}, true},
		{"burst", []int{0, 0, 0, 10, 10, 10}, false},
		{"ramp that stopped", []int{0, 3, 6, 9, 9, 9, 9}, false},
		{"rises often but not late", []int{0, 2, 4, 6, 8, 10, 10, 10, 10}, false},
		{"mostly flat steps", []int{0, 0, 0, 4, 8, 8, 8, 12}, false},
		{"falling", []int{10, 8, 6, 4}, false},
		{"flat", []int{5, 5, 5, 5}, false},
	} {
		if got := Steady(tc.vals, th); got != tc.want {
			t.Errorf("%s: Steady(%v) = %v, want %v", tc.name, tc.vals, got, tc.want)
		}
	}
}

func TestCovered(t *testing.T) {
	for _, tc := range []struct {
		span, window time.Duration
		n            int
		want         bool
	}{
		{8 * time.Second, 8 * time.Second, 9, true},
		{7 * time.Second, 8 * time.Second, 8, true}, // one interval short: the slack
		{6 * time.Second, 8 * time.Second, 7, false},
		{10 * time.Second, 8 * time.Second, 1, false},
		{0, 8 * time.Second, 2, false},
	} {
		if got := Covered(tc.span, tc.window, tc.n); got != tc.want {
			t.Errorf("Covered(%v, %v, %d) = %v, want %v", tc.span, tc.window, tc.n, got, tc.want)
		}
	}
}

func TestPush(t *testing.T) {
	type smp struct {
		t time.Time
		v int
	}
	tOf := func(s smp) time.Time { return s.t }
	push := func(s []smp, secs float64) []smp {
		now := at(secs)[0]
		return Push(s, smp{now, int(secs)}, now, 3*time.Second, tOf)
	}
	vals := func(s []smp) []int {
		var out []int
		for _, x := range s {
			out = append(out, x.v)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		secs []float64
		want []int
	}{
		{"within the window", []float64{0, 1, 2, 3}, []int{0, 1, 2, 3}},
		{"oldest leaves", []float64{0, 1, 2, 3, 4, 5}, []int{2, 3, 4, 5}},
		{"gap drops all but the new", []float64{0, 1, 10}, []int{10}},
		{"clock back starts again", []float64{0, 1, 2, 1}, []int{1}},
		{"same time starts again", []float64{0, 1, 1}, []int{1}},
	} {
		var s []smp
		for _, sec := range tc.secs {
			s = push(s, sec)
		}
		if got := vals(s); !slices.Equal(got, tc.want) {
			t.Errorf("%s: kept %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestRound(t *testing.T) {
	for _, tc := range []struct {
		x      float64
		digits int
		want   float64
	}{
		{1.26, 1, 1.3},
		{1.24, 1, 1.2},
		{-2.5, 0, -3},
		{1234.5678, 2, 1234.57},
		{1234, -2, 1200},
	} {
		if got := Round(tc.x, tc.digits); got != tc.want {
			t.Errorf("Round(%v, %d) = %v, want %v", tc.x, tc.digits, got, tc.want)
		}
	}
}

// A day of samples every second keeps at most Points buckets per scale,
// each the least, greatest and last of its step.
func TestMultiBoundedAndFloors(t *testing.T) {
	scales := []Scale{{Step: 5 * time.Second, Points: 20}, {Step: time.Minute, Points: 30}}
	m := NewMulti(scales...)
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for s := range 24 * 3600 {
		// A sawtooth 0..4 within each 5 s step, on a ramp of 1 per minute.
		m.Add(base.Add(time.Duration(s)*time.Second), float64(s/60+s%5))
	}
	for i, sc := range scales {
		bs := m.Buckets(i)
		if len(bs) != sc.Points || cap(m.rings[i].buf) != sc.Points {
			t.Fatalf("scale %d: %d buckets kept, capacity %d, want %d", i, len(bs), cap(m.rings[i].buf), sc.Points)
		}
		for j := 1; j < len(bs); j++ {
			if !bs[j].Start.Equal(bs[j-1].Start.Add(sc.Step)) {
				t.Fatalf("scale %d: buckets %v and %v not one step apart", i, bs[j-1].Start, bs[j].Start)
			}
		}
	}
	b := m.Buckets(0)[0]
	s := int(b.Start.Sub(base).Seconds())
	if b.N != 5 || b.Min != float64(s/60) || b.Max != float64(s/60+4) || b.Last != float64((s+4)/60+4) {
		t.Errorf("bucket at %ds: %+v", s, b)
	}
	for i := range scales {
		if tr := m.Trend(i); !tr.Covered() || tr.Span != scales[i].Window() {
			t.Errorf("scale %d: trend %+v, want a full window", i, tr)
		}
	}
	// The ramp shows on the scale whose window holds many of its steps.
	if tr := m.Trend(1); math.Abs(tr.Slope-1.0/60) > 0.1/60 || tr.Drops != 0 {
		t.Errorf("30 min trend %+v, want 1/min without falls", tr)
	}
}

// One step (a batch opened once) does not tilt the slope of a flat series,
// nor change that of a slow ramp; falls are summed.
func TestTrendRobust(t *testing.T) {
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		value func(s int) float64
		slope float64
		drops float64
	}{
		{"flat with a step", func(s int) float64 { return 100 + 50*float64(min(1, s/30)) }, 0, 0},
		{"ramp with a step", func(s int) float64 { return float64(s)/10 + 50*float64(min(1, s/30)) }, 0.1, 0},
		{"sawtooth", func(s int) float64 { return float64(s%20) / 2 }, math.NaN(), 4 * 9},
	} {
		m := NewMulti(Scale{Step: 2 * time.Second, Points: 50})
		for s := range 101 {
			m.Add(base.Add(time.Duration(s)*time.Second), tc.value(s))
		}
		tr := m.Trend(0)
		if !math.IsNaN(tc.slope) && math.Abs(tr.Slope-tc.slope) > 0.01 {
			t.Errorf("%s: slope %.3f/s, want %.3f", tc.name, tr.Slope, tc.slope)
		}
		if tr.Drops != tc.drops {
			t.Errorf("%s: drops %v, want %v", tc.name, tr.Drops, tc.drops)
		}
	}
}

// A clock stepping back starts every scale again; steps without samples
// leave the window uncovered.
func TestMultiClockStepAndGaps(t *testing.T) {
	base := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	sc := Scale{Step: time.Second, Points: 10}
	m := NewMulti(sc)
	for s := range 30 {
		m.Add(base.Add(time.Duration(s)*time.Second), float64(s))
	}
	if !m.Trend(0).Covered() {
		t.Fatal("30 s of samples do not cover a 10 s window")
	}
	m.Add(base.Add(-time.Hour), 0)
	if n := len(m.Buckets(0)); n != 0 || m.Trend(0).Covered() {
		t.Fatalf("%d buckets after the clock stepped back", n)
	}
	// One sample every 3 s: a third of the steps.
	m = NewMulti(sc)
	for s := 0; s < 60; s += 3 {
		m.Add(base.Add(time.Duration(s)*time.Second), float64(s))
	}
	if tr := m.Trend(0); tr.Covered() {
		t.Errorf("covered with %d of %d steps sampled", tr.Buckets, sc.Points)
	}
}

func TestRoughSeconds(t *testing.T) {
	for s, want := range map[float64]string{18.4: "18s", 180.8: "3m", 7200: "2h", 3 * 86400: "3d"} {
		if got := RoughSeconds(s); got != want {
			t.Errorf("RoughSeconds(%v) = %q, want %q", s, got, want)
		}
	}
}
