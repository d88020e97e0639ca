package stacks

// The maps shared by every object that captures stacks, and the types of
// the per-site counters each of them keeps.
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type site_key -type site_counts -type site_owner_key -type site_owner_count stacks ../../bpf/stacks.bpf.c -- -I../../bpf -O2 -g -Wall -mcpu=v3
