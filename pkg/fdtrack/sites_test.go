package fdtrack

import (
	"slices"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// The kernel's per-site counters, tracked from before exec: hold_open
// opens 10 fds and keeps them, try_open opens and closes one 20 times a
// second. The first site holds 10 of 10 opened; the second, holding at
// most one, counts every open and close, and shows as a past site when
// it holds none.
func TestSiteCounts(t *testing.T) {
	c := newConcern(t)
	p := fdworkFromExec(t, c, "near", "64", "10", "30")
	has := func(s model.FDSite, fn string) bool {
		return slices.ContainsFunc(s.Stack, func(f model.Frame) bool { return f.Function == fn })
	}
	for poll := 0; ; poll++ {
		if poll == 10 {
			t.Fatalf("after %d polls: sites %+v, past sites %+v", poll, p.FD.Sites, p.FD.PastSites)
		}
		time.Sleep(time.Second)
		if _, err := c.Observe(time.Now(), []*model.Process{p}); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(p.FD.Sites, func(s model.FDSite) bool { return has(s, "hold_open") })
		if i < 0 {
			continue
		}
		if s := p.FD.Sites[i]; len(s.Opened) != 10 || s.OpenedTotal != 10 || s.ClosedTotal != 0 {
			t.Fatalf("hold_open: %d open, %d opened, %d closed; want 10, 10, 0", len(s.Opened), s.OpenedTotal, s.ClosedTotal)
		}
		j := slices.IndexFunc(p.FD.PastSites, func(s model.FDSite) bool { return has(s, "try_open") })
		if j < 0 {
			continue // try_open's fd was open at the poll
		}
		s := p.FD.PastSites[j]
		if s.OpenedTotal < 20 || s.ClosedTotal != s.OpenedTotal || len(s.Opened) != 0 {
			t.Fatalf("try_open: %d opened, %d closed, %d open; want 20 or more opened, all closed", s.OpenedTotal, s.ClosedTotal, len(s.Opened))
		}
		t.Logf("poll %d: try_open opened and closed %d", poll, s.OpenedTotal)
		return
	}
}
