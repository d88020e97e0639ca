/* Shared by every BPF object: the error counters, the kernel's features,
 * per-thread state and the kernel reads several objects make. Each object
 * gets its own errors map, which the Go side reads for each object it
 * loads; the processes watched are in tracked.h. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "arch.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* What the running kernel offers, set by user space before loading from a
 * real probe of each (pkg/bpfobj, Kernel). The verifier only walks the
 * branch a constant selects, so one object carries the code for every
 * kernel from 5.10 on: a helper a kernel lacks may sit in a branch it never
 * takes. bpf_get_current_task_btf comes with task storage (5.11), and
 * bpf_task_pt_regs (5.15) needs it. */
const volatile bool have_task_storage = true;
const volatile bool have_task_pt_regs = true;

/* Reasons an event or update was lost; one per-CPU slot each, read by Go as
 * monotonic counters and never reset. */
enum err_kind {
	ERR_TABLE_FULL = 0,  /* live table update failed (map full) */
	ERR_STACK = 1,       /* a user stack could not be stored (stack map full or collision) */
	ERR_ENTRY_STATE = 2, /* per-thread entry state could not be saved */
	ERR_COUNTERS = 3,    /* per-process counters missing */
	ERR_READ_USER = 4,   /* bpf_probe_read_user failed */
	ERR_READ_KERNEL = 5, /* bpf_probe_read_kernel failed */
	ERR_RINGBUF = 6,     /* ring buffer reserve failed (buffer full) */
	ERR_SITES = 7,       /* a call site's counters could not be made (site table full, process at its cap) */
	ERR_FORKS = 8,       /* a child was not kept from its fork (fork tables full): its fds are read from /proc instead */
	ERR_OOM_SNAPSHOT = 9, /* an allocation freed after a failure could not be kept for its snapshot (table full) */
	ERR_MAX = 10,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ERR_MAX);
	__type(key, u32);
	__type(value, u64);
} errors SEC(".maps");

static __always_inline void count_err(u32 kind)
{
	u64 *n = bpf_map_lookup_elem(&errors, &kind);
	if (n)
		*n += 1;
}

/* The current task, for CO-RE reads (bpf_probe_read_kernel): works on every
 * kernel, unlike the typed pointer of bpf_get_current_task_btf. */
static __always_inline struct task_struct *current_task(void)
{
	return (struct task_struct *)bpf_get_current_task();
}

/* Per-thread state: task storage where the kernel has it (no hashing, freed
 * with the thread), else an LRU hash by thread id whose entries carry their
 * task's address, so that a thread id reused by a new thread starts from
 * init instead of a dead thread's state. Values start with that u64. */
static __always_inline void *thread_state(void *task_map, void *tid_map, const void *init, bool create)
{
	if (have_task_storage)
		return bpf_task_storage_get(task_map, bpf_get_current_task_btf(), 0,
					    create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	u32 tid = (u32)bpf_get_current_pid_tgid();
	u64 task = bpf_get_current_task();
	u64 *st = bpf_map_lookup_elem(tid_map, &tid);
	if (st && *st == task)
		return st;
	if (!create)
		return NULL;
	if (bpf_map_update_elem(tid_map, &tid, init, BPF_ANY))
		return NULL;
	st = bpf_map_lookup_elem(tid_map, &tid);
	if (st)
		*st = task;
	return st;
}

/* The file behind fd in task's table; NULL for a number out of the table or
 * not open, and for a failed read, which is counted. */
static __always_inline struct file *fd_file(struct task_struct *task, u64 fd)
{
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt || fd >= BPF_CORE_READ(fdt, max_fds))
		return NULL;
	struct file **fds = BPF_CORE_READ(fdt, fd);
	struct file *f = NULL;
	if (bpf_probe_read_kernel(&f, sizeof(f), &fds[fd])) {
		count_err(ERR_READ_KERNEL);
		return NULL;
	}
	return f;
}

/* floor(log2(v)), 0 for 0: histogram buckets without a loop. */
static __always_inline u32 log2_u32(u32 v)
{
	u32 r, shift;

	r = (v > 0xFFFF) << 4;
	v >>= r;
	shift = (v > 0xFF) << 3;
	v >>= shift;
	r |= shift;
	shift = (v > 0xF) << 2;
	v >>= shift;
	r |= shift;
	shift = (v > 0x3) << 1;
	v >>= shift;
	r |= shift;
	r |= (v >> 1);
	return r;
}

static __always_inline u32 log2_u64(u64 v)
{
	u32 hi = v >> 32;
	return hi ? log2_u32(hi) + 32 : log2_u32(v);
}
