package unwind

// Only the types are used: pkg/stacks creates the maps of bpf/unwind.h
// once for every object that walks stacks (cuda, fd).
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type unwind_key -type unwind_rule -type unwind_mapping_key -type unwind_mapping -type unwound_stack -type unwind_request -type unwind_pending_key unwind ../../bpf/unwind_types.bpf.c -- -I../../bpf -O2 -g -Wall -mcpu=v3
