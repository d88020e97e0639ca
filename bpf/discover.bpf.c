// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
/* Process discovery for the node-wide daemon: tells user space, through a
 * ring buffer, when a process maps a CUDA library executable (PyTorch
 * dlopens libcudart/libcuda seconds after start) and when a process execs
 * (its executable may have the runtime linked in, or match --match-comm or
 * --all). This replaces walking /proc every interval; a slow resync in user
 * space covers lost events. Exits need no event: the pipeline checks its
 * processes every interval.
 *
 * The mmap check runs on every syscall of the node, so it is ordered by cost:
 * the syscall number, then PROT_EXEC and a file descriptor (only loaders map
 * code), and only then the file's name. */
#include "common.h"

#define PROT_EXEC 0x4

enum discover_why {
	WHY_CUDA_MAPPED = 1, /* mapped a libcuda* / libcudart* file executable */
	WHY_EXEC = 2,        /* exec'ed */
};

struct discover_event {
	u32 pid; /* tgid */
	u32 why; /* enum discover_why */
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

const struct discover_event *unused_discover_event __attribute__((unused));
const enum discover_why *unused_discover_why __attribute__((unused));
const enum err_kind *unused_err_kind __attribute__((unused));

static __always_inline void emit(u32 pid, u32 why)
{
	struct discover_event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		count_err(ERR_RINGBUF);
		return;
	}
	e->pid = pid;
	e->why = why;
	bpf_ringbuf_submit(e, 0);
}

/* The CUDA runtime and driver libraries, whatever their version suffix:
 * libcuda.so*, libcudart.so* (and libcudart-<hash>.so* in some wheels). */
static __always_inline bool cuda_name(const char *n)
{
	return n[0] == 'l' && n[1] == 'i' && n[2] == 'b' && n[3] == 'c' && n[4] == 'u' && n[5] == 'd' &&
	       n[6] == 'a' && (n[7] == '.' || (n[7] == 'r' && n[8] == 't'));
}

static __always_inline void mmap_enter(u64 prot, s64 fd)
{
	if (!(prot & PROT_EXEC) || fd < 0)
		return;
	struct task_struct *task = current_task();
	if (compat_task(task))
		return;
	struct file *f = fd_file(task, fd);
	if (!f)
		return;
	const unsigned char *name = BPF_CORE_READ(f, f_path.dentry, d_name.name);
	char n[12] = {};
	if (bpf_probe_read_kernel_str(n, sizeof(n), name) < 0) {
		count_err(ERR_READ_KERNEL);
		return;
	}
	if (cuda_name(n))
		emit(bpf_get_current_pid_tgid() >> 32, WHY_CUDA_MAPPED);
}

SEC("tp_btf/sys_enter")
int BPF_PROG(mmap_btf, struct pt_regs *regs, long id)
{
	if (id == NR_mmap)
		mmap_enter(SYSCALL_ARG2(regs), SYSCALL_ARG4(regs));
	return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(exec_btf)
{
	emit(bpf_get_current_pid_tgid() >> 32, WHY_EXEC);
	return 0;
}

/* Classic tracepoints, where tp_btf is refused. */
SEC("tracepoint/raw_syscalls/sys_enter")
int mmap_tp(struct trace_event_raw_sys_enter *ctx)
{
	if (ctx->id == NR_mmap)
		mmap_enter(ctx->args[2], (s64)ctx->args[4]);
	return 0;
}

SEC("tracepoint/sched/sched_process_exec")
int exec_tp(void *ctx)
{
	emit(bpf_get_current_pid_tgid() >> 32, WHY_EXEC);
	return 0;
}
