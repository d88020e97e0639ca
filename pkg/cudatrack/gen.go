package cudatrack

//go:generate go tool bpf2go -tags linux -target bpfel -type cuda_alloc_key -type cuda_alloc -type cuda_counts -type cuda_failure -type cuda_api -type cuda_shape -type err_kind cuda ../../bpf/cuda.bpf.c -- -I../../bpf -O2 -g -Wall -D__TARGET_ARCH_x86
