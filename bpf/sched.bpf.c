// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
/* Scheduler tracking: context switches per thread and per process, split as
 * the kernel splits them (nvcsw/nivcsw), and run-queue latency per process
 * (wake-up or preemption to running again, as runqlat measures it).
 *
 * Two variants of every program: tp_btf (typed arguments: the task pointers
 * and the preempt flag) and classic tracepoints for kernels where tp_btf does
 * not load. User space loads one set and deletes the other from the spec.
 * These run on every context switch and wake-up of the machine, so the
 * untracked path is kept to a bit test, and the tracked one to lookups and
 * stores into entries that live as long as their thread. */
#include "tracked.h"

#define TASK_RUNNING 0
/* What the classic sched_switch record shows as prev_state for a preempted
 * task (TASK_REPORT_MAX since 4.14; older kernels used a larger value). */
#define TASK_REPORT_MAX 0x100
#define RUNQ_SLOTS 32
/* Waits are slotted in units of 2^-30 s (~0.93 ns), not ns, so that the slot
 * bounds are powers of two of a second: exactly the buckets of a Prometheus
 * native histogram (schema 0). ns * 2^30 / 10^9 = ns * 2^21 / 5^9, which
 * fits in 64 bits below 2^43 ns (2.4 h); longer waits go to the last slot. */
#define RUNQ_UNIT_MUL 2097152ULL
#define RUNQ_UNIT_DIV 1953125ULL
#define RUNQ_UNIT_MAX_NS (1ULL << 43)
#define TRACKED_BITS (1 << 18)

/* One tracked thread: its switch-outs since tracking began, and when it last
 * became runnable (woken, or preempted while still runnable; 0 once it got
 * the CPU). Only the thread's own switch-out writes the counts, and a thread
 * runs on one CPU at a time, so plain increments are safe. runq_ts is also
 * written by wakers on other CPUs: aligned 8-byte stores do not tear, and a
 * stamp lost in a race costs one latency sample. */
struct thread_sched {
	u64 voluntary;
	u64 involuntary;
	u64 runq_ts;
	u32 tgid;
	u32 pad;
};

/* Per-process totals, per CPU. User space creates the entry when it starts
 * tracking; runq_slots[i] counts waits of [2^i, 2^(i+1)) units of 2^-30 s
 * (RUNQ_UNIT), the last slot everything longer. */
struct proc_sched {
	u64 voluntary;
	u64 involuntary;
	u64 runq_sum_ns;
	u64 runq_slots[RUNQ_SLOTS];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, u32); /* tid */
	__type(value, struct thread_sched);
} thread_counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	/* Only user space inserts; without preallocation an entry costs
	 * memory per CPU only while its process is tracked. */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, u32); /* tgid */
	__type(value, struct proc_sched);
} proc_counts SEC(".maps");

/* A quick reject in front of the tracked_pids lookup: one bit per tgid
 * modulo TRACKED_BITS, kept by user space. The verifier inlines an array
 * lookup; a hash lookup is a call and a hash. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TRACKED_BITS / 64);
	__type(key, u32);
	__type(value, u64);
} tracked_bits SEC(".maps");

/* Force the shared structs into BTF so bpf2go can generate them. */
const struct thread_sched *unused_thread_sched __attribute__((unused));
const struct proc_sched *unused_proc_sched __attribute__((unused));
const enum err_kind *unused_err_kind __attribute__((unused));

static __always_inline bool maybe_tracked(u32 tgid)
{
	u32 word = (tgid / 64) % (TRACKED_BITS / 64);
	u64 *w = bpf_map_lookup_elem(&tracked_bits, &word);
	return w && (*w >> (tgid % 64)) & 1;
}

static __always_inline bool tracked(u32 tgid)
{
	return maybe_tracked(tgid) && is_tracked(tgid);
}

/* The entry of thread tid of tracked process tgid, created if missing. An
 * entry of another process (a tid reused after an exit we did not see)
 * starts over. The thread and a waker may create it at once: the loser
 * uses the winner's. */
static __always_inline struct thread_sched *thread_entry(u32 tgid, u32 tid)
{
	struct thread_sched *th = bpf_map_lookup_elem(&thread_counts, &tid);
	if (th && th->tgid == tgid)
		return th;
	struct thread_sched init = { .tgid = tgid };
	long err = bpf_map_update_elem(&thread_counts, &tid, &init, th ? BPF_ANY : BPF_NOEXIST);
	th = bpf_map_lookup_elem(&thread_counts, &tid);
	if (err && !(th && th->tgid == tgid)) {
		count_err(ERR_TABLE_FULL);
		return NULL;
	}
	return th;
}

/* Thread tid of tracked process tgid becomes runnable. */
static __always_inline void wakeup(u32 tgid, u32 tid)
{
	struct thread_sched *th = thread_entry(tgid, tid);
	if (th)
		th->runq_ts = bpf_ktime_get_ns();
}

/* A thread of tracked process tgid leaves the CPU. runnable: it stays on the
 * run queue (preempted, or yielded), which the kernel counts as involuntary.
 * dead: its final switch; its entry goes, its counts stay in the process. */
static __always_inline void switch_out(u32 tgid, u32 tid, bool runnable, bool dead)
{
	struct proc_sched *c = bpf_map_lookup_elem(&proc_counts, &tgid);
	if (!c)
		count_err(ERR_COUNTERS);
	else if (runnable)
		c->involuntary++;
	else
		c->voluntary++;

	if (dead) {
		bpf_map_delete_elem(&thread_counts, &tid);
		return;
	}
	struct thread_sched *th = thread_entry(tgid, tid);
	if (!th)
		return;
	if (runnable) {
		th->involuntary++;
		/* Its wait for the CPU starts now (as in runqlat). */
		th->runq_ts = bpf_ktime_get_ns();
	} else {
		th->voluntary++;
	}
}

/* Thread tid gets the CPU. Only tracked threads have an entry, so where the
 * thread's process is not known (classic tracepoint) the lookup is also the
 * filter. */
static __always_inline void switch_in(u32 tid)
{
	struct thread_sched *th = bpf_map_lookup_elem(&thread_counts, &tid);
	if (!th)
		return;
	u64 ts = th->runq_ts;
	if (!ts)
		return;
	u64 now = bpf_ktime_get_ns();
	/* A waker on another CPU may stamp it after we read the clock. */
	u64 delta = now > ts ? now - ts : 0;
	u32 tgid = th->tgid;
	th->runq_ts = 0;
	struct proc_sched *c = bpf_map_lookup_elem(&proc_counts, &tgid);
	if (!c) {
		/* Untracked since it was stamped: nothing lost. */
		if (is_tracked(tgid))
			count_err(ERR_COUNTERS);
		return;
	}
	u32 slot = RUNQ_SLOTS - 1;
	if (delta < RUNQ_UNIT_MAX_NS)
		slot = log2_u64(delta * RUNQ_UNIT_MUL / RUNQ_UNIT_DIV);
	if (slot >= RUNQ_SLOTS)
		slot = RUNQ_SLOTS - 1;
	c->runq_slots[slot]++;
	c->runq_sum_ns += delta;
}

SEC("tp_btf/sched_switch")
int BPF_PROG(switch_btf, bool preempt, struct task_struct *prev, struct task_struct *next,
	     unsigned int prev_state)
{
	u32 tgid = prev->tgid;
	/* The kernel's rule: a switch is voluntary (nvcsw) when the task
	 * blocks, i.e. it was not preempted and is no longer TASK_RUNNING. */
	if (tracked(tgid))
		switch_out(tgid, prev->pid, preempt || prev_state == TASK_RUNNING, prev->exit_state != 0);
	if (maybe_tracked(next->tgid))
		switch_in(next->pid);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(wakeup_btf, struct task_struct *p)
{
	u32 tgid = p->tgid;
	if (tracked(tgid))
		wakeup(tgid, p->pid);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(wakeup_new_btf, struct task_struct *p)
{
	u32 tgid = p->tgid;
	if (tracked(tgid))
		wakeup(tgid, p->pid);
	return 0;
}

/* Classic tracepoint: prev is current. The record has no preempt flag; it
 * shows a preempted task as TASK_REPORT_MAX and a yielding one as
 * TASK_RUNNING, both of which stay runnable. */
SEC("tracepoint/sched/sched_switch")
int switch_tp(struct trace_event_raw_sched_switch *ctx)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (tracked(tgid)) {
		long state = ctx->prev_state;
		switch_out(tgid, ctx->prev_pid, state == TASK_RUNNING || state >= TASK_REPORT_MAX,
			   BPF_CORE_READ(current_task(), exit_state) != 0);
	}
	switch_in(ctx->next_pid);
	return 0;
}

/* The classic record names the woken thread but not its process: a thread is
 * known once it has an entry (from its first switch-out since tracking
 * began), so the lookup is the filter. sched_wakeup_new has the same problem
 * and never a known thread, so this variant does not trace it. */
SEC("tracepoint/sched/sched_wakeup")
int wakeup_tp(struct trace_event_raw_sched_wakeup_template *ctx)
{
	u32 tid = ctx->pid;
	struct thread_sched *th = bpf_map_lookup_elem(&thread_counts, &tid);
	if (th && is_tracked(th->tgid))
		th->runq_ts = bpf_ktime_get_ns();
	return 0;
}
