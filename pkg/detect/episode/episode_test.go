package episode

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// step is one observation, a second after the previous.
type step struct {
	raise, hold bool
	quietFor    time.Duration
}

// play runs steps through a fresh episode under r, a second apart, and
// writes what each reported: "-" nothing, "A<first>" active, "E<first>"
// ended, with first the second of FirstSeen.
func play(r Rule, steps ...step) string {
	var e Episode
	var b strings.Builder
	fills := 0
	for i, s := range steps {
		now := t0.Add(time.Duration(i) * time.Second)
		out := e.Observe(now, "test", 7, r, Verdict{Raise: s.raise, Hold: s.hold, QuietFor: s.quietFor},
			func(f model.Finding, active bool) model.Finding {
				fills++
				f.Active, f.LastSeen = active, now
				return f
			})
		switch {
		case len(out) == 0:
			b.WriteString("-")
		case len(out) > 1:
			b.WriteString("?")
		case out[0].Kind != "test" || out[0].PID != 7 || !out[0].LastSeen.Equal(now):
			b.WriteString("!")
		case out[0].Active:
			fmt.Fprintf(&b, "A%d", int(out[0].FirstSeen.Sub(t0).Seconds()))
		default:
			fmt.Fprintf(&b, "E%d", int(out[0].FirstSeen.Sub(t0).Seconds()))
		}
		b.WriteString(" ")
	}
	return strings.TrimSpace(b.String())
}

var (
	R = step{raise: true}
	H = step{hold: true}
	N = step{}
)

func TestLifecycle(t *testing.T) {
	for _, tt := range []struct {
		name  string
		rule  Rule
		steps []step
		want  string
	}{
		{"raised at once, ended at the first observation without", Rule{}, []step{N, R, H, N, N}, "- A1 A1 E1 -"},
		{"raise implies hold", Rule{}, []step{R, R, N}, "A0 A0 E0"},
		{"hold alone never opens", Rule{}, []step{H, H, N}, "- - -"},
		{"confirmed by polls in a row", Rule{ConfirmPolls: 3}, []step{R, R, N, R, R, R, R}, "- - - - - A5 A5"},
		{"confirmed by time since the first", Rule{ConfirmFor: 2 * time.Second}, []step{R, R, R, N, R}, "- - A2 E2 -"},
		{"quiet polls in a row", Rule{QuietPolls: 2}, []step{R, N, H, N, N, N}, "A0 A0 A0 A0 E0 -"},
		{"quiet time since the last hold", Rule{QuietFor: 3 * time.Second}, []step{R, N, N, N, R}, "A0 A0 A0 E0 A4"},
		{"a hold sets its own quiet time", Rule{QuietFor: time.Second},
			[]step{R, {hold: true, quietFor: 3 * time.Second}, N, N, N}, "A0 A0 A0 A0 E0"},
		{"reopened: a new first sighting", Rule{}, []step{R, N, R}, "A0 E0 A2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := play(tt.rule, tt.steps...); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestInterrupt(t *testing.T) {
	var e Episode
	r := Rule{ConfirmPolls: 2}
	fill := func(f model.Finding, active bool) model.Finding { f.Active = active; return f }
	e.Observe(t0, "test", 1, r, Verdict{Raise: true}, fill)
	e.Interrupt() // a clock step: the raise before it does not count
	if out := e.Observe(t0.Add(time.Second), "test", 1, r, Verdict{Raise: true}, fill); len(out) != 0 || e.Open() {
		t.Fatalf("opened across an interruption: %+v", out)
	}
	if out := e.Observe(t0.Add(2*time.Second), "test", 1, r, Verdict{Raise: true}, fill); len(out) != 1 || !e.Open() {
		t.Fatalf("not opened after two raises: %+v", out)
	}
}

func TestChoose(t *testing.T) {
	type v struct{ leak, held bool }
	raises := func(x v) bool { return x.leak }
	holds := func(x v) bool { return x.held }
	for _, tt := range []struct {
		vs           []v
		raised, held int
	}{
		{nil, -1, -1},
		{[]v{{}, {}}, -1, -1},
		{[]v{{held: true}, {leak: true}}, 1, 1}, // a leak outranks a faster scale that merely holds
		{[]v{{}, {held: true}, {held: true}}, -1, 1},
		{[]v{{leak: true}, {leak: true}}, 0, 0},
	} {
		if r, h := Choose(tt.vs, raises, holds); r != tt.raised || h != tt.held {
			t.Errorf("Choose(%v) = %d, %d; want %d, %d", tt.vs, r, h, tt.raised, tt.held)
		}
	}
}

func TestProcs(t *testing.T) {
	var ps Procs[int]
	calls := 0
	count := func(n *int) []model.Finding { *n++; calls++; return nil }
	none := func() *int { return nil }
	ps.With(1, none, count)
	if calls != 0 || ps.Len() != 0 {
		t.Fatalf("nothing to keep: %d calls, %d kept", calls, ps.Len())
	}
	zero := func() *int { return new(int) }
	ps.With(1, zero, count)
	ps.With(1, none, count) // kept: create is not asked again
	ps.With(2, zero, count)
	if calls != 3 || ps.Len() != 2 {
		t.Fatalf("%d calls, %d kept; want 3, 2", calls, ps.Len())
	}
	var got int
	ps.With(1, none, func(n *int) []model.Finding { got = *n; return nil })
	if got != 2 {
		t.Errorf("pid 1's state %d, want 2", got)
	}
	ps.Forget(1)
	ps.Forget(3) // never kept
	if ps.Len() != 1 {
		t.Errorf("%d kept after Forget, want 1", ps.Len())
	}
}
