package nccltrack

//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type nccl_key -type nccl_comm -type nccl_counts -type nccl_op -type nccl_how -type err_kind nccl ../../bpf/nccl.bpf.c -- -I../../bpf -O2 -g -Wall -mcpu=v3
