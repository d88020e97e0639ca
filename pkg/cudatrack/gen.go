package cudatrack

// -mcpu=v3: the live-bytes high-water mark needs atomic fetch-and-add and
// compare-and-swap (Linux 5.12); uprobe cookies already need 5.15.
//go:generate go tool bpf2go -tags linux -target amd64,arm64 -type cuda_alloc_key -type cuda_alloc -type cuda_counts -type cuda_failure -type cuda_peak -type site_key -type site_counts -type cuda_api -type cuda_shape -type err_kind -type wait_key -type wait_counts -type wait_thread_key -type wait_thread -type launch_counts cuda ../../bpf/cuda.bpf.c -- -I../../bpf -O2 -g -Wall -mcpu=v3
