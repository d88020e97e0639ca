package fdtrack

import (
	"encoding/binary"
	"log/slog"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/unwind"
)

// Opening stacks are unwound at the syscall in the kernel (bpf/unwind.h)
// with rules learnt from the binaries' .eh_frame (pkg/unwind serves the
// kernel's requests).

// maxFrames is UNWIND_MAX_FRAMES of bpf/unwind.h.
const maxFrames = len(fdUnwoundStack{}.Pcs)

// unwindTables are the fd object's maps of bpf/unwind.h.
type unwindTables struct{ maps *fdMaps }

func (u unwindTables) Decode(raw []byte) (unwind.Request, error) {
	var r fdUnwindRequest
	if _, err := binary.Decode(raw, binary.NativeEndian, &r); err != nil {
		return unwind.Request{}, err
	}
	return unwind.Request{
		MM: r.Mm, Hash: r.Hash, TGID: r.Tgid, StackID: r.StackId, SP: r.Sp, BP: r.Bp, Exact: r.Exact != 0,
		Max:   min(int(r.Max), maxFrames),
		PCs:   slices.Clone(r.Pcs[:min(int(r.N), maxFrames)]),
		Stack: slices.Clone(r.Stack[:min(int(r.Copied), len(r.Stack))]),
	}, nil
}

func (u unwindTables) SetRule(mm uint64, tgid uint32, addr uint64, r symbolize.Rule) error {
	return u.maps.UnwindRules.Update(fdUnwindKey{Mm: mm, Pc: addr, Tgid: tgid},
		fdUnwindRule{Cfa: r.CFA, Rbp: r.RBP, CfaOff: r.CFAOffset, RbpOff: r.RBPOffset}, ebpf.UpdateAny)
}

func (u unwindTables) SetStack(id int32, pcs []uint64, truncated bool) error {
	s := fdUnwoundStack{N: uint32(min(len(pcs), maxFrames))}
	copy(s.Pcs[:], pcs)
	if truncated {
		s.Truncated = 1
	}
	return u.maps.UnwoundStacks.Update(uint32(id), s, ebpf.UpdateAny)
}

func (u unwindTables) Stack(id int32) ([]uint64, error) {
	var s fdUnwoundStack
	if err := u.maps.UnwoundStacks.Lookup(uint32(id), &s); err != nil {
		return nil, err
	}
	return slices.Clone(s.Pcs[:min(int(s.N), maxFrames)]), nil
}

func (u unwindTables) Done(mm, hash uint64) error {
	return u.maps.UnwindPending.Delete(fdUnwindPendingKey{Mm: mm, Hash: hash})
}

// dropRules deletes the unwind rules of processes no longer tracked.
func (t *Tracker) dropRules() {
	err := bpfobj.DeleteWhere(t.maps.UnwindRules, func(key fdUnwindKey, _ fdUnwindRule) bool {
		_, ok := t.started[key.Tgid]
		return !ok
	})
	if err != nil {
		slog.Warn("listing fd unwind rules", "err", err)
	}
}

// Stack returns the user-space addresses of a stack id, innermost first:
// the instruction pointer at the syscall, then the return addresses.
func (t *Tracker) Stack(id int32) ([]uint64, error) {
	return unwindTables{&t.maps}.Stack(id)
}
