package report

import "github.com/open-autoglm/autoglm-ebpf/pkg/model"

// ContextSwitches counts a process's context switches since attach.
type ContextSwitches struct {
	Voluntary   uint64 `json:"voluntary"`
	Involuntary uint64 `json:"involuntary"`
}

// p99 is the 99th percentile of h (the upper bound of its bucket), or nil
// when h is empty.
func p99(h model.Histogram) *float64 {
	q, ok := h.Quantile(0.99)
	if !ok {
		return nil
	}
	return &q
}
