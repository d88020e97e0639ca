package topk

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"
)

// The first k are those a full sort gives first, in its order, ties
// included, for every k around the list's length.
func TestOfMatchesSort(t *testing.T) {
	type site struct{ made, id int }
	order := func(a, b site) int { return cmp.Or(cmp.Compare(b.made, a.made), cmp.Compare(a.id, b.id)) }
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 40 {
		xs := make([]site, n)
		for i := range xs {
			xs[i] = site{made: r.IntN(5), id: i}
		}
		before := slices.Clone(xs)
		sorted := slices.SortedFunc(slices.Values(xs), order)
		for k := range n + 2 {
			got := Of(xs, k, order)
			if want := sorted[:min(k, n)]; !slices.Equal(got, want) {
				t.Fatalf("n=%d k=%d: %v, want %v", n, k, got, want)
			}
		}
		if !slices.Equal(xs, before) {
			t.Fatalf("n=%d: the list was changed", n)
		}
	}
	if got := Of([]int{3, 1, 2}, 0, cmp.Compare[int]); got != nil {
		t.Errorf("k=0: %v", got)
	}
}
