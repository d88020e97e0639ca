package cudatrack

// Stacks are unwound at the entry of each allocation call in the kernel
// (bpf/unwind.h) with rules learnt from the binaries' .eh_frame; pkg/stacks
// serves the kernel's requests for every object.

// Stack returns the user-space return addresses of a stack id, innermost
// first: the caller of the CUDA function first.
func (t *Tracker) Stack(id int32) ([]uint64, error) {
	return t.stacks.Stack(id)
}
