/* Shared by every concern's BPF object: the tracked-process filter and the
 * error counters. Each object gets its own copy of these maps; the Go side
 * fills tracked_pids and reads errors for each object it loads. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* What the running kernel offers, set by user space before loading from a
 * real probe of each (pkg/bpfobj, Kernel). The verifier only walks the
 * branch a constant selects, so one object carries the code for every
 * kernel from 5.10 on: a helper a kernel lacks may sit in a branch it never
 * takes. bpf_get_current_task_btf comes with task storage (5.11), and
 * bpf_task_pt_regs (5.15) needs it. */
const volatile bool have_task_storage = true;
const volatile bool have_task_pt_regs = true;

/* Processes we watch, by tgid. Every program checks this before any work, so
 * untracked processes pay only one hash lookup. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, u8);
} tracked_pids SEC(".maps");

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
	ERR_MAX = 8,
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

static __always_inline bool is_tracked(u32 tgid)
{
	return bpf_map_lookup_elem(&tracked_pids, &tgid) != NULL;
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

/* Returns the current tgid if it is tracked, 0 otherwise. */
static __always_inline u32 tracked_tgid(void)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	return is_tracked(tgid) ? tgid : 0;
}
