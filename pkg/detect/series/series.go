// Package series holds the numeric helpers the detectors share to judge a
// short window of samples (trimming the window, its least-squares slope, and
// whether a rise is spread over many steps) and to follow slow trends over
// minutes and hours in bounded memory (Multi). The thresholds stay with each
// detector; only the arithmetic (and the rounding of what a summary shows)
// lives here, so that the detectors cannot drift apart on it.
package series

import (
	"fmt"
	"math"
	"time"
)

// Integer is a count or byte total sampled by a detector.
type Integer interface{ ~int | ~int64 }

// Number is an Integer or a value derived from one (a floor, a mean).
type Number interface{ Integer | ~float64 }

// Push appends x, taken at now, to s and drops the samples older than window.
// A now that does not move past the last sample means the clock stepped: a
// series mixing both sides of the step would give a meaningless slope, so it
// starts again from x.
func Push[S any](s []S, x S, now time.Time, window time.Duration, at func(S) time.Time) []S {
	if n := len(s); n > 0 && !now.After(at(s[n-1])) {
		s = s[:0]
	}
	s = append(s, x)
	cut := 0
	for now.Sub(at(s[cut])) > window {
		cut++
	}
	return s[cut:]
}

// Covered reports whether n samples spanning span cover about a full window.
// One average interval of slack: samples come about, not exactly, every
// interval, so the oldest one may just have left the window.
func Covered(span, window time.Duration, n int) bool {
	return n >= 2 && span >= window-span/time.Duration(n-1)
}

// Slope is the least-squares growth of vs over ts, in units per second; 0
// when the times do not spread (fewer than two distinct ones).
func Slope[V Number](ts []time.Time, vs []V) float64 {
	var sx, sy, sxx, sxy float64
	for i, t := range ts {
		x, y := t.Sub(ts[0]).Seconds(), float64(vs[i])
		sx += x
		sy += y
		sxx += x * x
		sxy += x * y
	}
	n := float64(len(ts))
	den := n*sxx - sx*sx
	if den == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / den
}

// SpreadRise returns the rise from the first value to the last when it is
// positive and no single step, up or down, is more than maxStepShare of it;
// else 0.
func SpreadRise[V Integer](vals []V, maxStepShare float64) V {
	rise := vals[len(vals)-1] - vals[0]
	if rise <= 0 {
		return 0
	}
	for i := 1; i < len(vals); i++ {
		if math.Abs(float64(vals[i]-vals[i-1])) > maxStepShare*float64(rise) {
			return 0
		}
	}
	return rise
}

// LateRise is the change over the later half of vals (from the middle
// sample to the last): a leak keeps rising to the end of the window, a
// ramp that stopped does not.
func LateRise[V Integer](vals []V) V {
	return vals[len(vals)-1] - vals[len(vals)/2]
}

// Steadiness holds the thresholds of Steady, each a share in [0, 1].
type Steadiness struct {
	MinRisingShare float64 // share of steps between samples that must be rises
	MinRiseOfMean  float64 // a step is a rise when it adds this share of the mean step
	MaxStepShare   float64 // largest allowed |step| as a share of the total rise
	MinLateShare   float64 // share of the total rise the later half must carry
}

// Steady reports whether vals rose in many small steps and were still rising
// in the later half of the window.
func Steady[V Integer](vals []V, th Steadiness) bool {
	rise := SpreadRise(vals, th.MaxStepShare)
	if rise == 0 {
		return false
	}
	// Churn adds small ups and downs; only steps that carry a fair part of
	// the growth count, else a few batches plus noise pass for steady.
	mean := float64(rise) / float64(len(vals)-1)
	rising := 0
	for i := 1; i < len(vals); i++ {
		if step := vals[i] - vals[i-1]; step > 0 && float64(step) >= th.MinRiseOfMean*mean {
			rising++
		}
	}
	return float64(rising) >= th.MinRisingShare*float64(len(vals)-1) && float64(LateRise(vals)) >= th.MinLateShare*float64(rise)
}

// Round rounds x to digits decimal places, for evidence that reads well.
func Round(x float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(x*p) / p
}

// RoughSeconds renders a duration in seconds as one rounded unit, as a
// summary gives a time to exhaustion or a period: "18s", "3m", "2h", "3d".
func RoughSeconds(s float64) string {
	switch {
	case s < 90:
		return fmt.Sprintf("%.0fs", s)
	case s < 90*60:
		return fmt.Sprintf("%.0fm", s/60)
	case s < 48*3600:
		return fmt.Sprintf("%.0fh", s/3600)
	default:
		return fmt.Sprintf("%.0fd", s/86400)
	}
}
