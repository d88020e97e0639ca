package bpfobj

import (
	"testing"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// hashMap is a hash map of uint64 values, closed when the test ends.
func hashMap(t *testing.T, keySize, entries uint32) *ebpf.Map {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: keySize, ValueSize: 8, MaxEntries: entries})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

type ownedKey struct {
	Owner, N uint32
}

// A Table reads whole maps (in batches, in chunks smaller than a bucket,
// or key by key), forgets an owner without reading anyone else's entries,
// and sweeps the entries of owners no longer live.
func TestTable(t *testing.T) {
	testutil.RequireRoot(t)
	for _, tc := range []struct {
		name    string
		noBatch bool
		chunk   int
	}{{"batch", false, 1024}, {"batch, chunk of one", false, 1}, {"key by key", true, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			m := hashMap(t, 8, 16384)
			put := func(owner, n uint32) {
				if err := m.Put(ownedKey{owner, n}, uint64(owner)<<32|uint64(n)); err != nil {
					t.Fatal(err)
				}
			}
			for n := range uint32(10000) {
				put(1, n)
			}
			for n := range uint32(5) {
				put(2, n)
			}
			tab := NewTable(m, func(k ownedKey, _ uint64) uint32 { return k.Owner })
			tab.noBatch = tc.noBatch
			if tc.chunk > 0 {
				tab.chunk = tc.chunk
			}
			all := func(uint32) bool { return true }
			got, err := tab.Read(all)
			if err != nil {
				t.Fatal(err)
			}
			byOwner := func(got map[uint32][]Entry[ownedKey, uint64]) map[uint32]int {
				n := map[uint32]int{}
				for o, g := range got {
					for _, e := range g {
						if e.Key.Owner != o || e.Val != uint64(o)<<32|uint64(e.Key.N) {
							t.Fatalf("owner %d: entry %+v", o, e)
						}
						n[o]++
					}
				}
				return n
			}
			if n := byOwner(got); n[1] != 10000 || n[2] != 5 || len(n) != 2 {
				t.Fatalf("Read: entries by owner %v", n)
			}
			if tc.chunk == 1 && tab.chunk == 1 {
				t.Error("no bucket held more than one entry: the chunk never grew")
			}
			if tab.Fetched != 10005 || len(tab.Keys(2)) != 5 {
				t.Fatalf("Read fetched %d entries and knows %d keys of owner 2, want 10005 and 5", tab.Fetched, len(tab.Keys(2)))
			}

			// Owner 2 goes: one of its entries was already deleted (by
			// the kernel, say), and it had one added since the read.
			_ = m.Delete(ownedKey{2, 1})
			put(2, 5)
			tab.Put(2, ownedKey{2, 5}, 2<<32|5)
			// An entry added for it too late for user space to know.
			put(2, 6)
			fetched := tab.Fetched
			tab.Forget(2)
			if tab.Fetched != fetched {
				t.Errorf("Forget read %d entries", tab.Fetched-fetched)
			}
			for _, n := range []uint32{0, 4, 5} {
				var v uint64
				if m.Lookup(ownedKey{2, n}, &v) == nil {
					t.Errorf("entry %d of owner 2 left after Forget", n)
				}
			}

			// The next read drops what Forget could not know.
			got, err = tab.Read(func(o uint32) bool { return o == 1 })
			if err != nil {
				t.Fatal(err)
			}
			var v uint64
			if n := byOwner(got); n[1] != 10000 || len(n) != 1 || m.Lookup(ownedKey{2, 6}, &v) == nil {
				t.Errorf("after the sweep: entries by owner %v, owner 2's late entry still there: %v", n, m.Lookup(ownedKey{2, 6}, &v) == nil)
			}
			n := 0
			var k ownedKey
			for it := m.Iterate(); it.Next(&k, &v); {
				n++
			}
			if n != 10000 {
				t.Errorf("%d entries in the map after the sweep, want 10000", n)
			}
		})
	}
}

func TestDeleteWhere(t *testing.T) {
	testutil.RequireRoot(t)
	m := hashMap(t, 4, 64)
	for k := uint32(1); k <= 40; k++ {
		if err := m.Put(k, uint64(k)*10); err != nil {
			t.Fatal(err)
		}
	}
	if err := DeleteWhere(m, func(k uint32, v uint64) bool { return k%2 == 0 && v == uint64(k)*10 }); err != nil {
		t.Fatal(err)
	}
	var v uint64
	for k := uint32(1); k <= 40; k++ {
		if gone := m.Lookup(k, &v) != nil; gone != (k%2 == 0) {
			t.Errorf("key %d: deleted %v", k, gone)
		}
	}
}

// A pid reused before the next read must not inherit what the kernel added
// for the process of that number after its last read; any other new owner
// costs nothing.
func TestTableClaim(t *testing.T) {
	testutil.RequireRoot(t)
	m := hashMap(t, 8, 64)
	tab := NewTable(m, func(k ownedKey, _ uint64) uint32 { return k.Owner })
	all := func(uint32) bool { return true }
	for _, k := range []ownedKey{{1, 0}, {2, 0}} {
		if err := m.Put(k, uint64(0)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tab.Read(all); err != nil {
		t.Fatal(err)
	}
	if err := m.Put(ownedKey{2, 1}, uint64(0)); err != nil { // after the read
		t.Fatal(err)
	}
	tab.Forget(2)
	fetched := tab.Fetched
	if err := tab.Claim(3, all); err != nil || tab.Fetched != fetched {
		t.Errorf("claiming a new owner: %v, %d entries read", err, tab.Fetched-fetched)
	}
	if err := tab.Claim(2, all); err != nil {
		t.Fatal(err)
	}
	var v uint64
	if m.Lookup(ownedKey{2, 1}, &v) == nil {
		t.Error("the forgotten owner's late entry is still there after Claim")
	}
	if m.Lookup(ownedKey{1, 0}, &v) != nil {
		t.Error("Claim deleted another owner's entry")
	}
}

// Members.Memory is what the kernel charges for the maps: more for a bigger
// map, 0 once closed.
func TestMembersMemory(t *testing.T) {
	testutil.RequireRoot(t)
	small, big := hashMap(t, 4, 16), hashMap(t, 4, 1<<16)
	s, b := Members{Maps: []*ebpf.Map{small}}.Memory(), Members{Maps: []*ebpf.Map{big}}.Memory()
	if s == 0 || b <= s {
		t.Errorf("memory of a 16-entry map %d, of a 65536-entry one %d", s, b)
	}
	if both := (Members{Maps: []*ebpf.Map{small, big}}).Memory(); both != s+b {
		t.Errorf("both maps %d, want %d", both, s+b)
	}
	big.Close()
	if n := (Members{Maps: []*ebpf.Map{big}}).Memory(); n != 0 {
		t.Errorf("a closed map: %d", n)
	}
}
