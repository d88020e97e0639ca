package fdtrack

// -mcpu=v3: the stack unwinder (bpf/unwind.h) numbers its requests with an
// atomic fetch-and-add (Linux 5.12).
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type fd_key -type fd_info -type fd_counts -type err_kind -type fd_kind -type fd_fail -type site_key -type site_counts -type fork_info -type fd_bitmap -type track_flag fd ../../bpf/fd.bpf.c -- -I../../bpf -O2 -g -Wall -mcpu=v3
