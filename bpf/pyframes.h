// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
/* Python frames of the calling thread (CPython 3.10-3.13), for every stack
 * a concern captures: include after common.h and call capture_py(tgid) where
 * the native stack is taken; store the id it returns (0: none) in the
 * record. User space (pkg/pyframes) resolves an id into function, file and
 * line, and merges the frames with the native ones.
 *
 * User space finds the interpreter of each tracked process (the ELF symbol
 * _PyRuntime of the executable or of a mapped libpython3.X.so) and pushes
 * its address and the layout of the minor version into py_procs; a process
 * without an entry costs one hash lookup.
 *
 * The thread's PyThreadState is found by walking the interpreters and their
 * thread lists, comparing each tstate's thread_id (pthread_self()) with the
 * current task's thread pointer less self_below_tp: on x86_64 pthread_self()
 * is the fs base (0 below), on arm64 glibc's struct pthread lies right below
 * TPIDR_EL0 (sizeof(struct pthread) below, which user space reads from the
 * process's libc). This works in any pid namespace and whether or not the
 * thread holds the GIL (it does not around open() or a ctypes call), and on
 * 3.10, whose tstate has no native_thread_id. On arm64 the kernel's copy of
 * TPIDR_EL0 is taken when the task is switched out, and glibc sets the main
 * thread's itself (msr, no syscall): until the main thread's first switch
 * it matches no tstate, a finding rechecked after PY_RECHECK_NS. The tstate found is kept per thread
 * (thread_state() in common.h) and checked (one read) at each event; it, or the finding that the
 * thread runs no Python, is trusted for PY_RECHECK_NS before the next walk.
 *
 * The frame chain is walked from the thread's current frame (3.10
 * PyFrameObject.f_back, 3.11+ _PyInterpreterFrame.previous), recording per
 * frame the code object, the instruction (pointer, or 3.10's f_lasti) and
 * two bytes as they are (owner, 3.11 is_entry): user space skips the shim
 * frames 3.12+ put on the C stack and finds where each call of the
 * evaluation loop starts, so the loop has no version-dependent branch for
 * the verifier to follow. Up to PY_MAX_FRAMES innermost frames are kept.
 *
 * Stacks are stored once, keyed by a hash of their frames (an LRU map, so
 * no garbage collection is needed: a stack still in use is found again and
 * stays recent). A different stack with the same hash is not stored (the
 * record gets no Python frames) rather than misattributed. */
#pragma once

#define PY_MAX_FRAMES 24
#define PY_MAX_THREADS 64 /* tstates looked at per walk, all interpreters */
#define PY_MAX_INTERPS 4
#define PY_NONE 0xffff         /* offset of a field this version lacks */
#define PY_BUF 256             /* reads and offsets stay below (pkg/pyframes checks) */
#define PY_RECHECK_NS 1000000000ULL

/* Where the interpreter of one process lies and how its structures are laid
 * out; pkg/pyframes (Proc) mirrors it. Offsets are in bytes. */
struct py_proc {
	u64 runtime;          /* address of _PyRuntime */
	u16 interp_head;      /* _PyRuntime.interpreters.head */
	u16 interp_next;      /* PyInterpreterState.next */
	u16 interp_threads;   /* PyInterpreterState.threads.head (3.10: tstate_head) */
	u16 tstate_next;      /* PyThreadState.next */
	u16 tstate_thread_id; /* PyThreadState.thread_id: pthread_self() */
	u16 tstate_frame;     /* 3.10 frame, 3.11-3.12 cframe, 3.13 current_frame */
	u16 tstate_size;      /* bytes read per tstate: every field above lies within */
	u16 cframe_frame;     /* 3.11-3.12 _PyCFrame.current_frame; PY_NONE: none */
	u16 frame_code;       /* f_code (3.13 f_executable) */
	u16 frame_previous;   /* previous (3.10 f_back) */
	u16 frame_instr;      /* prev_instr (3.13 instr_ptr, 3.10 int f_lasti) */
	u16 frame_owner;      /* owner (a byte); any offset on 3.10 */
	u16 frame_entry;      /* 3.11 is_entry (a byte); any offset elsewhere */
	u16 frame_size;       /* bytes read per frame: every field above lies within */
	u32 self_below_tp;    /* pthread_self() is the thread pointer less this */
};

/* Python frames, innermost first; pkg/pyframes (Stack) mirrors it. Each
 * instr holds the frame's instruction address (3.10: its f_lasti in the
 * low 32 bits) in bits 0-47, the byte at frame_owner in bits 48-55 and the
 * byte at frame_entry in bits 56-63: the walk records what it reads and
 * user space interprets it for the version (shim frames of the C stack,
 * the first frame of each call of the evaluation loop), which keeps the
 * loop free of branches the verifier would have to follow. */
struct py_stack {
	u64 code[PY_MAX_FRAMES];
	u64 instr[PY_MAX_FRAMES];
	u32 n;         /* frames recorded */
	u32 truncated; /* 1: the thread had more frames than these */
};

struct py_thread {
	u64 task;   /* thread_state() */
	u64 tstate; /* 0: not a Python thread when checked */
	u64 checked_ns;
};

/* One capture's working memory. The global functions below take scalars
 * only and find this (and the process's layout copied into it) themselves:
 * kernels before 5.12 accept no pointer arguments in global functions, and
 * before 6.12 a pointer derived from one is no map value for
 * bpf_map_update_elem. */
struct py_scratch {
	struct py_proc cfg;
	struct py_stack st;
	u8 buf[PY_BUF + 8];
};

/* Counted per CPU, read by user space as lost-event counters. */
enum py_err {
	PY_ERR_READ = 0,      /* a read of the interpreter's memory failed */
	PY_ERR_COLLISION = 1, /* another stack has the same hash: frames dropped */
	PY_ERR_STORE = 2,     /* the stack map refused an update */
	PY_ERR_MAX = 3,
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct py_proc);
} py_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, u32);
	__type(value, struct py_stack);
} py_stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct py_thread);
} py_threads SEC(".maps");

/* py_threads where the kernel has no task storage (thread_state()). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, struct py_thread);
} py_threads_tid SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct py_scratch);
} py_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PY_ERR_MAX);
	__type(key, u32);
	__type(value, u64);
} py_errors SEC(".maps");

const struct py_proc *unused_py_proc __attribute__((unused));
const struct py_stack *unused_py_stack __attribute__((unused));
const enum py_err *unused_py_err __attribute__((unused));

static __always_inline void py_err(u32 kind)
{
	u64 *n = bpf_map_lookup_elem(&py_errors, &kind);
	if (n)
		*n += 1;
}

/* A field of the last read, at an offset user space gave: masked so the
 * verifier sees it inside the buffer. */
static __always_inline u64 py_u64(const struct py_scratch *sc, u32 off)
{
	return *(const u64 *)(sc->buf + (off & (PY_BUF - 1)));
}

static __always_inline bool py_read(struct py_scratch *sc, u32 size, u64 addr)
{
	if (bpf_probe_read_user(sc->buf, size & (PY_BUF - 1), (void *)addr)) {
		py_err(PY_ERR_READ);
		return false;
	}
	return true;
}

static __always_inline u64 py_ptr(u64 addr)
{
	u64 v = 0;
	if (bpf_probe_read_user(&v, sizeof(v), (void *)addr))
		py_err(PY_ERR_READ);
	return v;
}

static __always_inline struct py_scratch *py_sc(void)
{
	u32 zero = 0;
	return bpf_map_lookup_elem(&py_scratch, &zero);
}

/* The tstate in the list from ts whose thread_id is self, its fields left
 * in the scratch buffer; 0 when none is. Global, like the others below: the
 * verifier walks each loop once. */
__noinline u64 py_find_thread(u64 ts, u64 self)
{
	struct py_scratch *sc = py_sc();
	if (!sc)
		return 0;
	for (int i = 0; i < PY_MAX_THREADS && ts; i++) {
		if (!py_read(sc, sc->cfg.tstate_size, ts))
			return 0;
		if (py_u64(sc, sc->cfg.tstate_thread_id) == self)
			return ts;
		ts = py_u64(sc, sc->cfg.tstate_next);
	}
	return 0;
}

/* The current frame of the calling thread, or 0 when it runs no Python. */
__noinline u64 py_current_frame(void)
{
	struct py_scratch *sc = py_sc();
	if (!sc)
		return 0;
	u64 self = thread_pointer(current_task()) - sc->cfg.self_below_tp;
	u64 now = bpf_ktime_get_ns();
	struct py_thread init = {};
	struct py_thread *pt = thread_state(&py_threads, &py_threads_tid, &init, true);
	u64 ts = 0;
	if (pt && now - pt->checked_ns < PY_RECHECK_NS) {
		if (!pt->tstate)
			return 0;
		/* Still this thread's: one read, which leaves its fields in buf. */
		if (py_read(sc, sc->cfg.tstate_size, pt->tstate) && py_u64(sc, sc->cfg.tstate_thread_id) == self)
			ts = pt->tstate;
	}
	if (!ts) {
		u64 interp = py_ptr(sc->cfg.runtime + sc->cfg.interp_head);
		for (int i = 0; i < PY_MAX_INTERPS && interp && !ts; i++) {
			ts = py_find_thread(py_ptr(interp + sc->cfg.interp_threads), self);
			interp = py_ptr(interp + sc->cfg.interp_next);
		}
		if (pt) {
			pt->tstate = ts;
			pt->checked_ns = now;
		}
		if (!ts)
			return 0;
	}
	u64 frame = py_u64(sc, sc->cfg.tstate_frame);
	if (frame && sc->cfg.cframe_frame != PY_NONE)
		frame = py_ptr(frame + sc->cfg.cframe_frame);
	return frame;
}

#define PY_ADDR_MASK ((1ULL << 48) - 1)

/* Records the frames from frame outwards in the scratch stack; returns how
 * many. */
__noinline int py_walk(u64 frame)
{
	struct py_scratch *sc = py_sc();
	if (!sc)
		return 0;
	struct py_stack *st = &sc->st;
	u32 n = 0;
	for (; n < PY_MAX_FRAMES && frame; n++) {
		if (!py_read(sc, sc->cfg.frame_size, frame))
			break;
		u64 owner = sc->buf[sc->cfg.frame_owner & (PY_BUF - 1)];
		u64 entry = sc->buf[sc->cfg.frame_entry & (PY_BUF - 1)];
		st->code[n] = py_u64(sc, sc->cfg.frame_code);
		st->instr[n] = (py_u64(sc, sc->cfg.frame_instr) & PY_ADDR_MASK) | owner << 48 | entry << 56;
		frame = py_u64(sc, sc->cfg.frame_previous);
	}
	st->n = n;
	st->truncated = frame != 0;
	return n;
}

/* Stores the scratch stack under a hash of its frames; returns the id, 0 on
 * failure. */
__noinline int py_store(void)
{
	struct py_scratch *sc = py_sc();
	if (!sc)
		return 0;
	struct py_stack *st = &sc->st;
	u32 n = st->n;
	u64 h = 0xcbf29ce484222325ULL ^ n;
	for (u32 i = 0; i < PY_MAX_FRAMES && i < n; i++) {
		h = (h ^ st->code[i]) * 0x100000001b3ULL;
		h = (h ^ st->instr[i]) * 0x100000001b3ULL;
		h ^= h >> 29;
	}
	u32 id = (u32)(h ^ (h >> 32));
	if (!id)
		id = 1;
	struct py_stack *old = bpf_map_lookup_elem(&py_stacks, &id);
	if (old) {
		if (old->n != n)
			goto collision;
		for (u32 i = 0; i < PY_MAX_FRAMES && i < n; i++) {
			if (old->code[i] != st->code[i] || old->instr[i] != st->instr[i])
				goto collision;
		}
		return id;
	}
	long err = bpf_map_update_elem(&py_stacks, &id, st, BPF_NOEXIST);
	if (err && err != -17 /* EEXIST: another CPU stored it just now */) {
		py_err(PY_ERR_STORE);
		return 0;
	}
	return id;
collision:
	py_err(PY_ERR_COLLISION);
	return 0;
}

/* The Python frames of the calling thread of tgid: an id in py_stacks, or 0
 * when tgid runs no Python known to user space, the thread runs none, or
 * they could not be read. */
__noinline int capture_py(u32 tgid)
{
	const struct py_proc *cfg = bpf_map_lookup_elem(&py_procs, &tgid);
	if (!cfg)
		return 0;
	struct py_scratch *sc = py_sc();
	if (!sc)
		return 0;
	sc->cfg = *cfg;
	u64 frame = py_current_frame();
	if (!frame || !py_walk(frame))
		return 0;
	return py_store();
}
