package fdtrack

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
)

// byNum orders entries by fd, dense or sparse, as a sort would.
func TestByNum(t *testing.T) {
	entries := func(nums ...int32) []bpfobj.Entry[fdFdKey, fdFdInfo] {
		g := make([]bpfobj.Entry[fdFdKey, fdFdInfo], len(nums))
		for i, n := range nums {
			g[i] = bpfobj.Entry[fdFdKey, fdFdInfo]{Key: fdFdKey{Tgid: 7, Fd: n}, Val: fdFdInfo{OpenNs: uint64(n) * 10}}
		}
		return g
	}
	dense := rand.Perm(15000)
	var denseNums []int32
	for _, n := range dense {
		if n%7 != 3 { // holes, as closed fds leave
			denseNums = append(denseNums, int32(n))
		}
	}
	for _, tc := range []struct {
		name string
		nums []int32
	}{
		{"empty", nil},
		{"dense with holes", denseNums},
		{"sparse (dup2 to high fds)", []int32{1 << 20, 3, 0, 1 << 16, 2}},
		{"negative", []int32{5, -1, 2}},
	} {
		got := byNum(entries(tc.nums...))
		want := slices.Clone(tc.nums)
		slices.Sort(want)
		var nums []int32
		for _, e := range got {
			if e.Val.OpenNs != uint64(e.Key.Fd)*10 {
				t.Fatalf("%s: fd %d carries another entry's value", tc.name, e.Key.Fd)
			}
			nums = append(nums, e.Key.Fd)
		}
		if !slices.Equal(nums, want) {
			t.Errorf("%s: %d entries out of order or lost", tc.name, len(nums))
		}
	}
}

// digest tells tables apart by content, whatever the order: an fd closed
// and another opened under the same number must not look the same.
func TestDigest(t *testing.T) {
	e := func(fd int32, ns uint64, stack int32) bpfobj.Entry[fdFdKey, fdFdInfo] {
		return bpfobj.Entry[fdFdKey, fdFdInfo]{Key: fdFdKey{Tgid: 7, Fd: fd}, Val: fdFdInfo{OpenNs: ns, StackId: stack}}
	}
	a := []bpfobj.Entry[fdFdKey, fdFdInfo]{e(3, 100, 1), e(4, 200, 1), e(5, 300, 2)}
	if digest(a) != digest([]bpfobj.Entry[fdFdKey, fdFdInfo]{a[2], a[0], a[1]}) {
		t.Error("the order changed the digest")
	}
	for name, b := range map[string][]bpfobj.Entry[fdFdKey, fdFdInfo]{
		"reopened":      {e(3, 100, 1), e(4, 250, 1), e(5, 300, 2)},
		"other stack":   {e(3, 100, 1), e(4, 200, 3), e(5, 300, 2)},
		"other number":  {e(3, 100, 1), e(6, 200, 1), e(5, 300, 2)},
		"swapped times": {e(3, 200, 1), e(4, 100, 1), e(5, 300, 2)},
	} {
		if digest(a) == digest(b) {
			t.Errorf("%s: same digest", name)
		}
	}
}
