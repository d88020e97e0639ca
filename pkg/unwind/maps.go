package unwind

import (
	"encoding/binary"
	"math/bits"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
)

// MaxFrames is UNWIND_MAX_FRAMES of bpf/unwind.h.
const MaxFrames = len(unwindUnwoundStack{}.Pcs)

// Maps are one object's maps of bpf/unwind.h; they are Tables.
type Maps struct {
	Rules, Mappings, Stacks, Pending *ebpf.Map
}

// Decode reads a record of the object's unwind_requests ring buffer.
func (m Maps) Decode(raw []byte) (Request, error) {
	var r unwindUnwindRequest
	if _, err := binary.Decode(raw, binary.NativeEndian, &r); err != nil {
		return Request{}, err
	}
	return Request{
		MM: r.Mm, ASID: r.Asid, Hash: r.Hash, TGID: r.Tgid, StackID: r.StackId, SP: r.Sp, BP: r.Bp, LR: r.Lr,
		Exact: r.Exact != 0,
		Max:   min(int(r.Max), MaxFrames),
		PCs:   slices.Clone(r.Pcs[:min(int(r.N), MaxFrames)]),
		Stack: slices.Clone(r.Stack[:min(int(r.Copied), len(r.Stack))]),
	}, nil
}

func (m Maps) SetRule(file, at uint64, r symbolize.Rule) error {
	return m.Rules.Update(unwindUnwindKey{File: file, At: at},
		unwindUnwindRule{Cfa: r.CFA, Rbp: r.RBP, Ra: r.RA, CfaOff: r.CFAOffset, RbpOff: r.RBPOffset, RaOff: r.RAOffset},
		ebpf.UpdateAny)
}

// mappingKey is b as the trie has it: big-endian after the prefix length
// (byte-reversed here: the objects are x86's, little-endian).
func mappingKey(b Block) unwindUnwindMappingKey {
	return unwindUnwindMappingKey{Prefixlen: uint32(32 + 64 + b.Bits), Tgid: bits.ReverseBytes32(b.TGID),
		Asid: bits.ReverseBytes64(b.ASID), Addr: bits.ReverseBytes64(b.Addr)}
}

func (m Maps) SetMapping(b Block, c symbolize.CodeMapping) error {
	return m.Mappings.Update(mappingKey(b), unwindUnwindMapping{File: c.File, Bias: c.Bias, Start: c.Start, End: c.End}, ebpf.UpdateAny)
}

func (m Maps) DeleteMapping(b Block) error {
	return m.Mappings.Delete(mappingKey(b))
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

// DropRules deletes the rules of the code for which live is false.
func (m Maps) DropRules(live func(file uint64) bool) error {
	return bpfobj.DeleteWhere(m.Rules, func(key unwindUnwindKey, _ unwindUnwindRule) bool { return !live(key.File) })
}
