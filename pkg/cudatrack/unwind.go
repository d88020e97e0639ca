package cudatrack

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
)

// Stacks are unwound at the entry of each allocation call in the kernel
// (bpf/unwind.h) with rules learnt here from the binaries' .eh_frame: the
// kernel asks, through the unwind_requests ring buffer, for every frame it
// has no rule for, and this side finishes that stack and teaches the kernel
// the rules it used.

// maxFrames is UNWIND_MAX_FRAMES of bpf/unwind.h.
const maxFrames = len(cudaUnwoundStack{}.Pcs)

// requestIDs is UNWIND_REQUEST_IDS: stack ids from it up were handed to a
// request.
const requestIDs = 0x40000000

// serveUnwinds answers the kernel's unwind requests until the reader is
// closed.
func (t *Tracker) serveUnwinds(r *ringbuf.Reader) {
	defer close(t.unwindDone)
	var (
		rec ringbuf.Record
		req cudaUnwindRequest
	)
	for {
		if err := r.ReadInto(&rec); err != nil {
			if errors.Is(err, ringbuf.ErrClosed) {
				return
			}
			slog.Warn("reading cuda unwind requests", "err", err)
			continue
		}
		if _, err := binary.Decode(rec.RawSample, binary.NativeEndian, &req); err != nil {
			slog.Warn("decoding a cuda unwind request", "err", err)
			continue
		}
		t.unwind(&req)
	}
}

// unwind finishes the stack of one request and stores the rules it used.
func (t *Tracker) unwind(req *cudaUnwindRequest) {
	n := min(int(req.N), maxFrames)
	if n == 0 {
		return
	}
	copied := min(int(req.Copied), len(req.Stack))
	more, rules := t.sym.UnwindCopy(int(req.Tgid), symbolize.StackCopy{
		PC: req.Pcs[n-1], SP: req.Sp, BP: req.Bp, Stack: req.Stack[:copied],
	}, maxFrames-n)
	for addr, r := range rules {
		key := cudaUnwindKey{Mm: req.Mm, Pc: addr, Tgid: req.Tgid}
		val := cudaUnwindRule{Cfa: r.CFA, Rbp: r.RBP, CfaOff: r.CFAOffset, RbpOff: r.RBPOffset}
		if err := t.maps.UnwindRules.Update(key, val, ebpf.UpdateAny); err != nil {
			// Full: the kernel keeps asking for these frames and each
			// request still gets its stack, at a copy's cost.
			t.rulesLost.Add(1)
		}
	}
	s := cudaUnwoundStack{N: uint32(n + len(more))}
	copy(s.Pcs[:], req.Pcs[:n])
	copy(s.Pcs[n:], more)
	if int(s.N) == maxFrames {
		s.Truncated = 1
	}
	if err := t.maps.UnwoundStacks.Update(uint32(req.StackId), s, ebpf.UpdateAny); err != nil {
		t.stacksLost.Add(1)
	}
}

// requestWait bounds the wait for a request in flight: the kernel sent it
// before the call it belongs to returned, and serving one takes well under
// a millisecond once the files are open.
const requestWait = 100 * time.Millisecond

// canonical returns the id under which a stack is first known. The first
// allocation of a site gets a request's id and later ones the id of the
// kernel's own walk, for the same frames: one site must be one id. An id
// whose stack is not there (gone, or a request not served in time) is
// returned as is and looked at again next time.
func (t *Tracker) canonical(id int32) int32 {
	if id < 0 {
		return id
	}
	if c, ok := t.canon[id]; ok {
		return c
	}
	pcs, err := t.Stack(id)
	for deadline := time.Now().Add(requestWait); err != nil && id >= requestIDs && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		pcs, err = t.Stack(id)
	}
	if err != nil {
		return id
	}
	b := make([]byte, 0, 8*len(pcs))
	for _, pc := range pcs {
		b = binary.NativeEndian.AppendUint64(b, pc)
	}
	c, ok := t.byFrames[string(b)]
	if !ok {
		c = id
		t.byFrames[string(b)] = id
	}
	t.canon[id] = c
	return c
}

// forgetStacks drops the canonical ids of stacks no longer in the map.
func (t *Tracker) forgetStacks(kept func(id uint32) bool) {
	for id := range t.canon {
		if !kept(uint32(id)) {
			delete(t.canon, id)
		}
	}
	for k, id := range t.byFrames {
		if !kept(uint32(id)) {
			delete(t.byFrames, k)
		}
	}
}

// dropRules deletes the unwind rules of processes no longer tracked.
func (t *Tracker) dropRules() {
	err := bpfobj.DeleteWhere(t.maps.UnwindRules, func(key cudaUnwindKey, _ cudaUnwindRule) bool {
		_, ok := t.procs[int(key.Tgid)]
		return !ok
	})
	if err != nil {
		slog.Warn("listing cuda unwind rules", "err", err)
	}
}

// Stack returns the user-space return addresses of a stack id, innermost
// first: the caller of the CUDA function first.
func (t *Tracker) Stack(id int32) ([]uint64, error) {
	var s cudaUnwoundStack
	if err := t.maps.UnwoundStacks.Lookup(uint32(id), &s); err != nil {
		return nil, err
	}
	return slices.Clone(s.Pcs[:min(int(s.N), maxFrames)]), nil
}

// unwindLost counts what this side could not store, by lost-event source.
func (t *Tracker) unwindLost(out map[string]uint64) {
	out["cuda_unwind_rules"] = t.rulesLost.Load()
	out["cuda_stack"] += t.stacksLost.Load()
}
