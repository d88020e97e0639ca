// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
/* fd tracking: a live table of every fd a tracked process holds, keyed by
 * (tgid, fd), with when and from which user stack it was opened.
 *
 * Only syscall tracepoints are used (no kprobes: not available everywhere).
 * Syscalls that return a new fd of a fixed kind need only their exit
 * tracepoint; dup/fcntl/pipe/socketpair keep per-thread entry state. fds that
 * vanish without a close syscall (close_range, close-on-exec at exec) bump a
 * per-process resync counter so user space reconciles with /proc; fds of an
 * exited process are dropped by user space. */
#include "common.h"

enum fd_kind {
	FD_OTHER = 0,
	FD_FILE,
	FD_SOCKET,
	FD_PIPE,
	FD_EVENTFD,
	FD_EPOLL,
	FD_TIMERFD,
	FD_SIGNALFD,
	FD_INOTIFY,
	FD_PIDFD,
	FD_MEMFD,
	FD_KIND_MAX,
};

struct fd_key {
	u32 tgid;
	s32 fd;
};

#define SCAN_WORDS 32
/* Largest distance from the stack pointer to the innermost frame pointer we
 * believe: a syscall wrapper's own frame is small. */
#define FP_MAX_FRAME (64 * 1024)
#define MAX_CALLERS 4
#define MAX_TEXT_RANGES 16

/* fd_info.stack_id when the frame-pointer walk was skipped: see add_fd. */
#define STACK_NO_FP -2

struct fd_info {
	u64 open_ns;  /* bpf_ktime_get_ns at open; 0 when seeded from /proc */
	u64 ip;       /* user instruction pointer at the syscall */
	s32 stack_id; /* user stack of the opening syscall; -1 unknown, STACK_NO_FP */
	u8 kind;      /* enum fd_kind */
	u8 pad[3];
	/* Words near the user stack pointer that point into executable code:
	 * candidate return addresses. glibc has no frame pointers, so the
	 * frame-pointer stack alone loses the caller of open(). */
	u64 callers[MAX_CALLERS];
};

/* Executable mappings of a tracked process, kept current by user space. */
struct text_ranges {
	u64 start[MAX_TEXT_RANGES];
	u64 end[MAX_TEXT_RANGES];
	u32 n;
	u32 pad;
};

/* Per-process totals since tracking began; per-CPU so no atomics are needed.
 * User space creates the entry when it starts tracking a process. */
struct fd_counts {
	u64 opened[FD_KIND_MAX];
	u64 closed[FD_KIND_MAX];
	u64 resyncs; /* fds vanished without close(): reconcile with /proc */
};

/* Saved at syscall entry for the syscalls whose exit needs an argument. */
struct fd_entry {
	s32 fd;  /* source fd of dup/dup2/dup3/fcntl */
	u32 pad;
	u64 ptr; /* user pointer to int[2] of pipe/pipe2/socketpair */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); /* resized from Go (--max-fds) */
	__type(key, struct fd_key);
	__type(value, struct fd_info);
} fd_table SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct fd_counts);
} fd_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u32); /* tid */
	__type(value, struct fd_entry);
} fd_entries SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct text_ranges);
} text_map SEC(".maps");

struct scan {
	u64 w[SCAN_WORDS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct scan);
} scan_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_STACK_TRACE);
	__uint(max_entries, 16384);
	__uint(key_size, sizeof(u32));
	__uint(value_size, 127 * sizeof(u64));
} fd_stacks SEC(".maps");

/* Force the shared structs into BTF so bpf2go can generate them. */
const struct fd_info *unused_fd_info __attribute__((unused));
const struct fd_counts *unused_fd_counts __attribute__((unused));
const struct fd_key *unused_fd_key __attribute__((unused));
const struct text_ranges *unused_text_ranges __attribute__((unused));
const enum fd_kind *unused_fd_kind __attribute__((unused));
const enum err_kind *unused_err_kind __attribute__((unused));

static __always_inline void count_fd(u32 tgid, u8 kind, bool opened)
{
	struct fd_counts *c = bpf_map_lookup_elem(&fd_counters, &tgid);
	if (!c) {
		count_err(ERR_COUNTERS);
		return;
	}
	/* Compare and index through one register the verifier can bound. */
	u32 k = kind;
	asm volatile("" : "+r"(k));
	if (k >= FD_KIND_MAX)
		return;
	if (opened)
		c->opened[k]++;
	else
		c->closed[k]++;
}

/* A global function is verified once, not once per call site and loop
 * iteration: this keeps loading fast. */
__noinline int in_text(const struct text_ranges *r, u64 w)
{
	if (!r)
		return 0;
	for (u32 i = 0; i < MAX_TEXT_RANGES; i++) {
		if (i >= r->n)
			break;
		if (w >= r->start[i] && w < r->end[i])
			return true;
	}
	return false;
}

/* Fills info->callers with the first words above the user stack pointer that
 * point into the process's code. User space keeps those that follow a call
 * instruction. */
static __always_inline void scan_callers(u32 tgid, u64 sp, struct fd_info *info)
{
	const struct text_ranges *r = bpf_map_lookup_elem(&text_map, &tgid);
	u32 zero = 0;
	struct scan *sc = bpf_map_lookup_elem(&scan_scratch, &zero);
	if (!r || !sc)
		return;
	if (bpf_probe_read_user(sc->w, sizeof(sc->w), (void *)sp)) {
		count_err(ERR_READ_USER);
		return;
	}
	u32 n = 0;
	u64 lo = r->start[0], hi = r->end[(r->n - 1) & (MAX_TEXT_RANGES - 1)];
	for (u32 i = 0; i < SCAN_WORDS; i++) {
		u64 w = sc->w[i];
		/* Most words (small integers, stack and heap pointers) fall
		 * outside all code: reject them without walking the ranges. */
		if (w < lo || w >= hi || !in_text(r, w))
			continue;
		info->callers[n & (MAX_CALLERS - 1)] = w;
		if (++n >= MAX_CALLERS)
			break;
	}
}

/* Records a new fd. An existing entry for the same number was replaced
 * (dup2/dup3) or closed by a path we did not see, so it counts as closed. */
static __always_inline void add_fd(void *ctx, u32 tgid, s32 fd, u8 kind)
{
	struct fd_key key = { .tgid = tgid, .fd = fd };
	struct fd_info *old = bpf_map_lookup_elem(&fd_table, &key);
	if (old)
		count_fd(tgid, old->kind, false);

	struct fd_info info = {
		.open_ns = bpf_ktime_get_ns(),
		.kind = kind,
	};
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	u64 sp = BPF_CORE_READ(regs, sp), bp = BPF_CORE_READ(regs, bp);
	info.ip = BPF_CORE_READ(regs, ip);
	/* A frame pointer that does not point a little above the stack pointer
	 * means the code at the syscall uses rbp for data (glibc's wrappers do):
	 * the walk would give the instruction pointer and noise, so skip it and
	 * keep the instruction pointer alone. */
	if (bp > sp && bp - sp < FP_MAX_FRAME) {
		info.stack_id = bpf_get_stackid(ctx, &fd_stacks, BPF_F_USER_STACK);
		if (info.stack_id < 0)
			count_err(ERR_STACK);
	} else {
		info.stack_id = STACK_NO_FP;
	}
	scan_callers(tgid, sp, &info);
	if (bpf_map_update_elem(&fd_table, &key, &info, BPF_ANY)) {
		count_err(ERR_TABLE_FULL);
		return;
	}
	count_fd(tgid, kind, true);
}

static __always_inline u8 kind_of(u32 tgid, s32 fd)
{
	struct fd_key key = { .tgid = tgid, .fd = fd };
	struct fd_info *info = bpf_map_lookup_elem(&fd_table, &key);
	return info ? info->kind : FD_OTHER;
}

/* Syscalls returning one new fd of a known kind: the exit tracepoint is enough. */
#define FD_EXIT(name, kind)                                                   \
	SEC("tracepoint/syscalls/sys_exit_" #name)                            \
	int exit_##name(struct trace_event_raw_sys_exit *ctx)                 \
	{                                                                     \
		u32 tgid = tracked_tgid();                                    \
		if (!tgid || ctx->ret < 0)                                    \
			return 0;                                             \
		add_fd(ctx, tgid, (s32)ctx->ret, kind);                       \
		return 0;                                                     \
	}

FD_EXIT(open, FD_FILE)
FD_EXIT(openat, FD_FILE)
FD_EXIT(openat2, FD_FILE)
FD_EXIT(creat, FD_FILE)
FD_EXIT(open_by_handle_at, FD_FILE)
FD_EXIT(socket, FD_SOCKET)
FD_EXIT(accept, FD_SOCKET)
FD_EXIT(accept4, FD_SOCKET)
FD_EXIT(eventfd, FD_EVENTFD)
FD_EXIT(eventfd2, FD_EVENTFD)
FD_EXIT(epoll_create, FD_EPOLL)
FD_EXIT(epoll_create1, FD_EPOLL)
FD_EXIT(memfd_create, FD_MEMFD)
FD_EXIT(timerfd_create, FD_TIMERFD)
FD_EXIT(signalfd, FD_SIGNALFD)
FD_EXIT(signalfd4, FD_SIGNALFD)
FD_EXIT(inotify_init, FD_INOTIFY)
FD_EXIT(inotify_init1, FD_INOTIFY)
FD_EXIT(pidfd_open, FD_PIDFD)
FD_EXIT(pidfd_getfd, FD_OTHER)

static __always_inline void save_entry(s32 fd, u64 ptr)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct fd_entry e = { .fd = fd, .ptr = ptr };
	if (bpf_map_update_elem(&fd_entries, &tid, &e, BPF_ANY))
		count_err(ERR_ENTRY_STATE);
}

/* Takes the entry state saved by this thread; false if there is none. */
static __always_inline bool take_entry(struct fd_entry *out)
{
	u32 tid = (u32)bpf_get_current_pid_tgid();
	struct fd_entry *e = bpf_map_lookup_elem(&fd_entries, &tid);
	if (!e)
		return false;
	*out = *e;
	bpf_map_delete_elem(&fd_entries, &tid);
	return true;
}

/* dup family: the copy has the kind of its source. */
#define DUP_ENTER(name)                                                       \
	SEC("tracepoint/syscalls/sys_enter_" #name)                           \
	int enter_##name(struct trace_event_raw_sys_enter *ctx)               \
	{                                                                     \
		if (tracked_tgid())                                           \
			save_entry((s32)ctx->args[0], 0);                     \
		return 0;                                                     \
	}                                                                     \
	SEC("tracepoint/syscalls/sys_exit_" #name)                            \
	int exit_##name(struct trace_event_raw_sys_exit *ctx)                 \
	{                                                                     \
		u32 tgid = tracked_tgid();                                    \
		struct fd_entry e;                                            \
		if (!tgid || !take_entry(&e) || ctx->ret < 0 ||              \
		    (s32)ctx->ret == e.fd)                                    \
			return 0;                                             \
		add_fd(ctx, tgid, (s32)ctx->ret, kind_of(tgid, e.fd));        \
		return 0;                                                     \
	}

DUP_ENTER(dup)
DUP_ENTER(dup2)
DUP_ENTER(dup3)

#define F_DUPFD 0
#define F_DUPFD_CLOEXEC 1030

SEC("tracepoint/syscalls/sys_enter_fcntl")
int enter_fcntl(struct trace_event_raw_sys_enter *ctx)
{
	u64 cmd = ctx->args[1];
	if ((cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && tracked_tgid())
		save_entry((s32)ctx->args[0], 0);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_fcntl")
int exit_fcntl(struct trace_event_raw_sys_exit *ctx)
{
	u32 tgid = tracked_tgid();
	struct fd_entry e;
	if (!tgid || !take_entry(&e) || ctx->ret < 0)
		return 0;
	add_fd(ctx, tgid, (s32)ctx->ret, kind_of(tgid, e.fd));
	return 0;
}

/* pipe, pipe2 and socketpair return two fds through a user pointer. */
#define PAIR(name, argidx, kind)                                              \
	SEC("tracepoint/syscalls/sys_enter_" #name)                           \
	int enter_##name(struct trace_event_raw_sys_enter *ctx)               \
	{                                                                     \
		if (tracked_tgid())                                           \
			save_entry(-1, ctx->args[argidx]);                    \
		return 0;                                                     \
	}                                                                     \
	SEC("tracepoint/syscalls/sys_exit_" #name)                            \
	int exit_##name(struct trace_event_raw_sys_exit *ctx)                 \
	{                                                                     \
		u32 tgid = tracked_tgid();                                    \
		struct fd_entry e;                                            \
		s32 fds[2];                                                   \
		if (!tgid || !take_entry(&e) || ctx->ret != 0)               \
			return 0;                                             \
		if (bpf_probe_read_user(fds, sizeof(fds), (void *)e.ptr)) {   \
			count_err(ERR_READ_USER);                             \
			return 0;                                             \
		}                                                             \
		add_fd(ctx, tgid, fds[0], kind);                              \
		add_fd(ctx, tgid, fds[1], kind);                              \
		return 0;                                                     \
	}

PAIR(pipe, 0, FD_PIPE)
PAIR(pipe2, 0, FD_PIPE)
PAIR(socketpair, 3, FD_SOCKET)

/* close releases the fd even when it returns an error (EINTR, EIO), so the
 * entry is dropped at entry; EBADF simply finds nothing. */
SEC("tracepoint/syscalls/sys_enter_close")
int enter_close(struct trace_event_raw_sys_enter *ctx)
{
	u32 tgid = tracked_tgid();
	if (!tgid)
		return 0;
	struct fd_key key = { .tgid = tgid, .fd = (s32)ctx->args[0] };
	struct fd_info *info = bpf_map_lookup_elem(&fd_table, &key);
	if (!info)
		return 0;
	u8 kind = info->kind;
	if (bpf_map_delete_elem(&fd_table, &key) == 0)
		count_fd(tgid, kind, false);
	return 0;
}

static __always_inline void request_resync(u32 tgid)
{
	struct fd_counts *c = bpf_map_lookup_elem(&fd_counters, &tgid);
	if (c)
		c->resyncs++;
	else
		count_err(ERR_COUNTERS);
}

/* close_range may drop any number of fds: let user space reconcile. */
SEC("tracepoint/syscalls/sys_exit_close_range")
int exit_close_range(struct trace_event_raw_sys_exit *ctx)
{
	u32 tgid = tracked_tgid();
	if (tgid && ctx->ret == 0)
		request_resync(tgid);
	return 0;
}

/* exec closes close-on-exec fds without a syscall per fd. */
SEC("tracepoint/sched/sched_process_exec")
int fd_exec(struct trace_event_raw_sched_process_exec *ctx)
{
	u32 tgid = tracked_tgid();
	if (tgid)
		request_resync(tgid);
	return 0;
}
