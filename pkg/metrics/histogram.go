package metrics

import (
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// RunqueueBuckets are the classic buckets of the run-queue histogram when
// Options.RunqueueClassicBuckets asks for them: a few powers of two of a
// second (kernel slot bounds, so the counts are exact) from about 120 µs to
// 0.5 s: 2^-13, 2^-10 (~1 ms), 2^-7 (~8 ms), 2^-4 (62.5 ms), 2^-1.
var RunqueueBuckets = []float64{0x1p-13, 0x1p-10, 0x1p-7, 0x1p-4, 0x1p-1}

// runqHistogram exports h, whose bounds are powers of two of a second (the
// sched concern's), as a native histogram of schema 0: bucket i holds
// (2^(i-1), 2^i] seconds, which are exactly h's buckets, so one series per
// process carries all 22 of them. h's first bucket (everything up to its
// bound) is the zero bucket; waits over the last bound go to the bucket
// above it. With classic set, RunqueueBuckets are added for scrapers that
// do not ask for native histograms; without it they see count and sum.
func runqHistogram(d *prometheus.Desc, h model.Histogram, since time.Time, classic bool, labels ...string) prometheus.Metric {
	pos := map[int]int64{}
	var zero, in uint64
	for i, n := range h.Counts {
		in += n
		switch {
		case i == 0:
			zero = n
		case n > 0:
			pos[nativeIndex(h.Bounds[i])] += int64(n)
		}
	}
	if over := h.Count - in; over > 0 {
		pos[nativeIndex(h.Bounds[len(h.Bounds)-1])+1] += int64(over)
	}
	native := prometheus.MustNewConstNativeHistogram(d, h.Count, h.Sum, pos, nil, zero, 0, h.Bounds[0], since, labels...)
	if !classic {
		return native
	}
	buckets := make([]*dto.Bucket, len(RunqueueBuckets))
	for j, b := range RunqueueBuckets {
		var cum uint64
		for i, n := range h.Counts {
			if h.Bounds[i] <= b {
				cum += n
			}
		}
		buckets[j] = &dto.Bucket{UpperBound: proto.Float64(b), CumulativeCount: proto.Uint64(cum)}
	}
	return withBuckets{native, buckets}
}

// nativeIndex is the schema-0 bucket whose upper bound is b, for b a power
// of two (else the bucket holding b).
func nativeIndex(b float64) int {
	return int(math.Ceil(math.Log2(b)))
}

// withBuckets is a native histogram that also carries classic buckets.
type withBuckets struct {
	prometheus.Metric
	buckets []*dto.Bucket
}

func (m withBuckets) Write(out *dto.Metric) error {
	if err := m.Metric.Write(out); err != nil {
		return err
	}
	// The native histogram hands out its own message: change a copy.
	h := proto.Clone(out.Histogram).(*dto.Histogram)
	h.Bucket = m.buckets
	out.Histogram = h
	return nil
}
