// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
/* CUDA allocation tracking: uprobe/uretprobe pairs on the allocation and free
 * entry points of the CUDA runtime (libcudart, or a statically linked copy)
 * and driver (libcuda), attached per process by user space.
 *
 * The live allocations of every tracked process sit in a kernel hash keyed by
 * (tgid, pointer): it is the source of truth, so a burst of any size loses
 * nothing while the table has room. Per-API totals are per-CPU counters.
 * A per-process sum of live device bytes and its high-water mark since the
 * last poll let user space see a spike that comes and goes between polls.
 * Per call site (bpf/sites.h), what was allocated and freed, a free
 * credited to the site of the block it frees: a burst allocated and
 * released between two polls leaves its site there.
 * Only failed allocations, which are rare, go through the ring buffer.
 *
 * A failed allocation also opens its process's memory snapshot (oom_snaps),
 * at most one at a time and, once user space kept one, not again before
 * the time it set: from then on each free of an allocation made at or
 * before the failure copies it to freed_allocs before deleting it from the
 * live table. User space, at its next poll, has what was live at the
 * failure: the live table's entries made before it, and freed_allocs; then
 * it closes the snapshot and empties freed_allocs of the process.
 *
 * The runtime implements its allocations by calling the driver on the same
 * thread. Each layer keeps its own per-thread entry state, and a driver call
 * made while a runtime call is in flight on the thread is ignored, so one
 * allocation is counted once, under the outermost API.
 *
 * The API of each attach point comes from the BPF cookie: one program per
 * argument shape serves every function of that shape. Kernels without
 * cookies (before 5.15) get one entry program per function instead, each
 * with its API built in; user space loads one set. Returns need no cookie:
 * the state saved at entry says what the call was, and there is one return
 * program per layer.
 *
 * Where the kernel has session uprobes (6.13+), one program per shape serves
 * the entry and the return of its functions (on_session), and the entry
 * declines the return of a call nobody needs: an untracked process's, a
 * driver call nested in a hooked runtime call, a free (recorded at entry;
 * x86 only, see FREE_DECLINES_RETURN).
 * A declined return costs nothing: the kernel does not hijack the return
 * address. Elsewhere (5.10 to 6.12) uprobe and uretprobe pairs run the same
 * on_entry and on_return. */
#include "tracked.h"
#include "pyframes.h"
#include "sites.h"
#include "unwind.h"

/* Hooked functions; the cookie of each attach point. Runtime first, then
 * driver, then the driver's virtual memory management calls. The Go table in
 * pkg/cudatrack/apis.go follows this order. */
enum cuda_api {
	API_CUDA_MALLOC = 0,
	API_CUDA_MALLOC_ASYNC,
	API_CUDA_MALLOC_FROM_POOL_ASYNC,
	API_CUDA_MALLOC_MANAGED,
	API_CUDA_MALLOC_PITCH,
	API_CUDA_MALLOC_HOST,
	API_CUDA_HOST_ALLOC,
	API_CUDA_FREE,
	API_CUDA_FREE_ASYNC,
	API_CUDA_FREE_HOST,
	API_CU_MEM_ALLOC = 10, /* first driver API */
	API_CU_MEM_ALLOC_ASYNC,
	API_CU_MEM_ALLOC_FROM_POOL_ASYNC,
	API_CU_MEM_ALLOC_MANAGED,
	API_CU_MEM_ALLOC_PITCH,
	API_CU_MEM_ALLOC_HOST,
	API_CU_MEM_HOST_ALLOC,
	API_CU_MEM_FREE,
	API_CU_MEM_FREE_ASYNC,
	API_CU_MEM_FREE_HOST,
	API_CU_MEM_CREATE = 20,
	API_CU_MEM_RELEASE,
	API_CU_MEM_MAP,
	API_CU_MEM_UNMAP,
	/* Synchronising calls (SHAPE_SYNC): runtime, then driver. */
	API_CUDA_DEVICE_SYNCHRONIZE = 24,
	API_CUDA_STREAM_SYNCHRONIZE,
	API_CUDA_EVENT_SYNCHRONIZE,
	API_CUDA_MEMCPY,
	API_CU_CTX_SYNCHRONIZE = 28,
	API_CU_STREAM_SYNCHRONIZE,
	API_CU_EVENT_SYNCHRONIZE,
	API_CU_MEMCPY_DTOH,
	API_CU_MEMCPY_HTOD,
	API_CU_MEMCPY_DTOD,
	/* Launches (SHAPE_LAUNCH), hooked only when asked for: runtime, then
	 * driver. */
	API_CUDA_LAUNCH_KERNEL = 34,
	API_CUDA_GRAPH_LAUNCH,
	API_CU_LAUNCH_KERNEL = 36,
	API_MAX,
};

/* Argument shapes: what the entry program saves and the return program does. */
enum cuda_shape {
	SHAPE_ALLOC = 0, /* (T **out, size_t size, ...) */
	SHAPE_PITCH = 1, /* (T **out, size_t *pitch, size_t width, size_t height, ...) */
	SHAPE_FREE = 2,  /* (T ptr, ...) */
	SHAPE_COUNT = 3, /* (ptr, size_t size, ...): only counted */
	SHAPE_SYNC = 4,  /* a synchronising call: timed, by call site and thread */
	SHAPE_LAUNCH = 5, /* a launch: timed, per process */
};

enum cuda_layer {
	LAYER_RUNTIME = 0,
	LAYER_DRIVER = 1,
};

/* Key namespaces of the live table: cuMemCreate handles are not pointers. */
enum cuda_ns {
	NS_PTR = 0,
	NS_HANDLE = 1,
};

struct cuda_alloc_key {
	u32 tgid;
	u32 ns; /* enum cuda_ns */
	u64 addr;
};

struct cuda_alloc {
	u64 size;
	u64 time_ns;  /* bpf_ktime_get_ns at return */
	s32 stack_id; /* user stack at entry, an id in unwound_stacks (bpf/unwind.h); negative: unknown */
	u16 api;
	u16 pad;
	u32 py_stack; /* Python frames, an id in py_stacks (bpf/pyframes.h); 0: none */
};

/* Per-process totals since tracking began; user space creates the entry. */
struct cuda_counts {
	u64 alloc_bytes[API_MAX];
	u64 free_bytes[API_MAX];
	u64 calls[API_MAX];
};

/* One failed allocation, sent to user space. */
struct cuda_failure {
	u64 time_ns;
	u64 size;
	u32 tgid;
	u32 tid;
	s32 code;
	s32 stack_id;
	u16 api;
	u16 pad[3];
	u32 py_stack; /* as in cuda_alloc */
	u64 snap_ns;  /* time_ns when this failure opened its process's snapshot; 0: it did not */
	s64 live_bytes; /* the process's live device bytes at the failure */
};

/* A process's memory snapshot (see the top); user space creates the entry
 * with the counters and closes an open one. */
struct cuda_snap {
	u64 open_ns;       /* the failure that opened it; 0: closed */
	u64 not_before_ns; /* no failure opens one before */
	u64 missed;        /* frees not kept in freed_allocs while open (table full) */
};

/* An allocation live at a failure and freed after it, keyed as in the live
 * table. */
struct cuda_freed {
	struct cuda_alloc alloc;
	u64 freed_ns;
};

/* Saved at the entry of the outermost call of a layer on a thread. */
struct call_state {
	u64 sp;   /* user stack pointer at entry: nested calls are below it; 0: none */
	u64 out;  /* user address of the out-parameter */
	u64 size; /* requested bytes; rows (height) for the pitch shape */
	u64 pitch; /* user address of the pitch out-parameter */
	u64 width; /* bytes per row asked for, pitch shape only */
	u16 api;
	u8 shape;
	u8 noret; /* no return probe will clear this state: see in_flight */
	s32 stack_id; /* allocations: the caller's stack, taken at entry */
	u64 ret; /* noret only: the return address at sp at entry */
};

/* Per-thread entry state, one slot per layer (thread_state() in common.h:
 * task storage where the kernel has it). */
struct thread_calls {
	u64 task;
	struct call_state layer[2];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 262144); /* resized from Go (Config.MaxAllocs) */
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory follows use, not capacity */
	__type(key, struct cuda_alloc_key);
	__type(value, struct cuda_alloc);
} live_allocs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory follows use, not capacity */
	__type(key, u32);
	__type(value, struct cuda_counts);
} cuda_counters SEC(".maps");


/* Live device bytes of each tracked process (pinned host memory left out),
 * kept beside the live table so that each allocation can raise the
 * high-water mark below; user space creates the entry. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, s64);
} live_bytes SEC(".maps");

/* The most live device bytes of each process that each CPU saw in the
 * current window, so that memory allocated and freed again between two polls
 * still shows. User space starts a window at each poll by raising
 * peak_window, then reads the previous window's values of every CPU and
 * takes the largest: no allocating CPU ever waits for another, and no
 * atomic read-modify-write (which kernels before 5.12 refuse) is needed.
 * An allocation in flight across the switch (microseconds) may land in the
 * window already read. User space creates the entry. */
struct cuda_peak {
	u64 window;
	u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory follows use, not capacity */
	__type(key, u32);
	__type(value, struct cuda_peak);
} peak_bytes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u64);
} peak_window SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_calls);
} calls SEC(".maps");

/* calls where the kernel has no task storage. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, struct thread_calls);
} calls_tid SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} failures SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct cuda_snap);
} oom_snaps SEC(".maps");

/* Filled only while a snapshot is open, emptied by user space at its poll. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory follows use, not capacity */
	__type(key, struct cuda_alloc_key);
	__type(value, struct cuda_freed);
} freed_allocs SEC(".maps");

/* Force the shared types into BTF so bpf2go can generate them. */
const struct cuda_alloc_key *unused_cuda_alloc_key __attribute__((unused));
const struct cuda_alloc *unused_cuda_alloc __attribute__((unused));
const struct cuda_counts *unused_cuda_counts __attribute__((unused));
const struct cuda_failure *unused_cuda_failure __attribute__((unused));
const struct cuda_peak *unused_cuda_peak __attribute__((unused));
const struct cuda_snap *unused_cuda_snap __attribute__((unused));
const struct cuda_freed *unused_cuda_freed __attribute__((unused));
const enum cuda_api *unused_cuda_api __attribute__((unused));
const enum cuda_shape *unused_cuda_shape __attribute__((unused));
const enum cuda_ns *unused_cuda_ns __attribute__((unused));
const enum err_kind *unused_err_kind __attribute__((unused));

static __always_inline u32 layer_of(u32 api)
{
	return api < API_CU_MEM_ALLOC ? LAYER_RUNTIME : LAYER_DRIVER;
}

static __always_inline u32 ns_of(u32 api)
{
	return api == API_CU_MEM_CREATE || api == API_CU_MEM_RELEASE ? NS_HANDLE : NS_PTR;
}

/* Returns the API of the attach point, or API_MAX when the cookie is bad. */
static __always_inline u32 api_of(struct pt_regs *ctx)
{
	u64 api = bpf_get_attach_cookie(ctx);
	return api < API_MAX ? (u32)api : API_MAX;
}

/* True when the call saved in st is in flight further up this thread's
 * stack. One below sp is stale: its return was never seen (longjmp, or the
 * uretprobe could not be installed). One at sp itself is a call that
 * tail-called this one when outer_too (the runtime jumping into the driver),
 * and a stale one otherwise.
 * A call whose return was declined (noret: FREE_DECLINES_RETURN) leaves its state behind when it
 * returns, and a later call from a deeper frame is below it too: that call
 * is in flight only while its return address is still at its entry stack
 * pointer (a returned call's slot is the next call's return address, from
 * another call instruction); otherwise its state is cleared. */
static __always_inline bool in_flight(struct call_state *st, u64 sp, bool outer_too)
{
	if (!(st->sp > sp || (outer_too && st->sp && st->sp == sp)))
		return false;
	if (!st->noret)
		return true;
	u64 ret = 0;
	if (bpf_probe_read_user(&ret, sizeof(ret), (void *)st->sp))
		count_err(ERR_READ_USER);
	else if (ret == st->ret)
		return true;
	st->sp = 0;
	return false;
}

/* Pinned host memory: not on the GPU, so not in the live device bytes. */
static __always_inline bool is_host(u32 api)
{
	return api == API_CUDA_MALLOC_HOST || api == API_CUDA_HOST_ALLOC || api == API_CU_MEM_ALLOC_HOST ||
	       api == API_CU_MEM_HOST_ALLOC;
}

/* Raises this CPU's high-water mark of tgid in the current window to live. */
static __always_inline void raise_peak(u32 tgid, s64 live)
{
	if (live <= 0)
		return;
	u32 zero = 0;
	u64 *window = bpf_map_lookup_elem(&peak_window, &zero);
	struct cuda_peak *peak = bpf_map_lookup_elem(&peak_bytes, &tgid);
	if (!window || !peak) {
		counters_missing(tgid);
		return;
	}
	u64 w = *window;
	if (peak->window != w) {
		peak->window = w;
		peak->bytes = live;
	} else if (peak->bytes < (u64)live) {
		peak->bytes = live;
	}
}

/* Adds delta to the live device bytes of tgid; an allocation (delta > 0)
 * also raises the high-water mark. */
static __always_inline void add_live(u32 tgid, u32 api, s64 delta)
{
	if (is_host(api) || !delta)
		return;
	s64 *live = bpf_map_lookup_elem(&live_bytes, &tgid);
	if (!live) {
		counters_missing(tgid);
		return;
	}
	/* An atomic add whose result is unused: the one atomic every kernel
	 * takes. What it left is read after, another CPU's change included. */
	__sync_fetch_and_add(live, delta);
	if (delta > 0)
		raise_peak(tgid, *(volatile s64 *)live);
}

static __always_inline struct thread_calls *thread_calls(bool create)
{
	struct thread_calls init = {};
	return thread_state(&calls, &calls_tid, &init, create);
}

/* Adds one call of api and its bytes to the totals of tgid. */
static __always_inline void count(u32 tgid, u32 api, u64 alloc, u64 freed)
{
	struct cuda_counts *c = bpf_map_lookup_elem(&cuda_counters, &tgid);
	if (!c) {
		counters_missing(tgid);
		return;
	}
	/* Compare and index through one register the verifier can bound. */
	u32 k = api;
	asm volatile("" : "+r"(k));
	if (k >= API_MAX)
		return;
	c->calls[k]++;
	c->alloc_bytes[k] += alloc;
	c->free_bytes[k] += freed;
}

/* Unwinds from the registers of a uprobe at a function's first instruction
 * (its stack pointer sp, frame pointer fp and link register lr). The stack
 * starts at the caller (the return address: bpf/arch.h entry_caller). A
 * global function: the verifier walks the loop once per object, not once
 * per program that calls it. */
__noinline int unwind_at_entry(u32 tgid, u64 sp, u64 fp, u64 lr)
{
	u64 pc = 0, caller_sp = 0;
	if (!entry_caller(sp, lr, &pc, &caller_sp)) {
		count_err(ERR_READ_USER);
		return -1;
	}
	return unwind_user(tgid, pc, caller_sp, fp, 0, false, UNWIND_MAX_FRAMES);
}

/* Saves the entry state of an outermost call. Returns the API, or API_MAX
 * when the call is not ours to record (untracked process, nested call).
 * noret: no return probe will run for this call (see in_flight). */
static __always_inline u32 enter(struct pt_regs *ctx, u32 api, u8 shape, u64 out, u64 size, u64 pitch, u64 width,
				 bool noret)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!is_tracked(tgid) || api >= API_MAX)
		return API_MAX;
	struct thread_calls *tc = thread_calls(true);
	if (!tc) {
		count_err(ERR_ENTRY_STATE);
		return API_MAX;
	}
	u64 sp = PT_REGS_SP(ctx);
	u32 layer = layer_of(api);
	if (layer == LAYER_DRIVER && in_flight(&tc->layer[LAYER_RUNTIME], sp, true))
		return API_MAX;
	struct call_state *st = &tc->layer[layer == LAYER_DRIVER];
	if (in_flight(st, sp, false))
		return API_MAX;
	st->sp = sp;
	st->out = out;
	st->size = size;
	st->pitch = pitch;
	st->width = width;
	st->api = api;
	st->shape = shape;
	st->noret = noret;
	st->ret = 0;
	/* Unreadable: recorded all the same, but its nested calls are not
	 * recognised as such. */
	if (noret && bpf_probe_read_user(&st->ret, sizeof(st->ret), (void *)sp)) {
		count_err(ERR_READ_USER);
		st->sp = 0;
	}
	/* At entry the caller's return address is at the stack pointer; by the
	 * return the callee has overwritten the registers a walk needs. Frees
	 * and counted calls have no site to record. */
	st->stack_id = shape == SHAPE_ALLOC || shape == SHAPE_PITCH ? unwind_at_entry(tgid, sp, PT_REGS_FP(ctx), UPROBE_LR(ctx)) : -1;
	return api;
}

/* Before a device allocation a of tgid leaves the live table: kept in
 * freed_allocs when tgid's snapshot is open and a was made at or before its
 * failure. Kept before the delete, so that user space, reading the live
 * table then freed_allocs, finds it in one or the other. */
static __always_inline void keep_freed(u32 tgid, const struct cuda_alloc_key *key, const struct cuda_alloc *a)
{
	if (is_host(a->api))
		return;
	struct cuda_snap *s = bpf_map_lookup_elem(&oom_snaps, &tgid);
	if (!s || !s->open_ns || a->time_ns > s->open_ns)
		return;
	struct cuda_freed f = { .alloc = *a, .freed_ns = bpf_ktime_get_ns() };
	if (bpf_map_update_elem(&freed_allocs, key, &f, BPF_ANY)) {
		/* Plain add: a lost count under a race only lowers the count. */
		s->missed++;
		count_err(ERR_OOM_SNAPSHOT);
	}
}

/* Whether a session entry of a free declines its return. The free's state
 * must still mark the call in flight, so that the driver free the runtime's
 * makes is taken for nested; with no return to clear it, in_flight tells a
 * returned call from one in flight by the return address left at its entry
 * stack pointer. That needs the return address in memory at the entry: so
 * on x86 (pushed by the call). On arm64 it is in the link register, and
 * where the callee saves it, if at all, is its own choice (a leaf keeps it
 * in x30; others store it anywhere in a frame below the entry sp), so no
 * slot tells a returned call from one in flight: a saved LR cannot be
 * checked later. There the free keeps its return, whose probe clears the
 * state (on_return), at the cost of one more trap per free. */
#if defined(__TARGET_ARCH_x86)
#define FREE_DECLINES_RETURN 1
#else
#define FREE_DECLINES_RETURN 0
#endif

/* Frees are recorded at entry: once the library has released the memory,
 * another thread may get the same address back before our return hook runs.
 * noret: no return probe will run for this call (see in_flight). False when
 * nothing was saved for a return to clear. */
static __always_inline bool free_entry(struct pt_regs *ctx, u32 api, bool noret)
{
	u64 addr = PT_REGS_PARM1(ctx);
	if (enter(ctx, api, SHAPE_FREE, 0, 0, 0, 0, noret) == API_MAX)
		return false;
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	u64 freed = 0;
	struct cuda_alloc_key key = { .tgid = tgid, .ns = ns_of(api), .addr = addr };
	/* Not found: allocated before tracking began, or not by a hooked API. */
	struct cuda_alloc *a = addr ? bpf_map_lookup_elem(&live_allocs, &key) : NULL;
	if (a) {
		struct cuda_alloc held = *a;
		keep_freed(tgid, &key, &held);
		/* Only the deleting CPU accounts for it: two frees of one pointer
		 * race here, one of them deletes. */
		if (!bpf_map_delete_elem(&live_allocs, &key)) {
			freed = held.size;
			add_live(tgid, held.api, -(s64)held.size);
			if (!is_host(held.api))
				count_site(tgid, held.stack_id, held.py_stack, held.size, true);
		}
	}
	count(tgid, api, 0, freed);
	return true;
}

/* The entry of a function of api with arguments of shape. session: a
 * session uprobe, whose return runs only when this returns true (the
 * return needs the state saved); a uretprobe runs anyway. */
static __always_inline bool on_entry(struct pt_regs *ctx, u32 api, u8 shape, bool session)
{
	switch (shape) {
	case SHAPE_ALLOC:
		return enter(ctx, api, SHAPE_ALLOC, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0, 0, false) != API_MAX;
	case SHAPE_PITCH:
		return enter(ctx, api, SHAPE_PITCH, PT_REGS_PARM1(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM2(ctx),
			     PT_REGS_PARM3(ctx), false) != API_MAX;
	case SHAPE_COUNT:
		return enter(ctx, api, SHAPE_COUNT, 0, PT_REGS_PARM2(ctx), 0, 0, false) != API_MAX;
	case SHAPE_FREE:
#if FREE_DECLINES_RETURN
		free_entry(ctx, api, session);
		return !session;
#else
		return free_entry(ctx, api, false);
#endif
	}
	return false;
}

/* One program per shape, the API from the attach point's cookie. */
SEC("uprobe")
int cuda_alloc_enter(struct pt_regs *ctx)
{
	on_entry(ctx, api_of(ctx), SHAPE_ALLOC, false);
	return 0;
}

SEC("uprobe")
int cuda_pitch_enter(struct pt_regs *ctx)
{
	on_entry(ctx, api_of(ctx), SHAPE_PITCH, false);
	return 0;
}

SEC("uprobe")
int cuda_count_enter(struct pt_regs *ctx)
{
	on_entry(ctx, api_of(ctx), SHAPE_COUNT, false);
	return 0;
}

SEC("uprobe")
int cuda_free_enter(struct pt_regs *ctx)
{
	on_entry(ctx, api_of(ctx), SHAPE_FREE, false);
	return 0;
}

/* One program per function, for kernels without cookies: user space finds
 * enter_<function> for each entry of pkg/cudatrack's API table. */
#define API_ENTRY(fn, api, shape)                      \
	SEC("uprobe")                                  \
	int enter_##fn(struct pt_regs *ctx)            \
	{                                              \
		on_entry(ctx, api, shape, false);      \
		return 0;                              \
	}

API_ENTRY(cudaMalloc, API_CUDA_MALLOC, SHAPE_ALLOC)
API_ENTRY(cudaMallocAsync, API_CUDA_MALLOC_ASYNC, SHAPE_ALLOC)
API_ENTRY(cudaMallocFromPoolAsync, API_CUDA_MALLOC_FROM_POOL_ASYNC, SHAPE_ALLOC)
API_ENTRY(cudaMallocManaged, API_CUDA_MALLOC_MANAGED, SHAPE_ALLOC)
API_ENTRY(cudaMallocPitch, API_CUDA_MALLOC_PITCH, SHAPE_PITCH)
API_ENTRY(cudaMallocHost, API_CUDA_MALLOC_HOST, SHAPE_ALLOC)
API_ENTRY(cudaHostAlloc, API_CUDA_HOST_ALLOC, SHAPE_ALLOC)
API_ENTRY(cudaFree, API_CUDA_FREE, SHAPE_FREE)
API_ENTRY(cudaFreeAsync, API_CUDA_FREE_ASYNC, SHAPE_FREE)
API_ENTRY(cudaFreeHost, API_CUDA_FREE_HOST, SHAPE_FREE)
API_ENTRY(cuMemAlloc_v2, API_CU_MEM_ALLOC, SHAPE_ALLOC)
API_ENTRY(cuMemAllocAsync, API_CU_MEM_ALLOC_ASYNC, SHAPE_ALLOC)
API_ENTRY(cuMemAllocFromPoolAsync, API_CU_MEM_ALLOC_FROM_POOL_ASYNC, SHAPE_ALLOC)
API_ENTRY(cuMemAllocManaged, API_CU_MEM_ALLOC_MANAGED, SHAPE_ALLOC)
API_ENTRY(cuMemAllocPitch_v2, API_CU_MEM_ALLOC_PITCH, SHAPE_PITCH)
API_ENTRY(cuMemAllocHost_v2, API_CU_MEM_ALLOC_HOST, SHAPE_ALLOC)
API_ENTRY(cuMemHostAlloc, API_CU_MEM_HOST_ALLOC, SHAPE_ALLOC)
API_ENTRY(cuMemFree_v2, API_CU_MEM_FREE, SHAPE_FREE)
API_ENTRY(cuMemFreeAsync, API_CU_MEM_FREE_ASYNC, SHAPE_FREE)
API_ENTRY(cuMemFreeHost, API_CU_MEM_FREE_HOST, SHAPE_FREE)
API_ENTRY(cuMemCreate, API_CU_MEM_CREATE, SHAPE_ALLOC)
API_ENTRY(cuMemRelease, API_CU_MEM_RELEASE, SHAPE_FREE)
API_ENTRY(cuMemMap, API_CU_MEM_MAP, SHAPE_COUNT)
API_ENTRY(cuMemUnmap, API_CU_MEM_UNMAP, SHAPE_COUNT)

static __always_inline void report_failure(struct call_state *st, u32 tgid, u32 tid, s32 code, s32 stack_id)
{
	struct cuda_failure *f = bpf_ringbuf_reserve(&failures, sizeof(*f), 0);
	if (!f) {
		count_err(ERR_RINGBUF);
		return;
	}
	u64 now = bpf_ktime_get_ns();
	f->time_ns = now;
	/* The pitch was never written: the bytes asked for are width x rows. */
	f->size = st->shape == SHAPE_PITCH ? st->width * st->size : st->size;
	f->tgid = tgid;
	f->tid = tid;
	f->code = code;
	f->stack_id = stack_id;
	f->api = st->api;
	f->pad[0] = f->pad[1] = f->pad[2] = 0;
	f->py_stack = capture_py(tgid);
	/* Opened once the record is sure to reach user space, which closes
	 * it. Plain writes: two threads failing at once may both open it,
	 * the later failure's time winning; user space takes one. */
	f->snap_ns = 0;
	struct cuda_snap *s = bpf_map_lookup_elem(&oom_snaps, &tgid);
	if (!s)
		counters_missing(tgid);
	else if (!s->open_ns && now >= s->not_before_ns)
		s->open_ns = f->snap_ns = now;
	s64 *live = bpf_map_lookup_elem(&live_bytes, &tgid);
	f->live_bytes = live ? *live : 0;
	bpf_ringbuf_submit(f, 0);
}

/* Returns the bytes recorded, 0 when the allocation could not be. */
static __always_inline u64 record_alloc(struct call_state *st, u32 tgid, s32 stack_id)
{
	u64 addr = 0;
	if (bpf_probe_read_user(&addr, sizeof(addr), (void *)st->out)) {
		count_err(ERR_READ_USER);
		return 0;
	}
	u64 size = st->size;
	if (st->shape == SHAPE_PITCH) {
		u64 pitch = 0;
		if (bpf_probe_read_user(&pitch, sizeof(pitch), (void *)st->pitch)) {
			count_err(ERR_READ_USER);
			return 0;
		}
		size = pitch * st->size;
	}
	struct cuda_alloc_key key = { .tgid = tgid, .ns = ns_of(st->api), .addr = addr };
	struct cuda_alloc a = {
		.size = size,
		.time_ns = bpf_ktime_get_ns(),
		.stack_id = stack_id,
		.api = st->api,
		.py_stack = capture_py(tgid),
	};
	/* A pointer already in the table was freed by a path we do not hook:
	 * the new allocation replaces it, and its bytes are no longer live. */
	struct cuda_alloc *stale = bpf_map_lookup_elem(&live_allocs, &key);
	struct cuda_alloc old = {};
	if (stale) {
		old = *stale;
		keep_freed(tgid, &key, &old);
	}
	if (bpf_map_update_elem(&live_allocs, &key, &a, BPF_ANY)) {
		count_err(ERR_TABLE_FULL);
		return 0;
	}
	if (stale)
		add_live(tgid, old.api, -(s64)old.size);
	add_live(tgid, st->api, size);
	if (!is_host(st->api))
		count_site(tgid, stack_id, a.py_stack, size, false);
	return size;
}

/* The return of any hooked function of layer: the entry state says what to
 * record. */
static __always_inline void on_return(struct pt_regs *ctx, u32 layer)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32, tid = (u32)id;
	if (!is_tracked(tgid))
		return;
	struct thread_calls *tc = thread_calls(false);
	if (!tc)
		return;
	struct call_state *saved = &tc->layer[layer == LAYER_DRIVER];
	/* The return popped the return address: the stack pointer is 8 above
	 * its value at entry. Lower: a nested call of the same layer returns;
	 * higher: the saved call returned without us (stale state). */
	u64 entry_sp = ENTRY_SP_AT_RETURN(ctx);
	if (saved->sp != entry_sp) {
		if (saved->sp < entry_sp)
			saved->sp = 0;
		return;
	}
	struct call_state st = *saved;
	saved->sp = 0;
	if (st.shape == SHAPE_FREE)
		return; /* recorded at entry */
	u64 bytes = 0;
	if (st.shape != SHAPE_COUNT) {
		s32 code = (s32)PT_REGS_RC(ctx);
		if (code != 0)
			report_failure(&st, tgid, tid, code, st.stack_id);
		else
			bytes = record_alloc(&st, tgid, st.stack_id);
	}
	count(tgid, st.api, bytes, 0);
}

SEC("uretprobe")
int cuda_return_runtime(struct pt_regs *ctx)
{
	on_return(ctx, LAYER_RUNTIME);
	return 0;
}

SEC("uretprobe")
int cuda_return_driver(struct pt_regs *ctx)
{
	on_return(ctx, LAYER_DRIVER);
	return 0;
}

/* Host waits on the GPU (SHAPE_SYNC) and, when user space hooks them,
 * launches (SHAPE_LAUNCH): each call timed from entry to return and summed
 * here, so a thousand synchronisations a second cost user space nothing
 * per call. Waits are summed by (process, API, call site) and by thread;
 * launches by process and API, without stacks (they are too many to unwind
 * each). The timed calls keep their own per-thread state, with the same
 * layer rule as allocations: the driver call a runtime call makes on the
 * same thread is not counted again. */

/* Histogram slots: slot i holds durations of [2^i, 2^(i+1)) units of 2^-30 s
 * (as bpf/sched.bpf.c's run-queue latency), the last slot everything longer. */
#define WAIT_SLOTS 40
#define WAIT_UNIT_MUL 2097152ULL
#define WAIT_UNIT_DIV 1953125ULL
#define WAIT_UNIT_MAX_NS (1ULL << 43)

struct wait_key {
	u32 tgid;
	u16 api;
	u16 pad;
	s32 stack_id; /* the caller's stack (bpf/unwind.h); negative: unknown */
	u32 py_stack; /* Python frames (bpf/pyframes.h); 0: none */
};

struct wait_counts {
	u64 calls;
	u64 total_ns;
	u64 max_ns;
	u64 slots[WAIT_SLOTS];
};

struct wait_thread_key {
	u32 tgid;
	u32 tid;
};

struct wait_thread {
	u64 calls;
	u64 total_ns;
};

/* Per process, summed over CPUs by user space, which makes the entry (with
 * the other counters) when launches are hooked. */
struct launch_counts {
	u64 calls[3]; /* by API, from API_CUDA_LAUNCH_KERNEL on */
	u64 total_ns;
	u64 slots[WAIT_SLOTS];
};

/* Saved at the entry of the outermost timed call of a layer on a thread. A
 * session entry declines the return only where it saved nothing here (see
 * timed_entry), so unlike call_state no state is left behind by a return
 * not run. */
struct timed_call {
	u64 sp; /* as in call_state; 0: none */
	u64 start_ns;
	s32 stack_id;
	u16 api;
	u8 shape;
	u8 pad;
};

struct thread_timed {
	u64 task;
	struct timed_call layer[2];
};

/* Entries are made here and deleted by user space when their process goes;
 * a full table loses what does not fit, counted as ERR_SITES. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory follows use, not capacity */
	__type(key, struct wait_key);
	__type(value, struct wait_counts);
} wait_sites SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct wait_thread_key);
	__type(value, struct wait_thread);
} wait_threads SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, u32);
	__type(value, struct launch_counts);
} launches SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_timed);
} timed_calls SEC(".maps");

/* timed_calls where the kernel has no task storage. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, struct thread_timed);
} timed_calls_tid SEC(".maps");

/* A zeroed value to make new wait sites from: the counts are too large for
 * the stack, which kernels before 5.15 bound at 512 bytes over a chain of
 * calls. Never written. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct wait_counts);
} wait_zero SEC(".maps");

const struct wait_key *unused_wait_key __attribute__((unused));
const struct wait_counts *unused_wait_counts __attribute__((unused));
const struct wait_thread_key *unused_wait_thread_key __attribute__((unused));
const struct wait_thread *unused_wait_thread __attribute__((unused));
const struct launch_counts *unused_launch_counts __attribute__((unused));

static __always_inline u32 timed_layer(u32 api)
{
	return api < API_CU_CTX_SYNCHRONIZE || (api >= API_CUDA_LAUNCH_KERNEL && api < API_CU_LAUNCH_KERNEL) ?
		       LAYER_RUNTIME :
		       LAYER_DRIVER;
}

/* As in_flight, for timed calls. */
static __always_inline bool timed_in_flight(const struct timed_call *st, u64 sp, bool outer_too)
{
	return st->sp > sp || (outer_too && st->sp && st->sp == sp);
}

static __always_inline u32 wait_slot(u64 ns)
{
	if (ns >= WAIT_UNIT_MAX_NS)
		return WAIT_SLOTS - 1;
	u32 slot = log2_u64(ns * WAIT_UNIT_MUL / WAIT_UNIT_DIV);
	return slot < WAIT_SLOTS ? slot : WAIT_SLOTS - 1;
}

/* Saves the entry state of an outermost timed call; false when the call is
 * not ours to time (untracked process, nested call) and nothing was saved:
 * a session entry then declines the return. */
static __always_inline bool timed_entry(struct pt_regs *ctx, u32 api, u8 shape)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!is_tracked(tgid) || api >= API_MAX)
		return false;
	struct thread_timed init = {};
	struct thread_timed *tt = thread_state(&timed_calls, &timed_calls_tid, &init, true);
	if (!tt) {
		count_err(ERR_ENTRY_STATE);
		return false;
	}
	u64 sp = PT_REGS_SP(ctx);
	u32 layer = timed_layer(api);
	if (layer == LAYER_DRIVER && timed_in_flight(&tt->layer[LAYER_RUNTIME], sp, true))
		return false;
	struct timed_call *st = &tt->layer[layer == LAYER_DRIVER];
	if (timed_in_flight(st, sp, false))
		return false;
	st->sp = sp;
	st->api = api;
	st->shape = shape;
	/* The stack before the clock starts: the walk is not the GPU's time. */
	st->stack_id = shape == SHAPE_SYNC ? unwind_at_entry(tgid, sp, PT_REGS_FP(ctx), UPROBE_LR(ctx)) : -1;
	st->start_ns = bpf_ktime_get_ns();
	return true;
}

/* Adds one wait of ns to its site and thread. */
static __always_inline void count_wait(u32 tgid, u32 tid, const struct timed_call *st, u64 ns)
{
	u32 slot = wait_slot(ns);
	asm volatile("" : "+r"(slot));
	if (slot >= WAIT_SLOTS)
		return;
	struct wait_key key = { .tgid = tgid, .api = st->api, .stack_id = st->stack_id, .py_stack = capture_py(tgid) };
	struct wait_counts *w = bpf_map_lookup_elem(&wait_sites, &key);
	if (!w) {
		u32 zero = 0;
		const struct wait_counts *z = bpf_map_lookup_elem(&wait_zero, &zero);
		/* Another thread may make it first: then the lookup finds theirs. */
		if (z)
			bpf_map_update_elem(&wait_sites, &key, z, BPF_NOEXIST);
		w = bpf_map_lookup_elem(&wait_sites, &key);
	}
	if (w) {
		/* Threads of a process share a site: atomic adds whose results
		 * are unused, the one atomic every kernel takes. The longest wait
		 * is raised without a lock: two racing CPUs may keep the shorter
		 * of their two. */
		__sync_fetch_and_add(&w->calls, 1);
		__sync_fetch_and_add(&w->total_ns, ns);
		__sync_fetch_and_add(&w->slots[slot], 1);
		if (w->max_ns < ns)
			w->max_ns = ns;
	} else {
		count_err(ERR_SITES);
	}
	/* Only this thread writes its entry: plain adds. */
	struct wait_thread_key tk = { .tgid = tgid, .tid = tid };
	struct wait_thread *t = bpf_map_lookup_elem(&wait_threads, &tk);
	if (!t) {
		struct wait_thread zero = {};
		bpf_map_update_elem(&wait_threads, &tk, &zero, BPF_NOEXIST);
		t = bpf_map_lookup_elem(&wait_threads, &tk);
		if (!t) {
			count_err(ERR_SITES);
			return;
		}
	}
	t->calls++;
	t->total_ns += ns;
}

/* Adds one launch of ns to its process. */
static __always_inline void count_launch(u32 tgid, u32 api, u64 ns)
{
	u32 slot = wait_slot(ns);
	u32 k = api - API_CUDA_LAUNCH_KERNEL;
	asm volatile("" : "+r"(slot), "+r"(k));
	if (slot >= WAIT_SLOTS || k >= 3)
		return;
	struct launch_counts *l = bpf_map_lookup_elem(&launches, &tgid);
	if (!l) {
		counters_missing(tgid);
		return;
	}
	/* Per CPU: plain adds. */
	l->calls[k]++;
	l->total_ns += ns;
	l->slots[slot]++;
}

static __always_inline void timed_return(struct pt_regs *ctx, u32 layer)
{
	u64 end = bpf_ktime_get_ns();
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32, tid = (u32)id;
	if (!is_tracked(tgid))
		return;
	struct thread_timed *tt = thread_state(&timed_calls, &timed_calls_tid, NULL, false);
	if (!tt)
		return;
	struct timed_call *saved = &tt->layer[layer == LAYER_DRIVER];
	/* As in on_return. */
	u64 entry_sp = ENTRY_SP_AT_RETURN(ctx);
	if (saved->sp != entry_sp) {
		if (saved->sp < entry_sp)
			saved->sp = 0;
		return;
	}
	struct timed_call st = *saved;
	saved->sp = 0;
	u64 ns = end - st.start_ns;
	if (st.shape == SHAPE_LAUNCH)
		count_launch(tgid, st.api, ns);
	else
		count_wait(tgid, tid, &st, ns);
}

SEC("uprobe")
int cuda_sync_enter(struct pt_regs *ctx)
{
	timed_entry(ctx, api_of(ctx), SHAPE_SYNC);
	return 0;
}

SEC("uprobe")
int cuda_launch_enter(struct pt_regs *ctx)
{
	timed_entry(ctx, api_of(ctx), SHAPE_LAUNCH);
	return 0;
}

SEC("uretprobe")
int cuda_timed_return_runtime(struct pt_regs *ctx)
{
	timed_return(ctx, LAYER_RUNTIME);
	return 0;
}

SEC("uretprobe")
int cuda_timed_return_driver(struct pt_regs *ctx)
{
	timed_return(ctx, LAYER_DRIVER);
	return 0;
}

/* Kernels without cookies, as API_ENTRY. */
#define TIMED_ENTRY(fn, api, shape)                    \
	SEC("uprobe")                                  \
	int enter_##fn(struct pt_regs *ctx)            \
	{                                              \
		timed_entry(ctx, api, shape);          \
		return 0;                              \
	}

TIMED_ENTRY(cudaDeviceSynchronize, API_CUDA_DEVICE_SYNCHRONIZE, SHAPE_SYNC)
TIMED_ENTRY(cudaStreamSynchronize, API_CUDA_STREAM_SYNCHRONIZE, SHAPE_SYNC)
TIMED_ENTRY(cudaEventSynchronize, API_CUDA_EVENT_SYNCHRONIZE, SHAPE_SYNC)
TIMED_ENTRY(cudaMemcpy, API_CUDA_MEMCPY, SHAPE_SYNC)
TIMED_ENTRY(cuCtxSynchronize, API_CU_CTX_SYNCHRONIZE, SHAPE_SYNC)
TIMED_ENTRY(cuStreamSynchronize, API_CU_STREAM_SYNCHRONIZE, SHAPE_SYNC)
TIMED_ENTRY(cuEventSynchronize, API_CU_EVENT_SYNCHRONIZE, SHAPE_SYNC)
TIMED_ENTRY(cuMemcpyDtoH_v2, API_CU_MEMCPY_DTOH, SHAPE_SYNC)
TIMED_ENTRY(cuMemcpyHtoD_v2, API_CU_MEMCPY_HTOD, SHAPE_SYNC)
TIMED_ENTRY(cuMemcpyDtoD_v2, API_CU_MEMCPY_DTOD, SHAPE_SYNC)
TIMED_ENTRY(cudaLaunchKernel, API_CUDA_LAUNCH_KERNEL, SHAPE_LAUNCH)
TIMED_ENTRY(cudaGraphLaunch, API_CUDA_GRAPH_LAUNCH, SHAPE_LAUNCH)
TIMED_ENTRY(cuLaunchKernel, API_CU_LAUNCH_KERNEL, SHAPE_LAUNCH)

/* Session uprobes (6.13+), kfuncs: absent elsewhere, where these programs
 * are not loaded. */
extern bool bpf_session_is_return(void) __ksym __weak;

/* One program per shape serves the entry and the return of its functions:
 * the entry returns 0 to have the return run, 1 to decline it. */
static __always_inline int on_session(struct pt_regs *ctx, u8 shape)
{
	u32 api = api_of(ctx);
	if (bpf_session_is_return()) {
		on_return(ctx, layer_of(api));
		return 0;
	}
	return on_entry(ctx, api, shape, true) ? 0 : 1;
}

SEC("uprobe.session")
int cuda_alloc_session(struct pt_regs *ctx)
{
	return on_session(ctx, SHAPE_ALLOC);
}

SEC("uprobe.session")
int cuda_pitch_session(struct pt_regs *ctx)
{
	return on_session(ctx, SHAPE_PITCH);
}

SEC("uprobe.session")
int cuda_count_session(struct pt_regs *ctx)
{
	return on_session(ctx, SHAPE_COUNT);
}

SEC("uprobe.session")
int cuda_free_session(struct pt_regs *ctx)
{
	return on_session(ctx, SHAPE_FREE);
}

/* Timed calls: the start time stays in the per-thread state, not in the
 * session's cookie, as the nesting check reads that state anyway. */
static __always_inline int on_timed_session(struct pt_regs *ctx, u8 shape)
{
	u32 api = api_of(ctx);
	if (bpf_session_is_return()) {
		timed_return(ctx, timed_layer(api));
		return 0;
	}
	return timed_entry(ctx, api, shape) ? 0 : 1;
}

SEC("uprobe.session")
int cuda_sync_session(struct pt_regs *ctx)
{
	return on_timed_session(ctx, SHAPE_SYNC);
}

SEC("uprobe.session")
int cuda_launch_session(struct pt_regs *ctx)
{
	return on_timed_session(ctx, SHAPE_LAUNCH);
}
