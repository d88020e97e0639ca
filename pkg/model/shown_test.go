package model

import (
	"slices"
	"testing"
)

func TestIEC(t *testing.T) {
	for b, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 3 << 30: "3.0 GiB", 5 << 40: "5.0 TiB"} {
		if got := IEC(b); got != want {
			t.Errorf("IEC(%d) = %q, want %q", b, got, want)
		}
	}
}

// Every view shows its figures at most once, in the order of Views, and no
// two figures record one series.
func TestShows(t *testing.T) {
	last := -1
	names := map[string]bool{}
	for _, s := range Shows {
		i := slices.Index(Views, s.View)
		if i <= last {
			t.Errorf("view %q: not in Views, or out of their order", s.View)
		}
		last = i
		for _, f := range s.Figures {
			if names[f.Name] {
				t.Errorf("series %s recorded twice", f.Name)
			}
			names[f.Name] = true
			if (f.Kind == Quantile) != (f.Histogram != nil) || (f.Value == nil) == (f.Histogram == nil && f.Members == nil) {
				t.Errorf("figure %s: a Quantile has a Histogram, a family Members, any other a Value", f.Name)
			}
		}
	}
}
