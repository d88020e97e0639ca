// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
/* Where the threads of a few suspected processes are as they leave the CPU:
 * the user stack (and Python frames) each thread switched off the CPU at,
 * at most every OFFCPU_EVERY_NS per thread. User space names the processes
 * (offcpu_procs: a straggling NCCL rank, only while it is suspected) and
 * attaches this object only once it suspects one, so every other context
 * switch of the machine pays one hash lookup, and none while nothing is
 * suspected. A thread that waits in a loop of short sleeps (a data loader
 * polling) keeps switching, and its latest stack says where it waits; one
 * blocked for good switched out once, and its stack from then stays.
 *
 * The user registers come from bpf_task_pt_regs (5.15): they are what the
 * thread entered the kernel with, whether it sleeps in a syscall or was
 * preempted. Without the helper no stack is taken, and user space says so.
 * The stacks are the stack service's (unwind.h, pyframes.h), so a stack id
 * means the same call site as in the fd and cuda objects. */
#include "common.h"
#include "pyframes.h"
#include "unwind.h"

#define OFFCPU_MAX_PROCS 64
#define OFFCPU_EVERY_NS 100000000ULL /* 100 ms */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, OFFCPU_MAX_PROCS);
	__type(key, u32); /* tgid */
	__type(value, u8);
} offcpu_procs SEC(".maps");

/* A thread's latest stack as it left the CPU. */
struct offcpu_thread {
	u64 at; /* bpf_ktime_get_ns() of the capture */
	u32 tgid;
	s32 stack_id; /* -1: none (no registers, or lost: counted) */
	u32 py_stack; /* 0: none */
	u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, u32); /* tid */
	__type(value, struct offcpu_thread);
} offcpu_threads SEC(".maps");

const struct offcpu_thread *unused_offcpu_thread __attribute__((unused));
const enum err_kind *unused_err_kind __attribute__((unused));

/* A global function: verified once, not once per program. */
__noinline int offcpu_unwind(u32 tgid, u64 ip, u64 sp, u64 bp, u64 lr)
{
	return unwind_user(tgid, ip, sp, bp, lr, true, UNWIND_MAX_FRAMES);
}

/* The current thread, tid of tgid, leaves the CPU. */
static __always_inline void switch_out(u32 tgid, u32 tid)
{
	if (!bpf_map_lookup_elem(&offcpu_procs, &tgid))
		return;
	u64 now = bpf_ktime_get_ns();
	struct offcpu_thread *th = bpf_map_lookup_elem(&offcpu_threads, &tid);
	if (th && th->tgid == tgid && now - th->at < OFFCPU_EVERY_NS)
		return;
	struct offcpu_thread v = { .at = now, .tgid = tgid, .stack_id = -1 };
	if (have_task_pt_regs) {
		struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
		v.stack_id = offcpu_unwind(tgid, USER_PC(regs), USER_SP(regs), USER_FP(regs), USER_LR(regs));
		v.py_stack = capture_py(tgid);
	}
	if (bpf_map_update_elem(&offcpu_threads, &tid, &v, BPF_ANY))
		count_err(ERR_TABLE_FULL);
}

/* prev is the current task at sched_switch. */
SEC("tp_btf/sched_switch")
int BPF_PROG(offcpu_switch_btf, bool preempt, struct task_struct *prev)
{
	u64 id = bpf_get_current_pid_tgid();
	switch_out(id >> 32, (u32)id);
	return 0;
}

SEC("tracepoint/sched/sched_switch")
int offcpu_switch_tp(void *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	switch_out(id >> 32, (u32)id);
	return 0;
}
