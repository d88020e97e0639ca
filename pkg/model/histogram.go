package model

// Histogram is a cumulative histogram: Counts[i] observations fell at or
// below Bounds[i] (seconds) and above Bounds[i-1]; Count and Sum cover all.
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
	Sum    float64 // seconds
}

// Quantile returns the upper bound of the bucket that holds the q-quantile
// (0 < q <= 1), and false for an empty histogram. Observations above the last
// bound are counted in Count only, so a quantile that falls among them reads
// as the last bound: a lower limit.
func (h Histogram) Quantile(q float64) (float64, bool) {
	if h.Count == 0 || len(h.Bounds) == 0 {
		return 0, false
	}
	// The rank of the quantile, rounded up, so that q=1 is the largest.
	rank := uint64(q * float64(h.Count))
	if float64(rank) < q*float64(h.Count) {
		rank++
	}
	var cum uint64
	for i, c := range h.Counts {
		cum += c
		if cum >= rank {
			return h.Bounds[i], true
		}
	}
	return h.Bounds[len(h.Bounds)-1], true
}

// Sub returns the observations in h that are not in old, an earlier state of
// the same cumulative histogram (same bounds). An old that is not earlier (a
// reset) is ignored.
func (h Histogram) Sub(old Histogram) Histogram {
	d := Histogram{Bounds: h.Bounds, Counts: append([]uint64(nil), h.Counts...), Count: h.Count, Sum: h.Sum}
	if old.Count > h.Count || len(old.Counts) != len(h.Counts) {
		return d
	}
	for i, c := range old.Counts {
		d.Counts[i] -= min(c, d.Counts[i])
	}
	d.Count -= old.Count
	d.Sum -= old.Sum
	return d
}
