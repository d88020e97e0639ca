package fdtrack

//go:generate go tool bpf2go -tags linux -target bpfel -type fd_key -type fd_info -type fd_counts -type err_kind -type fd_kind -type fd_fail -type text_ranges fd ../../bpf/fd.bpf.c -- -I../../bpf -O2 -g -Wall -D__TARGET_ARCH_x86
