package series

import (
	"slices"
	"time"
)

// Slow trends, such as an fd leaked every minute or a few MiB of GPU memory
// held per hour, do not show in a window of seconds: the noise of a healthy
// process is larger than the growth. They show over minutes or hours, but
// keeping every sample of hours per process costs memory without bound.
// Multi keeps a sampled value at several time scales instead: per scale, the
// samples of each step are summarized in one bucket and a fixed number of
// buckets is kept, so memory is fixed whatever the run's length.

// Scale is one time scale of a Multi: the samples of each Step are
// summarized in one bucket, and the last Points completed buckets are kept.
type Scale struct {
	Step   time.Duration
	Points int
}

// Window is the time the kept buckets of s span.
func (s Scale) Window() time.Duration { return s.Step * time.Duration(s.Points) }

// Bucket summarizes the samples taken within one step.
type Bucket struct {
	Start    time.Time // start of the step
	Min, Max float64
	Last     float64
	N        int // samples in it
}

// Multi accumulates a sampled value at several time scales in bounded
// memory. Steps of every scale are aligned to the first sample, so the
// buckets of a coarse scale line up with those of finer ones. It is not
// safe for concurrent use.
type Multi struct {
	scales []Scale
	rings  []ring
	origin time.Time // start of the first step of every scale
	last   time.Time // time of the latest sample
}

// ring holds the completed buckets of one scale, and the one being filled.
type ring struct {
	buf  []Bucket // completed buckets; once full, head is the oldest
	head int
	cur  Bucket // N == 0 until a sample falls in it
}

// NewMulti returns an empty Multi over scales, finest first.
func NewMulti(scales ...Scale) *Multi {
	m := &Multi{scales: scales, rings: make([]ring, len(scales))}
	for i, s := range scales {
		m.rings[i].buf = make([]Bucket, 0, s.Points)
	}
	return m
}

// Add records v, sampled at t. A t that does not move past the last sample
// means the clock stepped: buckets mixing both sides of the step would give
// meaningless trends, so every scale starts again from v.
func (m *Multi) Add(t time.Time, v float64) {
	if !m.last.IsZero() && !t.After(m.last) {
		for i := range m.rings {
			m.rings[i] = ring{buf: m.rings[i].buf[:0]}
		}
		m.origin = time.Time{}
	}
	if m.origin.IsZero() {
		m.origin = t
	}
	m.last = t
	for i, s := range m.scales {
		r := &m.rings[i]
		start := m.origin.Add(t.Sub(m.origin) / s.Step * s.Step)
		if r.cur.N > 0 && !r.cur.Start.Equal(start) {
			r.push(r.cur, s.Points)
			r.cur = Bucket{}
		}
		if r.cur.N == 0 {
			r.cur = Bucket{Start: start, Min: v, Max: v}
		}
		r.cur.Min = min(r.cur.Min, v)
		r.cur.Max = max(r.cur.Max, v)
		r.cur.Last = v
		r.cur.N++
	}
}

func (r *ring) push(b Bucket, points int) {
	if len(r.buf) < points {
		r.buf = append(r.buf, b)
		return
	}
	r.buf[r.head] = b
	r.head = (r.head + 1) % points
}

// Buckets returns the completed buckets of scale i that lie within its
// window before the bucket being filled, oldest first. Steps without a
// sample (the process was not polled) have no bucket.
func (m *Multi) Buckets(i int) []Bucket {
	r := &m.rings[i]
	out := make([]Bucket, 0, len(r.buf))
	out = append(out, r.buf[r.head:]...)
	out = append(out, r.buf[:r.head]...)
	cut := r.cur.Start.Add(-m.scales[i].Window())
	for len(out) > 0 && out[0].Start.Before(cut) {
		out = out[1:]
	}
	return out
}

// Trend is the growth of the floor (each step's least value) over one
// scale's window. Floors, not means: short-lived peaks (a burst of requests,
// a batch freed a moment later) do not raise them, held growth does.
type Trend struct {
	Scale   Scale
	Buckets int           // completed buckets in the window
	Span    time.Duration // from the start of the first bucket to the end of the last
	// Slope is the Theil-Sen growth of the floors, per second: the median
	// of the slopes between every two of them, so that one step (a batch
	// opened at start-up, an allocation made once) does not tilt it.
	Slope       float64
	Drops       float64 // sum of the falls from one floor to the next
	First, Last float64 // floors of the first and last buckets
}

// Covered reports whether the trend spans its scale's window, less one step
// of slack, with at least half of its steps sampled.
func (t Trend) Covered() bool {
	return t.Buckets >= 2 && t.Buckets*2 >= t.Scale.Points && t.Span >= t.Scale.Window()-t.Scale.Step
}

// Rise is the growth over the span that the slope implies.
func (t Trend) Rise() float64 { return t.Slope * t.Span.Seconds() }

// Trend returns the trend of scale i.
func (m *Multi) Trend(i int) Trend {
	s := m.scales[i]
	bs := m.Buckets(i)
	t := Trend{Scale: s, Buckets: len(bs)}
	if len(bs) < 2 {
		return t
	}
	t.Span = bs[len(bs)-1].Start.Add(s.Step).Sub(bs[0].Start)
	t.First, t.Last = bs[0].Min, bs[len(bs)-1].Min
	slopes := make([]float64, 0, len(bs)*(len(bs)-1)/2)
	for j, b := range bs {
		if j > 0 {
			t.Drops += max(0, bs[j-1].Min-b.Min)
		}
		for _, c := range bs[j+1:] {
			slopes = append(slopes, (c.Min-b.Min)/c.Start.Sub(b.Start).Seconds())
		}
	}
	slices.Sort(slopes)
	n := len(slopes)
	t.Slope = (slopes[(n-1)/2] + slopes[n/2]) / 2
	return t
}
