package schedtrack

//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type thread_sched -type proc_sched -type err_kind sched ../../bpf/sched.bpf.c -- -I../../bpf -O2 -g -Wall
