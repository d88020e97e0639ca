package testutil

import (
	"testing"

	"github.com/cilium/ebpf"
)

// Entries counts the entries of a BPF map, whatever its key and value.
func Entries(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	n := 0
	var k, v []byte
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}
