package socktrack

//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type sock_info -type err_kind sock ../../bpf/sock.bpf.c -- -I../../bpf -O2 -g -Wall
