// Package topk picks the first k of a list by an order without sorting the
// whole list: the views symbolize the top call sites of every process each
// poll, and sorting all of a process's sites to find them grows with the
// sites where the top does not.
package topk

import "slices"

// Of returns the first k of xs by cmp (negative: a comes first), in that
// order; xs is left as it is. It takes O(n log k).
func Of[T any](xs []T, k int, cmp func(a, b T) int) []T {
	if k <= 0 {
		return nil
	}
	// A heap whose root is the last of those kept: a later element that
	// comes before it takes its place.
	h := make([]T, 0, min(k, len(xs)))
	for _, x := range xs {
		switch {
		case len(h) < k:
			h = append(h, x)
			up(h, len(h)-1, cmp)
		case cmp(x, h[0]) < 0:
			h[0] = x
			down(h, 0, cmp)
		}
	}
	slices.SortFunc(h, cmp)
	return h
}

// up and down keep h a heap with the element that comes last at its root.
func up[T any](h []T, i int, cmp func(a, b T) int) {
	for i > 0 {
		parent := (i - 1) / 2
		if cmp(h[i], h[parent]) <= 0 {
			return
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

func down[T any](h []T, i int, cmp func(a, b T) int) {
	for {
		last := i
		for _, c := range []int{2*i + 1, 2*i + 2} {
			if c < len(h) && cmp(h[c], h[last]) > 0 {
				last = c
			}
		}
		if last == i {
			return
		}
		h[i], h[last] = h[last], h[i]
		i = last
	}
}
