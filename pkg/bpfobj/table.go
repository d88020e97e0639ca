package bpfobj

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Table is a hash map whose entries each belong to one process, their
// owner: read whole once a poll, forgotten one process at a time.
//
// A process coming or going must cost what that process holds, not what
// the node holds: a daemon sees ~100 process starts a second beside a
// training process with thousands of fds. So the Table keeps the last read
// by owner, with what user space put and dropped since, and forgetting an
// owner deletes just its keys. Entries the kernel added after the last read
// for an owner since forgotten stay until the next read, which deletes the
// entries of owners that are not live (or until Claim).
//
// Reads use the batch commands (a few syscalls per thousand entries, and a
// walk that deleted entries do not restart); where the kernel lacks them
// for the map's type, the per-key walk. Their buffers are kept from one
// read to the next: a poll of a table of 15 000 entries should not make
// megabytes of garbage.
//
// A Table belongs to one goroutine.
type Table[K comparable, V any] struct {
	Map   *ebpf.Map
	owner func(K, V) uint32
	// The last read by owner, with what was put and dropped since, and
	// each owner's keys as a set, made when first asked for.
	groups map[uint32][]Entry[K, V]
	keys   map[uint32]map[K]struct{}
	// Owners forgotten since the last read: some of their entries may
	// still be there.
	forgotten map[uint32]bool
	// Fetched counts the entries read from the kernel: by reads, and by
	// lookups through the Table. Tests bound the cost of a process with it.
	Fetched uint64
	noBatch bool
	chunk   int
	// Buffers of the last read, used again.
	allK []K
	allV []V
}

// Entry is one entry of a Table.
type Entry[K, V any] struct {
	Key K
	Val V
}

// NewTable wraps m, whose entries belong to the owner that owner returns.
func NewTable[K comparable, V any](m *ebpf.Map, owner func(K, V) uint32) *Table[K, V] {
	return &Table[K, V]{Map: m, owner: owner, groups: map[uint32][]Entry[K, V]{}, keys: map[uint32]map[K]struct{}{}, forgotten: map[uint32]bool{}, chunk: 1024}
}

// Read returns the entries of the owners for which live is true, by
// owner, and deletes the others' (owners forgotten, whose last entries the
// kernel added after their last read). What it returns is the Table's until
// the next read: callers must not keep it.
func (t *Table[K, V]) Read(live func(owner uint32) bool) (map[uint32][]Entry[K, V], error) {
	keys, vals, err := t.fetch()
	if err != nil {
		return nil, err
	}
	t.Fetched += uint64(len(keys))
	for o, g := range t.groups {
		t.groups[o] = g[:0]
	}
	clear(t.keys)
	clear(t.forgotten)
	var orphans []K
	for i, k := range keys {
		o := t.owner(k, vals[i])
		if !live(o) {
			orphans = append(orphans, k)
			continue
		}
		t.groups[o] = append(t.groups[o], Entry[K, V]{k, vals[i]})
	}
	for o, g := range t.groups {
		if len(g) == 0 {
			delete(t.groups, o)
		}
	}
	t.delete(orphans)
	return t.groups, nil
}

// Lookup reads one entry.
func (t *Table[K, V]) Lookup(k K) (V, bool) {
	var v V
	t.Fetched++
	return v, t.Map.Lookup(k, &v) == nil
}

// Keys returns owner's keys: those of the last read, put since and not
// dropped. The set is the Table's.
func (t *Table[K, V]) Keys(owner uint32) map[K]struct{} {
	ks := t.keys[owner]
	if ks == nil {
		g := t.groups[owner]
		ks = make(map[K]struct{}, len(g))
		for _, e := range g {
			ks[e.Key] = struct{}{}
		}
		t.keys[owner] = ks
	}
	return ks
}

// Group returns owner's entries: those of the last read, put since and not
// dropped. The slice is the Table's: not to be changed.
func (t *Table[K, V]) Group(owner uint32) []Entry[K, V] { return t.groups[owner] }

// Put records that user space inserted k for owner.
func (t *Table[K, V]) Put(owner uint32, k K, v V) {
	ks := t.Keys(owner)
	if _, ok := ks[k]; ok {
		return
	}
	ks[k] = struct{}{}
	t.groups[owner] = append(t.groups[owner], Entry[K, V]{k, v})
}

// Drop records that the keys gone of owner are no longer in the map.
func (t *Table[K, V]) Drop(owner uint32, gone map[K]bool) {
	if len(gone) == 0 {
		return
	}
	ks := t.Keys(owner)
	for k := range gone {
		delete(ks, k)
	}
	t.groups[owner] = slices.DeleteFunc(t.groups[owner], func(e Entry[K, V]) bool { return gone[e.Key] })
}

// Forget deletes owner's known keys from the map.
func (t *Table[K, V]) Forget(owner uint32) {
	ks := t.Keys(owner)
	dead := make([]K, 0, len(ks))
	for k := range ks {
		dead = append(dead, k)
	}
	delete(t.keys, owner)
	delete(t.groups, owner)
	t.forgotten[owner] = true
	t.delete(dead)
}

// Claim readies the map for a new owner, before the kernel may add its
// entries: if an owner of that number was forgotten since the last read (a
// pid reused within a poll), its leftovers would pass for the new owner's,
// so they are deleted now, by a read of the whole map. That is rare; a
// claim otherwise reads nothing.
func (t *Table[K, V]) Claim(owner uint32, live func(owner uint32) bool) error {
	if !t.forgotten[owner] {
		return nil
	}
	_, err := t.Read(func(o uint32) bool { return o != owner && live(o) })
	return err
}

// delete deletes keys, some of which the kernel may have deleted already
// (an fd closed, an allocation freed).
func (t *Table[K, V]) delete(keys []K) {
	for len(keys) > 0 && !t.noBatch {
		n, err := t.Map.BatchDelete(keys, nil)
		switch {
		case err == nil:
			return
		case errors.Is(err, ebpf.ErrNotSupported):
			t.noBatch = true
		case errors.Is(err, ebpf.ErrKeyNotExist):
			keys = keys[n+1:] // the batch stops at a missing key
		default:
			return
		}
	}
	for _, k := range keys {
		_ = t.Map.Delete(k)
	}
}

// DeleteWhere deletes the entries of a hash map for which drop is true,
// such as those of processes gone, for a map whose entries user space
// writes from another goroutine (so no Table keeps their keys).
func DeleteWhere[K comparable, V any](m *ebpf.Map, drop func(K, V) bool) error {
	t := NewTable[K, V](m, nil)
	keys, vals, err := t.fetch()
	if err != nil {
		return err
	}
	var dead []K
	for i, k := range keys {
		if drop(k, vals[i]) {
			dead = append(dead, k)
		}
	}
	t.delete(dead)
	return nil
}

// fetch reads every entry.
func (t *Table[K, V]) fetch() ([]K, []V, error) {
	if !t.noBatch {
		keys, vals, err := t.fetchBatch()
		if !errors.Is(err, ebpf.ErrNotSupported) {
			return keys, vals, err
		}
		t.noBatch = true
	}
	return t.fetchEach()
}

func (t *Table[K, V]) fetchBatch() ([]K, []V, error) {
	var cursor ebpf.MapBatchCursor
	keys, vals := t.allK[:0], t.allV[:0]
	for {
		n0 := len(keys)
		keys, vals = slices.Grow(keys, t.chunk)[:n0+t.chunk], slices.Grow(vals, t.chunk)[:n0+t.chunk]
		n, err := t.Map.BatchLookup(&cursor, keys[n0:], vals[n0:], nil)
		keys, vals = keys[:n0+n], vals[:n0+n]
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			t.allK, t.allV = keys, vals
			return keys, vals, nil
		case errors.Is(err, unix.ENOSPC):
			// One hash bucket holds more than a chunk: the kernel
			// copied nothing and the cursor stays.
			t.chunk *= 2
		case err != nil:
			return nil, nil, err
		}
	}
}

// fetchEach walks the map key by key. A walk whose current key is deleted
// restarts from the first bucket, so keys can come twice (kept once) and
// the walk can abort (tried again, three times in all).
func (t *Table[K, V]) fetchEach() ([]K, []V, error) {
	var err error
	for try := 0; try < 3; try++ {
		seen := map[K]int{}
		var (
			keys []K
			vals []V
			k    K
			v    V
		)
		it := t.Map.Iterate()
		for it.Next(&k, &v) {
			if i, ok := seen[k]; ok {
				vals[i] = v
				continue
			}
			seen[k] = len(keys)
			keys, vals = append(keys, k), append(vals, v)
		}
		if err = it.Err(); err == nil {
			return keys, vals, nil
		}
		if !errors.Is(err, ebpf.ErrIterationAborted) {
			break
		}
	}
	return nil, nil, fmt.Errorf("reading map %s: %w", t.Map, err)
}
