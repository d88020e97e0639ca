package offcpu

// -mcpu=v3: the stack unwinder (bpf/unwind.h) numbers its requests with an
// atomic fetch-and-add (Linux 5.12).
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type offcpu_thread -type err_kind offcpu ../../bpf/offcpu.bpf.c -- -I../../bpf -O2 -g -Wall -mcpu=v3
