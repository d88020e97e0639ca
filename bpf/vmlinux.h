/* Kernel types for the target architecture, dumped from a kernel's BTF
 * (bpftool btf dump file /sys/kernel/btf/vmlinux format c): x86_64 from an
 * amd64 kernel, arm64 from Debian's 6.12 arm64 kernel. bpf2go defines
 * __TARGET_ARCH_<arch> for each -target; CO-RE relocates field offsets to the
 * running kernel, so the header's kernel version matters only for which
 * types and fields exist. */
#if defined(__TARGET_ARCH_x86)
#include "vmlinux_x86.h"
#elif defined(__TARGET_ARCH_arm64)
#include "vmlinux_arm64.h"
#else
#error "unsupported target architecture: build with bpf2go -target amd64 or arm64"
#endif
