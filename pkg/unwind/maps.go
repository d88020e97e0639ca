package unwind

import (
	"encoding/binary"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
)

// MaxFrames is UNWIND_MAX_FRAMES of bpf/unwind.h.
const MaxFrames = len(unwindUnwoundStack{}.Pcs)

// Maps are one object's maps of bpf/unwind.h; they are Tables.
type Maps struct {
	Rules, Stacks, Pending *ebpf.Map
}

// Decode reads a record of the object's unwind_requests ring buffer.
func (m Maps) Decode(raw []byte) (Request, error) {
	var r unwindUnwindRequest
	if _, err := binary.Decode(raw, binary.NativeEndian, &r); err != nil {
		return Request{}, err
	}
	return Request{
		MM: r.Mm, Hash: r.Hash, TGID: r.Tgid, StackID: r.StackId, SP: r.Sp, BP: r.Bp, Exact: r.Exact != 0,
		Max:   min(int(r.Max), MaxFrames),
		PCs:   slices.Clone(r.Pcs[:min(int(r.N), MaxFrames)]),
		Stack: slices.Clone(r.Stack[:min(int(r.Copied), len(r.Stack))]),
	}, nil
}

func (m Maps) SetRule(mm uint64, tgid uint32, addr uint64, r symbolize.Rule) error {
	return m.Rules.Update(unwindUnwindKey{Mm: mm, Pc: addr, Tgid: tgid},
		unwindUnwindRule{Cfa: r.CFA, Rbp: r.RBP, CfaOff: r.CFAOffset, RbpOff: r.RBPOffset}, ebpf.UpdateAny)
}

func (m Maps) SetStack(id int32, pcs []uint64, truncated bool) error {
	s := unwindUnwoundStack{N: uint32(min(len(pcs), MaxFrames))}
	copy(s.Pcs[:], pcs)
	if truncated {
		s.Truncated = 1
	}
	return m.Stacks.Update(uint32(id), s, ebpf.UpdateAny)
}

// Stack returns the addresses of a stack id, innermost first.
func (m Maps) Stack(id int32) ([]uint64, error) {
	var s unwindUnwoundStack
	if err := m.Stacks.Lookup(uint32(id), &s); err != nil {
		return nil, err
	}
	return slices.Clone(s.Pcs[:min(int(s.N), MaxFrames)]), nil
}

func (m Maps) Done(mm, hash uint64) error {
	return m.Pending.Delete(unwindUnwindPendingKey{Mm: mm, Hash: hash})
}

// DropRules deletes the rules of the processes for which tracked is false
// (called with the owner's state, every few polls).
func (m Maps) DropRules(tracked func(tgid uint32) bool) error {
	return bpfobj.DeleteWhere(m.Rules, func(key unwindUnwindKey, _ unwindUnwindRule) bool { return !tracked(key.Tgid) })
}
