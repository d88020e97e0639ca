/* SPDX-License-Identifier: GPL-2.0 */
/* What differs between the architectures the objects are built for (bpf2go
 * -target amd64,arm64 defines __TARGET_ARCH_x86 or __TARGET_ARCH_arm64):
 * syscall numbers and the syscalls that exist, the registers of a syscall
 * and of user code, compat (32-bit) tasks, the thread pointer, and where a
 * function's return address is at its first instruction. Everything else
 * reads these, never a register by name. */
#pragma once

#if defined(__TARGET_ARCH_x86)

/* x86_64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl). */
#define NR_open 2
#define NR_close 3
#define NR_mmap 9
#define NR_pipe 22
#define NR_dup 32
#define NR_dup2 33
#define NR_socket 41
#define NR_accept 43
#define NR_socketpair 53
#define NR_fcntl 72
#define NR_creat 85
#define NR_epoll_create 213
#define NR_inotify_init 253
#define NR_openat 257
#define NR_signalfd 282
#define NR_timerfd_create 283
#define NR_eventfd 284
#define NR_accept4 288
#define NR_signalfd4 289
#define NR_eventfd2 290
#define NR_epoll_create1 291
#define NR_dup3 292
#define NR_pipe2 293
#define NR_inotify_init1 294
#define NR_perf_event_open 298
#define NR_fanotify_init 300
#define NR_open_by_handle_at 304
#define NR_memfd_create 319
#define NR_userfaultfd 323
/* The syscalls x86_64 keeps from before their flags variants (open, creat,
 * pipe, dup2, epoll_create, inotify_init, signalfd, eventfd): arm64, like
 * every newer architecture, has only the variants. */
#define HAVE_LEGACY_FD_SYSCALLS 1

/* A syscall's registers (struct pt_regs at sys_enter/sys_exit): the number
 * at exit is orig_ax, as syscall_get_nr() reads it. */
#define SYSCALL_NR(regs) ((regs)->orig_ax)
#define SYSCALL_ARG0(regs) ((regs)->di)
#define SYSCALL_ARG1(regs) ((regs)->si)
#define SYSCALL_ARG2(regs) ((regs)->dx)
#define SYSCALL_ARG3(regs) ((regs)->r10)
#define SYSCALL_ARG4(regs) ((regs)->r8)

/* User registers (a task's struct pt_regs): program counter, stack pointer,
 * frame pointer (rbp) and link register (none: a call pushes the return
 * address). */
#define USER_PC(regs) ((regs)->ip)
#define USER_SP(regs) ((regs)->sp)
#define USER_FP(regs) ((regs)->bp)
#define USER_LR(regs) 0

/* The sixth integer argument at a uprobe. libbpf before 1.2 has no
 * PT_REGS_PARM6. */
#define UPROBE_PARM6(ctx) ((ctx)->r9)

/* At a function's first instruction, the return address is at the stack
 * pointer; at its return, the return has popped it: the stack pointer is 8
 * above where it was at entry. */
#define ENTRY_SP_AT_RETURN(ctx) (PT_REGS_SP(ctx) - 8)

/* The link register at a uprobe: x86 has none. */
#define UPROBE_LR(ctx) 0

/* The seventh integer argument at a function's first instruction: on the
 * stack above the return address (SysV). False when it cannot be read. */
static __always_inline bool uprobe_parm7(struct pt_regs *ctx, u64 *v)
{
	return !bpf_probe_read_user(v, sizeof(*v), (void *)(PT_REGS_SP(ctx) + 8));
}

/* f(a, b, struct big by value, c, ...), the struct over 16 bytes: SysV passes
 * it in memory, on the stack above the return address, taking no register,
 * so c is the third integer register. */
#define BYVAL3_ADDR(ctx) (PT_REGS_SP(ctx) + 8)
#define BYVAL3_NEXT(ctx) PT_REGS_PARM3(ctx)

/* At a function's first instruction, with stack pointer sp: the return
 * address (*pc) and the caller's stack pointer (*caller_sp). False when the
 * return address cannot be read. */
static __always_inline bool entry_caller(u64 sp, u64 lr, u64 *pc, u64 *caller_sp)
{
	/* lr is unused here. The empty asm keeps it an argument of the global
	 * function this is inlined in: LLVM would pass it undefined, and the
	 * verifier checks every argument of a global function. */
	asm volatile("" : "+r"(lr));
	if (bpf_probe_read_user(pc, sizeof(*pc), (void *)sp))
		return false;
	*caller_sp = sp + 8;
	return true;
}

/* A compat task (32-bit, int 0x80) numbers its syscalls otherwise: it is
 * skipped. TS_COMPAT in thread_info.status. */
static __always_inline bool compat_task(struct task_struct *task)
{
	return BPF_CORE_READ(task, thread_info.status) & 0x0002;
}

/* The thread pointer: fs base, which glibc's pthread_self() returns. */
static __always_inline u64 thread_pointer(struct task_struct *task)
{
	return BPF_CORE_READ(task, thread.fsbase);
}

#elif defined(__TARGET_ARCH_arm64)

/* arm64 syscall numbers (include/uapi/asm-generic/unistd.h). */
#define NR_close 57
#define NR_mmap 222
#define NR_dup 23
#define NR_socket 198
#define NR_accept 202
#define NR_socketpair 199
#define NR_fcntl 25
#define NR_openat 56
#define NR_timerfd_create 85
#define NR_accept4 242
#define NR_signalfd4 74
#define NR_eventfd2 19
#define NR_epoll_create1 20
#define NR_dup3 24
#define NR_pipe2 59
#define NR_inotify_init1 26
#define NR_perf_event_open 241
#define NR_fanotify_init 262
#define NR_open_by_handle_at 265
#define NR_memfd_create 279
#define NR_userfaultfd 282

/* At sys_enter x0 still holds the first argument, but the saved orig_x0 is
 * what syscall_get_arguments() reads; at exit the number is syscallno. */
#define SYSCALL_NR(regs) ((regs)->syscallno)
#define SYSCALL_ARG0(regs) ((regs)->orig_x0)
#define SYSCALL_ARG1(regs) ((regs)->regs[1])
#define SYSCALL_ARG2(regs) ((regs)->regs[2])
#define SYSCALL_ARG3(regs) ((regs)->regs[3])
#define SYSCALL_ARG4(regs) ((regs)->regs[4])

/* The frame pointer is x29; the link register x30 holds the return address
 * of a leaf function or of one still in its prologue. */
#define USER_PC(regs) ((regs)->pc)
#define USER_SP(regs) ((regs)->sp)
#define USER_FP(regs) ((regs)->regs[29])
#define USER_LR(regs) ((regs)->regs[30])

#define UPROBE_PARM6(ctx) (((struct user_pt_regs *)(ctx))->regs[5])

/* A call leaves the stack pointer as it was (the return address is in the
 * link register), and so does the return. */
#define ENTRY_SP_AT_RETURN(ctx) (PT_REGS_SP(ctx))

#define UPROBE_LR(ctx) (((struct user_pt_regs *)(ctx))->regs[30])

/* AAPCS64 passes eight integer arguments in registers: the seventh is x6. */
static __always_inline bool uprobe_parm7(struct pt_regs *ctx, u64 *v)
{
	*v = ((struct user_pt_regs *)ctx)->regs[6];
	return true;
}

/* f(a, b, struct big by value, c, ...), the struct over 16 bytes: AAPCS64
 * has the caller copy it and pass its address, in x2; c is x3. */
#define BYVAL3_ADDR(ctx) PT_REGS_PARM3(ctx)
#define BYVAL3_NEXT(ctx) PT_REGS_PARM4(ctx)

/* At a function's first instruction the return address is the link
 * register's (not signed yet: a PAC prologue signs it after) and the stack
 * pointer is the caller's. */
static __always_inline bool entry_caller(u64 sp, u64 lr, u64 *pc, u64 *caller_sp)
{
	*pc = lr;
	*caller_sp = sp;
	return true;
}

/* A compat task (AArch32) numbers its syscalls otherwise: it is skipped.
 * TIF_32BIT (22) in thread_info.flags. */
static __always_inline bool compat_task(struct task_struct *task)
{
	return BPF_CORE_READ(task, thread_info.flags) & (1UL << 22);
}

/* The thread pointer: TPIDR_EL0 as the kernel saved it at the thread's
 * last switch out (or set it at clone). */
static __always_inline u64 thread_pointer(struct task_struct *task)
{
	return BPF_CORE_READ(task, thread.uw.tp_value);
}

#else
#error "unsupported target architecture"
#endif

/* Syscalls with the same number on both (asm-generic numbers them alike). */
#define NR_io_uring_setup 425
#define NR_pidfd_open 434
#define NR_close_range 436
#define NR_openat2 437
#define NR_pidfd_getfd 438
