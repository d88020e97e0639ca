package cudatrack

import (
	"log/slog"

	"github.com/open-autoglm/autoglm-ebpf/pkg/unwind"
)

// Stacks are unwound at the entry of each allocation call in the kernel
// (bpf/unwind.h) with rules learnt from the binaries' .eh_frame
// (pkg/unwind serves the kernel's requests).

func (t *Tracker) unwindMaps() unwind.Maps {
	return unwind.Maps{Rules: t.maps.UnwindRules, Stacks: t.maps.UnwoundStacks, Pending: t.maps.UnwindPending}
}

// dropRules deletes the unwind rules of processes no longer tracked.
func (t *Tracker) dropRules() {
	err := t.unwindMaps().DropRules(func(tgid uint32) bool {
		_, ok := t.procs[int(tgid)]
		return ok
	})
	if err != nil {
		slog.Warn("listing cuda unwind rules", "err", err)
	}
}

// Stack returns the user-space return addresses of a stack id, innermost
// first: the caller of the CUDA function first.
func (t *Tracker) Stack(id int32) ([]uint64, error) {
	return t.unwindMaps().Stack(id)
}
