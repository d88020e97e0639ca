// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
/* fd tracking: a live table of every fd a tracked process holds, keyed by
 * (tgid, fd), with when and from which user stack it was opened.
 *
 * Two programs on the raw_syscalls tracepoints (sys_enter, sys_exit) dispatch
 * by syscall number, instead of one program per syscall tracepoint: the
 * shared logic is verified once and there are 3 links to attach and detach,
 * not 45 (loading went from 2.2 s to tens of ms, detaching from 2.4 s). They
 * run as tp_btf where the kernel allows it (no tracefs, no trace record
 * built per syscall) and as classic tracepoints otherwise; user space loads
 * one pair. Every syscall of every process reaches them, so the syscall
 * number is checked first and the tracked-pid lookup only for the ~30 that
 * create or release fds. Syscall numbers are the x86_64 ABI (the object is
 * built for x86); 32-bit compat syscalls are ignored, as the per-syscall
 * tracepoints do.
 *
 * Syscalls that return a new fd of a fixed kind need only their exit;
 * dup/fcntl/pipe/socketpair keep per-thread entry state. fds that vanish
 * without a close syscall (close_range, close-on-exec at exec) bump a
 * per-process resync counter so user space reconciles with /proc; fds of an
 * exited process are dropped by user space. Fd creation failing with EMFILE
 * or ENFILE is counted per process, with the site of the latest failure.
 * Per call site (bpf/sites.h), fds opened and closed, a close credited to
 * the site that opened the fd.
 *
 * Children of a process user space follows (TRACK_FOLLOW in its
 * tracked_pids value, tracked.h) are tracked from fork, before their first instruction: the
 * fork marks them in forks (parent, when) and makes their counters, so that
 * user space takes what they inherited from the parent's table as it knows
 * it and reads from /proc only what changed since (pkg/fdtrack). Until then
 * and after, an fd the child closes or duplicates that its own table lacks
 * is one it inherited: a close asks user space to reconcile, a dup takes
 * the kind of the parent's entry. Until user space takes it, the child's
 * open-fd bitmap is copied at fork and again at exec (fork_fds), which
 * closes its close-on-exec fds without a syscall each: user space learns
 * which fds it holds without listing /proc/PID/fd. */
#include "tracked.h"
#include "pyframes.h"
#include "sites.h"
#include "unwind.h"

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

/* Frames walked per opening site: enough to reach the caller of the C
 * library and, in Python, the interpreter's evaluation loop. */
#define FD_MAX_FRAMES 16

struct fd_info {
	u64 open_ns;  /* bpf_ktime_get_ns at open; 0 when seeded from /proc */
	s32 stack_id; /* user stack of the opening syscall, an id in unwound_stacks (bpf/unwind.h); -1 unknown */
	u8 kind;      /* enum fd_kind */
	u8 pad[3];
	u32 py_stack; /* Python frames, an id in py_stacks (bpf/pyframes.h); 0: none */
	u32 pad2;
};

/* Per-process totals since tracking began; per-CPU so no atomics are needed.
 * User space creates the entry when it starts tracking a process. */
enum fd_fail {
	FAIL_EMFILE = 0, /* the process's RLIMIT_NOFILE is reached */
	FAIL_ENFILE,     /* the system-wide file table is full */
	FAIL_MAX,
};

struct fd_counts {
	u64 opened[FD_KIND_MAX];
	u64 closed[FD_KIND_MAX];
	u64 resyncs; /* fds vanished without close(): reconcile with /proc */
	u64 failed[FAIL_MAX]; /* fd-creating syscalls that failed, by errno */
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
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory follows use, not capacity */
	__type(key, struct fd_key);
	__type(value, struct fd_info);
} fd_table SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory follows use, not capacity */
	__type(key, u32);
	__type(value, struct fd_counts);
} fd_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u32); /* tid */
	__type(value, struct fd_entry);
} fd_entries SEC(".maps");

/* Where the latest EMFILE/ENFILE failure of each tracked process came from
 * (open_ns is its time, kind what it tried to create). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct fd_info);
} fail_sites SEC(".maps");

/* A child marked at fork: which process it came from and when
 * (bpf_ktime_get_ns), so that user space takes the parent's entries older
 * than that as its inherited fds. */
struct fork_info {
	u32 parent; /* tgid */
	u32 pad;
	u64 fork_ns;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096); /* as tracked_pids */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, u32); /* the child's tgid */
	__type(value, struct fork_info);
} forks SEC(".maps");

/* The open-fd bitmap of a child not taken yet, as of at_ns: taken at fork
 * and at exec. nbits 0: not taken (a table over FORK_FDS_WORDS * 64 fds,
 * or a read that failed): user space lists /proc instead. */
#define FORK_FDS_WORDS 256 /* 16 384 fds, 2 KiB */

struct fd_bitmap {
	u64 at_ns;
	u32 nbits;
	u32 pad;
	u64 words[FORK_FDS_WORDS];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024); /* children between fork and their first poll */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, u32);
	__type(value, struct fd_bitmap);
} fork_fds SEC(".maps");

/* The value an entry of fork_fds is made from (too large for the stack). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct fd_bitmap);
} fork_fds_init SEC(".maps");

/* Force the shared structs into BTF so bpf2go can generate them. */
const struct fd_bitmap *unused_fd_bitmap __attribute__((unused));
const struct fork_info *unused_fork_info __attribute__((unused));
const struct fd_info *unused_fd_info __attribute__((unused));
const struct fd_counts *unused_fd_counts __attribute__((unused));
const struct fd_key *unused_fd_key __attribute__((unused));
const enum fd_kind *unused_fd_kind __attribute__((unused));
const enum err_kind *unused_err_kind __attribute__((unused));
const enum track_flag *unused_track_flag __attribute__((unused));
const enum fd_fail *unused_fd_fail __attribute__((unused));

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

/* Unwinds the user stack at the syscall. A global function is verified
 * once, not once per path of the syscall dispatch that reaches it: this
 * keeps loading fast. */
__noinline int fd_unwind(u32 tgid, u64 ip, u64 sp, u64 bp, u64 lr)
{
	return unwind_user(tgid, ip, sp, bp, lr, true, FD_MAX_FRAMES);
}

/* Fills the opening site of info: the user stack, unwound from the user
 * registers at the syscall (regs; NULL where the kernel cannot give them:
 * no stack) with the binaries' call-frame information (glibc's syscall
 * wrappers use rbp for data, so frame pointers would lose the caller of
 * open()), and the Python frames. */
static __always_inline void capture_site(struct pt_regs *regs, u32 tgid, struct fd_info *info)
{
	/* A child not taken by user space yet has no unwind rules, and most
	 * such children exit before a poll: its fds have no site, as those
	 * seeded from /proc. */
	u8 *how = bpf_map_lookup_elem(&tracked_pids, &tgid);
	if (how && (*how & TRACK_FORKED)) {
		info->stack_id = -1;
		info->py_stack = 0;
		return;
	}
	info->stack_id = regs ? fd_unwind(tgid, USER_PC(regs), USER_SP(regs), USER_FP(regs), USER_LR(regs)) : -1;
	info->py_stack = capture_py(tgid);
}

/* Records a new fd. An existing entry for the same number was replaced
 * (dup2/dup3) or closed by a path we did not see, so it counts as closed. */
static __always_inline void add_fd(struct pt_regs *regs, u32 tgid, s32 fd, u8 kind)
{
	struct fd_key key = { .tgid = tgid, .fd = fd };
	struct fd_info *old = bpf_map_lookup_elem(&fd_table, &key);
	if (old) {
		count_fd(tgid, old->kind, false);
		count_site(tgid, old->stack_id, old->py_stack, 0, true);
	}

	struct fd_info info = {
		.open_ns = bpf_ktime_get_ns(),
		.kind = kind,
	};
	capture_site(regs, tgid, &info);
	if (bpf_map_update_elem(&fd_table, &key, &info, BPF_ANY)) {
		count_err(ERR_TABLE_FULL);
		return;
	}
	count_fd(tgid, kind, true);
	count_site(tgid, info.stack_id, info.py_stack, 0, false);
}

/* The kind of fd; for a child marked at fork whose table lacks it, the kind
 * of the parent's entry of that number from before the fork. */
static __always_inline u8 kind_of(u32 tgid, s32 fd)
{
	struct fd_key key = { .tgid = tgid, .fd = fd };
	struct fd_info *info = bpf_map_lookup_elem(&fd_table, &key);
	if (info)
		return info->kind;
	struct fork_info *fi = bpf_map_lookup_elem(&forks, &tgid);
	if (!fi)
		return FD_OTHER;
	u64 fork_ns = fi->fork_ns;
	key.tgid = fi->parent;
	info = bpf_map_lookup_elem(&fd_table, &key);
	return info && info->open_ns < fork_ns ? info->kind : FD_OTHER;
}

/* Syscall numbers: bpf/arch.h. */
#define F_DUPFD 0
#define F_DUPFD_CLOEXEC 1030

#define EMFILE 24
#define ENFILE 23

/* What a syscall's exit does with its result. */
enum exit_how {
	EXIT_NONE = 0, /* not a syscall we follow */
	EXIT_NEW,      /* returns one new fd of a fixed kind */
	EXIT_DUP,      /* returns a copy of the fd saved at entry */
	EXIT_PAIR,     /* writes two new fds where the pointer saved at entry points */
	EXIT_RESYNC,   /* may have released fds we cannot see one by one */
};

static __always_inline enum exit_how exit_how(long id, u8 *kind)
{
	switch (id) {
#ifdef HAVE_LEGACY_FD_SYSCALLS
	case NR_open:
#endif
	case NR_openat:
	case NR_openat2:
#ifdef HAVE_LEGACY_FD_SYSCALLS
	case NR_creat:
#endif
	case NR_open_by_handle_at:
		*kind = FD_FILE;
		return EXIT_NEW;
	case NR_socket:
	case NR_accept:
	case NR_accept4:
		*kind = FD_SOCKET;
		return EXIT_NEW;
#ifdef HAVE_LEGACY_FD_SYSCALLS
	case NR_eventfd:
#endif
	case NR_eventfd2:
		*kind = FD_EVENTFD;
		return EXIT_NEW;
#ifdef HAVE_LEGACY_FD_SYSCALLS
	case NR_epoll_create:
#endif
	case NR_epoll_create1:
		*kind = FD_EPOLL;
		return EXIT_NEW;
	case NR_memfd_create:
		*kind = FD_MEMFD;
		return EXIT_NEW;
	case NR_timerfd_create:
		*kind = FD_TIMERFD;
		return EXIT_NEW;
#ifdef HAVE_LEGACY_FD_SYSCALLS
	case NR_signalfd:
#endif
	case NR_signalfd4:
		*kind = FD_SIGNALFD;
		return EXIT_NEW;
#ifdef HAVE_LEGACY_FD_SYSCALLS
	case NR_inotify_init:
#endif
	case NR_inotify_init1:
		*kind = FD_INOTIFY;
		return EXIT_NEW;
	case NR_pidfd_open:
		*kind = FD_PIDFD;
		return EXIT_NEW;
	case NR_pidfd_getfd:
	case NR_perf_event_open:
	case NR_fanotify_init:
	case NR_userfaultfd:
	case NR_io_uring_setup:
		*kind = FD_OTHER;
		return EXIT_NEW;
	case NR_dup:
#ifdef HAVE_LEGACY_FD_SYSCALLS
	case NR_dup2:
#endif
	case NR_dup3:
	case NR_fcntl:
		return EXIT_DUP;
#ifdef HAVE_LEGACY_FD_SYSCALLS
	case NR_pipe:
#endif
	case NR_pipe2:
		*kind = FD_PIPE;
		return EXIT_PAIR;
	case NR_socketpair:
		*kind = FD_SOCKET;
		return EXIT_PAIR;
	case NR_close_range:
		return EXIT_RESYNC;
	}
	return EXIT_NONE;
}

static __always_inline void request_resync(u32 tgid)
{
	struct fd_counts *c = bpf_map_lookup_elem(&fd_counters, &tgid);
	if (c)
		c->resyncs++;
	else
		count_err(ERR_COUNTERS);
}

/* The process is out of fds (EMFILE) or the system is (ENFILE): count it by
 * errno and remember where it happened, for the exhaustion finding. */
static __always_inline void fd_failed(struct pt_regs *regs, u32 tgid, long ret, u8 kind)
{
	u32 why;
	if (ret == -EMFILE)
		why = FAIL_EMFILE;
	else if (ret == -ENFILE)
		why = FAIL_ENFILE;
	else
		return;
	struct fd_counts *c = bpf_map_lookup_elem(&fd_counters, &tgid);
	if (!c) {
		count_err(ERR_COUNTERS);
		return;
	}
	asm volatile("" : "+r"(why));
	if (why >= FAIL_MAX)
		return;
	c->failed[why]++;
	struct fd_info site = { .open_ns = bpf_ktime_get_ns(), .kind = kind };
	capture_site(regs, tgid, &site);
	if (bpf_map_update_elem(&fail_sites, &tgid, &site, BPF_ANY))
		count_err(ERR_TABLE_FULL);
}

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

/* close releases the fd even when it returns an error (EINTR, EIO), so the
 * entry is dropped at entry; EBADF simply finds nothing. */
static __always_inline void closed(u32 tgid, s32 fd)
{
	struct fd_key key = { .tgid = tgid, .fd = fd };
	struct fd_info *info = bpf_map_lookup_elem(&fd_table, &key);
	if (!info) {
		/* A child's inherited fd, which user space holds: it looks again. */
		if (bpf_map_lookup_elem(&forks, &tgid))
			request_resync(tgid);
		return;
	}
	u8 kind = info->kind;
	s32 stack_id = info->stack_id;
	u32 py_stack = info->py_stack;
	if (bpf_map_delete_elem(&fd_table, &key) == 0) {
		count_fd(tgid, kind, false);
		count_site(tgid, stack_id, py_stack, 0, true);
	}
}

static __always_inline void on_enter(long id, u64 a0, u64 a1, u64 a3)
{
	switch (id) {
	case NR_close:
	case NR_dup:
#ifdef HAVE_LEGACY_FD_SYSCALLS
	case NR_dup2:
#endif
	case NR_dup3:
	case NR_fcntl:
#ifdef HAVE_LEGACY_FD_SYSCALLS
	case NR_pipe:
#endif
	case NR_pipe2:
	case NR_socketpair:
		break;
	default:
		return;
	}
	u32 tgid = tracked_tgid();
	if (!tgid || compat_task(current_task()))
		return;
	switch (id) {
	case NR_close:
		closed(tgid, (s32)a0);
		break;
	case NR_fcntl:
		if (a1 != F_DUPFD && a1 != F_DUPFD_CLOEXEC)
			break;
		/* fall through */
	case NR_dup:
#ifdef HAVE_LEGACY_FD_SYSCALLS
	case NR_dup2:
#endif
	case NR_dup3:
		save_entry((s32)a0, 0);
		break;
#ifdef HAVE_LEGACY_FD_SYSCALLS
	case NR_pipe:
#endif
	case NR_pipe2:
		save_entry(-1, a0);
		break;
	case NR_socketpair:
		save_entry(-1, a3);
		break;
	}
}

/* regs: the user registers, or NULL (no opening stacks). */
static __always_inline void on_exit(struct pt_regs *regs, long id, long ret)
{
	u8 kind = FD_OTHER;
	enum exit_how how = exit_how(id, &kind);
	if (how == EXIT_NONE)
		return;
	/* Forget which syscall it was: each constant would otherwise be its own
	 * verifier state through everything below. */
	asm volatile("" : "+r"(kind));
	u32 tgid = tracked_tgid();
	if (!tgid || compat_task(current_task()))
		return;
	struct fd_entry e = { .fd = -1 };
	if ((how == EXIT_DUP || how == EXIT_PAIR) && !take_entry(&e))
		return; /* fcntl other than F_DUPFD*, or entered before tracking */
	if (how == EXIT_DUP)
		kind = kind_of(tgid, e.fd);
	if (ret < 0) {
		if (how != EXIT_RESYNC)
			fd_failed(regs, tgid, ret, kind);
		return;
	}
	s32 fds[2] = { (s32)ret, -1 };
	switch (how) {
	case EXIT_RESYNC:
		request_resync(tgid);
		return;
	case EXIT_DUP:
		if ((s32)ret == e.fd) /* dup2(fd, fd) */
			return;
		break;
	case EXIT_PAIR:
		if (ret != 0)
			return;
		if (bpf_probe_read_user(fds, sizeof(fds), (void *)e.ptr)) {
			count_err(ERR_READ_USER);
			return;
		}
		break;
	default:
		break;
	}
	/* One call site of add_fd, so its code is in the program once. */
	for (int i = 0; i < 2; i++) {
		if (i == 1 && how != EXIT_PAIR)
			break;
		add_fd(regs, tgid, fds[i], kind);
	}
}

/* tp_btf: the raw tracepoint's own arguments, no trace record. The syscall
 * number at exit is orig_ax, as syscall_get_nr() reads it. */
SEC("tp_btf/sys_enter")
int BPF_PROG(sys_enter_btf, struct pt_regs *regs, long id)
{
	on_enter(id, SYSCALL_ARG0(regs), SYSCALL_ARG1(regs), SYSCALL_ARG3(regs));
	return 0;
}

SEC("tp_btf/sys_exit")
int BPF_PROG(sys_exit_btf, struct pt_regs *regs, long ret)
{
	on_exit(regs, SYSCALL_NR(regs), ret);
	return 0;
}

/* Copies the open-fd bitmap of task's fd table into fork_fds[tgid]. */
static __always_inline void snapshot_fds(struct task_struct *task, u32 tgid)
{
	u32 zero = 0;
	struct fd_bitmap *init = bpf_map_lookup_elem(&fork_fds_init, &zero);
	if (!init)
		return;
	if (bpf_map_update_elem(&fork_fds, &tgid, init, BPF_ANY)) {
		count_err(ERR_FORKS);
		return;
	}
	struct fd_bitmap *v = bpf_map_lookup_elem(&fork_fds, &tgid);
	if (!v)
		return;
	v->at_ns = bpf_ktime_get_ns();
	v->nbits = 0;
	struct fdtable *fdt = BPF_CORE_READ(task, files, fdt);
	if (!fdt)
		return;
	u32 max = BPF_CORE_READ(fdt, max_fds);
	unsigned long *open = BPF_CORE_READ(fdt, open_fds);
	u32 size = (max + 63) / 64 * 8;
	/* One comparison on the register passed: the verifier before 5.13
	 * cannot bound it from a comparison clang folds into another register
	 * (size - 2049 < ...). Zero is a size the helper takes. */
	if (size > sizeof(v->words))
		return; /* too large: listed */
	if (bpf_probe_read_kernel(v->words, size, open)) {
		count_err(ERR_READ_KERNEL);
		return;
	}
	v->nbits = max;
}

/* exec closes close-on-exec fds without a syscall per fd: user space
 * reconciles, or, for a child not taken yet, reads its bitmap. */
static __always_inline void execed(void)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	u8 *how = bpf_map_lookup_elem(&tracked_pids, &tgid);
	if (!how || !(*how & view_bit))
		return;
	if (*how & TRACK_FORKED)
		snapshot_fds(current_task(), tgid);
	else
		request_resync(tgid);
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(exec_btf)
{
	execed();
	return 0;
}

#define CLONE_FILES 0x00000400
#define CLONE_THREAD 0x00010000

/* A new process of a followed parent is tracked from here, before it runs:
 * its counters made, its parent and the time noted. Threads are the
 * parent's own; a child sharing the parent's fd table (CLONE_FILES) is
 * left to user space, which lists it when it is watched. Runs in the
 * parent, at the end of copy_process; task is the child's, or the
 * parent's where the tracepoint does not give the child (its table was
 * copied from the parent's a moment before). */
static __always_inline void forked(struct task_struct *task, u32 child, u64 clone_flags)
{
	if (clone_flags & (CLONE_THREAD | CLONE_FILES))
		return;
	u32 parent = bpf_get_current_pid_tgid() >> 32;
	u8 *how = bpf_map_lookup_elem(&tracked_pids, &parent);
	if (!how || !(*how & view_bit) || !(*how & (TRACK_FOLLOW | TRACK_FORKED)))
		return;
	struct fd_counts zero = {};
	if (bpf_map_update_elem(&fd_counters, &child, &zero, BPF_ANY)) {
		count_err(ERR_COUNTERS);
		return;
	}
	struct fork_info fi = { .parent = parent, .fork_ns = bpf_ktime_get_ns() };
	u8 forked = view_bit | TRACK_FORKED;
	if (bpf_map_update_elem(&forks, &child, &fi, BPF_ANY) ||
	    bpf_map_update_elem(&tracked_pids, &child, &forked, BPF_ANY)) {
		count_err(ERR_FORKS);
		bpf_map_delete_elem(&forks, &child);
		bpf_map_delete_elem(&fd_counters, &child);
		return;
	}
	snapshot_fds(task, child);
}

SEC("tp_btf/task_newtask")
int BPF_PROG(fork_btf, struct task_struct *task, u64 clone_flags)
{
	forked(task, task->pid, clone_flags);
	return 0;
}

/* Classic tracepoints, where tp_btf is refused. */
SEC("tracepoint/raw_syscalls/sys_enter")
int sys_enter_tp(struct trace_event_raw_sys_enter *ctx)
{
	on_enter(ctx->id, ctx->args[0], ctx->args[1], ctx->args[3]);
	return 0;
}

SEC("tracepoint/raw_syscalls/sys_exit")
int sys_exit_tp(struct trace_event_raw_sys_exit *ctx)
{
	/* The record has no registers: the task's, where the kernel can say
	 * where they are (bpf_task_pt_regs, 5.15). */
	struct pt_regs *regs = NULL;
	if (have_task_pt_regs)
		regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	on_exit(regs, ctx->id, ctx->ret);
	return 0;
}

SEC("tracepoint/sched/sched_process_exec")
int exec_tp(void *ctx)
{
	execed();
	return 0;
}

SEC("tracepoint/task/task_newtask")
int fork_tp(struct trace_event_raw_task_newtask *ctx)
{
	forked(current_task(), ctx->pid, ctx->clone_flags);
	return 0;
}
