package discover

//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type discover_event -type discover_why -type err_kind discover ../../bpf/discover.bpf.c -- -I../../bpf -O2 -g -Wall
