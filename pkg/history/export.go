package history

import (
	"encoding/json"
	"math"
	"strconv"
	"time"
)

// History is what was kept of one process or GPU, oldest point first:
// every slice has one entry per point. A point is one interval, or beyond
// the recent window several merged (Span tells).
type History struct {
	Time   []int64            `json:"time_unix_ms"` // when each point ends, Unix milliseconds
	Span   []int64            `json:"span_ms"`      // the time each point covers, milliseconds
	Series map[string]*Series `json:"series"`
}

// Series is one figure over time. For each point, Min and Max are the
// least and greatest value within its span; a gauge has Last, its value at
// the end of the span; a rate has Mean, the events of the span divided by
// its length (Min and Max are then the least and greatest rate of its
// intervals). An entry is null where the figure had no value; rates have
// none at a process's first point, whose events count in the second's.
type Series struct {
	Unit string `json:"unit"`
	Min  Values `json:"min"`
	Max  Values `json:"max"`
	Last Values `json:"last,omitempty"`
	Mean Values `json:"mean,omitempty"`
}

// Values is a column of a series; NaN is written as null, the absence of a
// value.
type Values []float64

// MarshalJSON writes integers exactly (byte counts) and other numbers with
// six significant digits, plenty for a chart and much shorter.
func (v Values) MarshalJSON() ([]byte, error) {
	b := make([]byte, 0, 2+len(v)*6)
	b = append(b, '[')
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		switch {
		case math.IsNaN(x) || math.IsInf(x, 0):
			b = append(b, "null"...)
		case x == math.Trunc(x) && math.Abs(x) < 1<<53:
			b = strconv.AppendInt(b, int64(x), 10)
		default:
			b = strconv.AppendFloat(b, x, 'g', 6, 64)
		}
	}
	return append(b, ']'), nil
}

// UnmarshalJSON reads null as NaN.
func (v *Values) UnmarshalJSON(b []byte) error {
	var raw []*float64
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	out := make(Values, len(raw))
	for i, x := range raw {
		out[i] = math.NaN()
		if x != nil {
			out[i] = *x
		}
	}
	*v = out
	return nil
}

// Process returns the history of the process that had pid and was first
// watched at started, or nil if none was recorded.
func (r *Recorder) Process(pid int, started time.Time) *History {
	pt := r.procs[procKey{pid, started.UnixNano()}]
	if pt == nil {
		return nil
	}
	return pt.export()
}

// GPU returns the history of a GPU, by UUID or, without one, by index; nil
// if none was recorded.
func (r *Recorder) GPU(uuid string, index int) *History {
	gt := r.gpus[gpuID(uuid, index)]
	if gt == nil {
		return nil
	}
	return gt.export()
}

func (t *track) export() *History {
	points := make([]point, 0, len(t.coarse)+len(t.recent))
	points = append(append(points, t.coarse...), t.recent...)
	h := &History{Time: make([]int64, len(points)), Span: make([]int64, len(points)), Series: make(map[string]*Series, len(t.names))}
	for i, x := range points {
		h.Time[i], h.Span[i] = x.end.UnixMilli(), x.span.Milliseconds()
	}
	for si, name := range t.names {
		unit, rate := Unit(name)
		f, _ := figure(name)
		s := &Series{Unit: unit, Min: make(Values, len(points)), Max: make(Values, len(points))}
		col := make(Values, len(points))
		if rate {
			s.Mean = col
		} else {
			s.Last = col
		}
		for i, x := range points {
			var a acc
			if si < len(x.vals) {
				a = x.vals[si]
			}
			if !a.set && f.Members != nil {
				a = gauge(0) // a member of a family, absent then
				a.set = true
			}
			if !a.set {
				s.Min[i], s.Max[i], col[i] = math.NaN(), math.NaN(), math.NaN()
				continue
			}
			s.Min[i], s.Max[i], col[i] = a.min, a.max, a.last
			if rate {
				col[i] = a.total / a.dur // dur > 0: rates are set only then
			}
		}
		h.Series[name] = s
	}
	return h
}
