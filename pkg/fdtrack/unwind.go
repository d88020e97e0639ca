package fdtrack

// Opening stacks are unwound at the syscall in the kernel (bpf/unwind.h)
// with rules learnt from the binaries' .eh_frame; pkg/stacks serves the
// kernel's requests for every object.

// Stack returns the user-space addresses of a stack id, innermost first:
// the instruction pointer at the syscall, then the return addresses.
func (t *Tracker) Stack(id int32) ([]uint64, error) {
	return t.stacks.Stack(id)
}
