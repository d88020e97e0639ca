package daemon

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Health is a sink that records when the loop last ticked, for /healthz,
// and which views are down, for /readyz.
type Health struct {
	// Require lists the views /readyz needs up (--require-views).
	Require []string

	last  atomic.Int64 // UnixNano of the last snapshot
	mu    sync.Mutex
	views map[string]string // of the last snapshot: why each view is down
}

// Update records the tick and the views' state.
func (h *Health) Update(s *model.Snapshot) {
	h.last.Store(time.Now().UnixNano())
	if s != nil {
		h.mu.Lock()
		h.views = s.Views
		h.mu.Unlock()
	}
}

// Close does nothing: the loop has stopped.
func (h *Health) Close(*model.Snapshot) error { return nil }

// Since is how long ago the loop last ticked; false before the first tick.
func (h *Health) Since() (time.Duration, bool) {
	n := h.last.Load()
	if n == 0 {
		return 0, false
	}
	return time.Since(time.Unix(0, n)), true
}

// Ready returns nil once a poll has seen every required view up, else
// what is missing: the views down, each with its reason.
func (h *Health) Ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.views == nil {
		return fmt.Errorf("not polled yet")
	}
	var down []string
	for _, v := range h.Require {
		if why := h.views[v]; why != "" {
			down = append(down, v+": "+why)
		}
	}
	if len(down) > 0 {
		return fmt.Errorf("required views down: %s", strings.Join(down, "; "))
	}
	return nil
}

// ParseViews reads a comma-separated list of views (--require-views).
func ParseViews(list string) ([]string, error) {
	var out []string
	for _, v := range strings.Split(list, ",") {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		if !slices.Contains(model.Views, v) {
			return nil, fmt.Errorf("unknown view %q (views: %s)", v, strings.Join(model.Views, ", "))
		}
		out = append(out, v)
	}
	return out, nil
}
