package daemon

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Health is a sink that records when the loop last ticked, for /healthz,
// and how the views stand, for /readyz.
type Health struct {
	// Require lists the views /readyz needs up (--require-views).
	Require []string

	last  atomic.Int64 // UnixNano of the last snapshot
	mu    sync.Mutex
	views map[string]model.ViewState // of the last snapshot
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
// what is missing: the views down, each with its reason, and the views
// absent. A required view that is absent (not expected on this node) is
// not ready either: requiring it says this node should have it, so a
// DaemonSet on nodes without GPUs, or without NVML given, shows.
func (h *Health) Ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.views == nil {
		return fmt.Errorf("not polled yet")
	}
	var down, absent, missing []string
	for _, v := range h.Require {
		switch st := h.views[v]; {
		case st.Absent != "":
			absent = append(absent, fmt.Sprintf("%s: %s (%s)", v, st.Absent.Meaning(), st.Down))
		case st.Down != "":
			down = append(down, v+": "+st.Down)
		}
	}
	if len(down) > 0 {
		missing = append(missing, "required views down: "+strings.Join(down, "; "))
	}
	if len(absent) > 0 {
		missing = append(missing, "required views absent, not expected on this node (leave them out of --require-views on such nodes): "+strings.Join(absent, "; "))
	}
	if len(missing) > 0 {
		return errors.New(strings.Join(missing, "; "))
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
