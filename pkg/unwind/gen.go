package unwind

// Only the types are used: the objects that walk stacks (cuda, fd) have
// their own maps of them.
//go:generate go tool bpf2go -tags linux -target bpfel -type unwind_key -type unwind_rule -type unwound_stack -type unwind_request -type unwind_pending_key unwind ../../bpf/unwind_types.bpf.c -- -I../../bpf -O2 -g -Wall -mcpu=v3 -D__TARGET_ARCH_x86
