// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
/* NCCL progress per communicator and rank: uprobes on libnccl.so.2,
 * attached per library file by user space and filtered by tracked_pids.
 *
 * Communicator set-up (ncclCommInitRank, ncclCommInitRankConfig,
 * ncclCommInitAll, ncclCommSplit) is hooked at entry and return: the entry
 * saves what the communicator is (a hash of its ncclUniqueId, this rank, the
 * number of ranks) and where the library will write its handle; the return
 * reads the handle and files it in comms. Tear-down (ncclCommDestroy,
 * ncclCommAbort) marks the communicator at entry. Collectives and
 * point-to-point calls are hooked at entry only: per (process, handle) the
 * calls and bytes of each operation, the last call's time and operation,
 * and, at most every SITE_EVERY_NS per communicator or when the operation
 * changes, its call site (stack and Python frames): unwinding is the
 * costly part, and a rank's collectives come from a few lines.
 *
 * The operation of each attach point comes from its cookie; kernels without
 * cookies (before 5.15) get one entry program per function, each with its
 * operation built in; user space loads one set. */
#include "tracked.h"
#include "pyframes.h"
#include "unwind.h"

/* Hooked functions; the cookie of each attach point. The Go table in
 * pkg/nccltrack/ops.go follows this order. Collectives and point-to-point
 * calls first (counted), then set-up and tear-down. */
enum nccl_op {
	NCCL_OP_ALL_REDUCE = 0,
	NCCL_OP_ALL_GATHER,
	NCCL_OP_REDUCE_SCATTER,
	NCCL_OP_BROADCAST,
	NCCL_OP_BCAST, /* NCCL 1's in-place broadcast, still exported */
	NCCL_OP_REDUCE,
	NCCL_OP_SEND,
	NCCL_OP_RECV,
	NCCL_OP_COUNTED, /* the number of counted operations */
	NCCL_OP_INIT_RANK = NCCL_OP_COUNTED,
	NCCL_OP_INIT_RANK_CONFIG,
	NCCL_OP_INIT_ALL,
	NCCL_OP_SPLIT,
	NCCL_OP_DESTROY,
	NCCL_OP_ABORT,
	NCCL_OP_MAX,
};

/* How a communicator was set up, in nccl_comm.how. */
enum nccl_how {
	NCCL_HOW_UNIQUE_ID = 0, /* ncclCommInitRank(Config): id from the unique id */
	NCCL_HOW_INIT_ALL = 1,  /* ncclCommInitAll: one process, every device */
	NCCL_HOW_SPLIT = 2,     /* ncclCommSplit: id from the parent's and the colour; rank unknown */
};

/* ncclCommInitAll: the devices of one call whose handles are read. */
#define MAX_INIT_ALL 16
#define NCCL_UNIQUE_ID_BYTES 128
#define NCCL_SUCCESS 0
#define NCCL_IN_PROGRESS 7 /* a non-blocking set-up: the handle is written */
#define SITE_EVERY_NS 100000000ULL

/* A communicator handle (ncclComm_t) of one process. */
struct nccl_key {
	u32 tgid;
	u32 pad;
	u64 comm;
};

/* What a communicator is, from its set-up. */
struct nccl_comm {
	u64 id;      /* the same in every rank: a hash of the unique id */
	s32 rank;    /* -1: unknown (a split's) */
	s32 nranks;  /* -1: unknown (a split's) */
	u64 init_ns; /* when its set-up returned */
	u8 how;      /* enum nccl_how */
	u8 destroyed;
	u8 pad[6];
};

/* What one process did on one communicator handle since tracking began. */
struct nccl_counts {
	u64 calls[NCCL_OP_COUNTED];
	u64 bytes[NCCL_OP_COUNTED];
	u64 last_ns;  /* the last call's entry, bpf_ktime_get_ns */
	u64 site_ns;  /* when its call site was last taken */
	u32 last_op;
	s32 stack_id; /* the call site last taken, an id in unwound_stacks; negative: none */
	u32 py_stack; /* its Python frames, an id in py_stacks; 0: none */
	u32 site_op;  /* the operation whose site that is */
};

/* Saved at the entry of a set-up call, read at its return. */
struct setup_state {
	u64 task;
	u64 sp;  /* user stack pointer at entry; 0: none in flight */
	u64 out; /* where the handle (or ncclCommInitAll's array) is written */
	u64 id;
	s32 rank, nranks;
	u8 how;
	u8 pad[7];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct nccl_key);
	__type(value, struct nccl_comm);
} comms SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct nccl_key);
	__type(value, struct nccl_counts);
} nccl_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct setup_state);
} setups SEC(".maps");

/* setups where the kernel has no task storage. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct setup_state);
} setups_tid SEC(".maps");

/* Force the shared types into BTF so bpf2go can generate them. */
const struct nccl_key *unused_nccl_key __attribute__((unused));
const struct nccl_comm *unused_nccl_comm __attribute__((unused));
const struct nccl_counts *unused_nccl_counts __attribute__((unused));
const enum nccl_op *unused_nccl_op __attribute__((unused));
const enum nccl_how *unused_nccl_how __attribute__((unused));
const enum err_kind *unused_err_kind __attribute__((unused));

/* FNV-1a over 64-bit words: the same id from the same bytes on every node. */
static __always_inline u64 mix(u64 h, u64 w)
{
	return (h ^ w) * 0x100000001b3ULL;
}

#define FNV_OFFSET 0xcbf29ce484222325ULL

/* Bytes per element of ncclDataType_t (nccl.h); 0: unknown. */
static __always_inline u64 type_size(u64 t)
{
	switch (t) {
	case 0: /* ncclInt8 */
	case 1: /* ncclUint8 */
	case 10: /* ncclFloat8e4m3 */
	case 11: /* ncclFloat8e5m2 */
		return 1;
	case 6: /* ncclFloat16 */
	case 9: /* ncclBfloat16 */
		return 2;
	case 2: /* ncclInt32 */
	case 3: /* ncclUint32 */
	case 7: /* ncclFloat32 */
		return 4;
	case 4: /* ncclInt64 */
	case 5: /* ncclUint64 */
	case 8: /* ncclFloat64 */
		return 8;
	}
	return 0;
}

/* Unwinds from the registers of a uprobe at a function's first instruction
 * (as in bpf/cuda.bpf.c): the stack starts at the caller. */
__noinline int unwind_at_entry(u32 tgid, u64 sp, u64 fp, u64 lr)
{
	u64 pc = 0, caller_sp = 0;
	if (!entry_caller(sp, lr, &pc, &caller_sp)) {
		count_err(ERR_READ_USER);
		return -1;
	}
	return unwind_user(tgid, pc, caller_sp, fp, 0, false, UNWIND_MAX_FRAMES);
}

static __always_inline u32 op_of(struct pt_regs *ctx)
{
	u64 op = bpf_get_attach_cookie(ctx);
	return op < NCCL_OP_MAX ? (u32)op : NCCL_OP_MAX;
}

/* A collective or point-to-point call: counted under its handle. */
static __always_inline void on_collective(struct pt_regs *ctx, u32 op)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!is_tracked(tgid))
		return;
	/* The argument registers, each read once before the switch: clang
	 * would merge the cases' reads into one load at an offset it computes
	 * from ctx (arm64's registers are an array), which the verifier
	 * refuses. */
	u64 a2 = PT_REGS_PARM2(ctx), a3 = PT_REGS_PARM3(ctx), a4 = PT_REGS_PARM4(ctx);
	u64 a5 = PT_REGS_PARM5(ctx), a6 = UPROBE_PARM6(ctx);
	asm volatile("" : "+r"(a2), "+r"(a3), "+r"(a4), "+r"(a5), "+r"(a6));
	u64 count, type, comm = 0;
	switch (op) {
	case NCCL_OP_ALL_REDUCE:     /* (send, recv, count, type, redop, comm, stream) */
	case NCCL_OP_REDUCE_SCATTER: /* (send, recv, recvcount, type, redop, comm, stream) */
	case NCCL_OP_BROADCAST:      /* (send, recv, count, type, root, comm, stream) */
		count = a3;
		type = a4;
		comm = a6;
		break;
	case NCCL_OP_ALL_GATHER: /* (send, recv, sendcount, type, comm, stream) */
		count = a3;
		type = a4;
		comm = a5;
		break;
	case NCCL_OP_BCAST: /* (buff, count, type, root, comm, stream) */
	case NCCL_OP_SEND:  /* (send, count, type, peer, comm, stream) */
	case NCCL_OP_RECV:  /* (recv, count, type, peer, comm, stream) */
		count = a2;
		type = a3;
		comm = a5;
		break;
	case NCCL_OP_REDUCE: /* (send, recv, count, type, redop, root, comm, stream) */
		count = a3;
		type = a4;
		if (!uprobe_parm7(ctx, &comm)) {
			count_err(ERR_READ_USER);
			return;
		}
		break;
	default:
		return;
	}
	struct nccl_key key = { .tgid = tgid, .comm = comm };
	struct nccl_counts *c = bpf_map_lookup_elem(&nccl_counters, &key);
	if (!c) {
		/* The first call on this handle: made here, deleted by user
		 * space when the process goes. */
		struct nccl_counts zero = { .stack_id = -1 };
		/* EEXIST: another thread made it meanwhile. */
		bpf_map_update_elem(&nccl_counters, &key, &zero, BPF_NOEXIST);
		c = bpf_map_lookup_elem(&nccl_counters, &key);
		if (!c) {
			count_err(ERR_COUNTERS);
			return;
		}
	}
	u32 k = op;
	asm volatile("" : "+r"(k));
	if (k >= NCCL_OP_COUNTED)
		return;
	/* Atomic adds whose results are unused: the one atomic every kernel
	 * takes; two threads may call on one communicator at once. */
	__sync_fetch_and_add(&c->calls[k], 1);
	__sync_fetch_and_add(&c->bytes[k], count * type_size(type));
	u64 now = bpf_ktime_get_ns();
	c->last_ns = now;
	c->last_op = op;
	/* A failed unwind waits its turn too: retrying at every call would
	 * cost the most where the unwinder cannot help. */
	if (c->site_op == op && c->site_ns && now - c->site_ns < SITE_EVERY_NS)
		return;
	c->site_ns = now;
	c->site_op = op;
	c->stack_id = unwind_at_entry(tgid, PT_REGS_SP(ctx), PT_REGS_FP(ctx), UPROBE_LR(ctx));
	c->py_stack = capture_py(tgid);
}

static __always_inline struct setup_state *setup_state(bool create)
{
	struct setup_state init = {};
	return thread_state(&setups, &setups_tid, &init, create);
}

/* The entry of a set-up call. */
static __always_inline void on_setup(struct pt_regs *ctx, u32 op)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!is_tracked(tgid))
		return;
	struct setup_state *st = setup_state(true);
	if (!st) {
		count_err(ERR_ENTRY_STATE);
		return;
	}
	u64 sp = PT_REGS_SP(ctx);
	/* One set-up calling another inside the library: the outer one says
	 * what the communicator is. */
	if (st->sp > sp)
		return;
	u64 id = FNV_OFFSET, out;
	switch (op) {
	case NCCL_OP_INIT_RANK:        /* (comm *, nranks, ncclUniqueId by value, rank) */
	case NCCL_OP_INIT_RANK_CONFIG: /* (comm *, nranks, ncclUniqueId by value, rank, config) */ {
		/* A 128-byte struct passed by value: where it is, and the rank
		 * after it, are the ABI's (bpf/arch.h). */
		u64 words[NCCL_UNIQUE_ID_BYTES / 8];
		if (bpf_probe_read_user(words, sizeof(words), (void *)BYVAL3_ADDR(ctx))) {
			count_err(ERR_READ_USER);
			return;
		}
#pragma unroll
		for (int i = 0; i < NCCL_UNIQUE_ID_BYTES / 8; i++)
			id = mix(id, words[i]);
		st->rank = (s32)BYVAL3_NEXT(ctx);
		st->nranks = (s32)PT_REGS_PARM2(ctx);
		st->how = NCCL_HOW_UNIQUE_ID;
		out = PT_REGS_PARM1(ctx);
		break;
	}
	case NCCL_OP_INIT_ALL: /* (comm *array, ndev, devlist) */
		/* Every rank in this process: an id of its own, from the process,
		 * the array and the time. */
		id = mix(mix(mix(id, tgid), PT_REGS_PARM1(ctx)), bpf_ktime_get_ns());
		st->rank = 0;
		st->nranks = (s32)PT_REGS_PARM2(ctx);
		st->how = NCCL_HOW_INIT_ALL;
		out = PT_REGS_PARM1(ctx);
		break;
	case NCCL_OP_SPLIT: /* (parent, colour, key, comm *newcomm, config) */ {
		struct nccl_key pk = { .tgid = tgid, .comm = PT_REGS_PARM1(ctx) };
		struct nccl_comm *parent = bpf_map_lookup_elem(&comms, &pk);
		s32 colour = (s32)PT_REGS_PARM2(ctx);
		/* NCCL_SPLIT_NOCOLOR: this rank takes no part. A parent set up
		 * before tracking began has no id to derive one from. */
		if (!parent || colour < 0)
			return;
		id = mix(mix(id, parent->id), (u64)(u32)colour);
		/* The new rank and size are agreed among the peers inside the
		 * call: nothing here says them. */
		st->rank = -1;
		st->nranks = -1;
		st->how = NCCL_HOW_SPLIT;
		out = PT_REGS_PARM4(ctx);
		break;
	}
	default:
		return;
	}
	st->id = id;
	/* Read in each case: a ctx field chosen by a ternary is a modified ctx
	 * pointer to the verifier. */
	st->out = out;
	st->sp = sp;
}

static __always_inline void file_comm(u32 tgid, u64 handle, const struct nccl_comm *c)
{
	if (!handle)
		return;
	struct nccl_key key = { .tgid = tgid, .comm = handle };
	if (bpf_map_update_elem(&comms, &key, c, BPF_ANY))
		count_err(ERR_TABLE_FULL);
}

/* The return of any set-up call: the handle written, the communicator is
 * filed under it. */
static __always_inline void on_setup_return(struct pt_regs *ctx)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!is_tracked(tgid))
		return;
	struct setup_state *saved = setup_state(false);
	if (!saved)
		return;
	/* As in bpf/cuda.bpf.c: the return popped the return address. Lower:
	 * a nested call returns; higher: the saved call returned unseen. */
	u64 entry_sp = ENTRY_SP_AT_RETURN(ctx);
	if (saved->sp != entry_sp) {
		if (saved->sp < entry_sp)
			saved->sp = 0;
		return;
	}
	struct setup_state st = *saved;
	saved->sp = 0;
	s32 rc = (s32)PT_REGS_RC(ctx);
	if (rc != NCCL_SUCCESS && rc != NCCL_IN_PROGRESS)
		return;
	struct nccl_comm c = { .id = st.id, .rank = st.rank, .nranks = st.nranks, .init_ns = bpf_ktime_get_ns(), .how = st.how };
	if (st.how != NCCL_HOW_INIT_ALL) {
		u64 handle = 0;
		if (bpf_probe_read_user(&handle, sizeof(handle), (void *)st.out)) {
			count_err(ERR_READ_USER);
			return;
		}
		file_comm(tgid, handle, &c);
		return;
	}
	/* One handle per device, rank by position; past MAX_INIT_ALL devices
	 * the rest are not filed. */
	for (int i = 0; i < MAX_INIT_ALL; i++) {
		if (i >= st.nranks)
			break;
		u64 handle = 0;
		if (bpf_probe_read_user(&handle, sizeof(handle), (void *)(st.out + i * sizeof(u64)))) {
			count_err(ERR_READ_USER);
			return;
		}
		c.rank = i;
		file_comm(tgid, handle, &c);
	}
}

/* ncclCommDestroy, ncclCommAbort: the handle's communicator is marked; its
 * counts stay. */
static __always_inline void on_teardown(struct pt_regs *ctx)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	if (!is_tracked(tgid))
		return;
	struct nccl_key key = { .tgid = tgid, .comm = PT_REGS_PARM1(ctx) };
	struct nccl_comm *c = bpf_map_lookup_elem(&comms, &key);
	if (c)
		c->destroyed = 1;
}

static __always_inline void on_entry(struct pt_regs *ctx, u32 op)
{
	if (op < NCCL_OP_COUNTED)
		on_collective(ctx, op);
	else if (op == NCCL_OP_DESTROY || op == NCCL_OP_ABORT)
		on_teardown(ctx);
	else if (op < NCCL_OP_MAX)
		on_setup(ctx, op);
}

/* One entry program for every function, the operation from the cookie. */
SEC("uprobe")
int nccl_enter(struct pt_regs *ctx)
{
	on_entry(ctx, op_of(ctx));
	return 0;
}

SEC("uretprobe")
int nccl_setup_return(struct pt_regs *ctx)
{
	on_setup_return(ctx);
	return 0;
}

/* One program per function, for kernels without cookies: user space finds
 * enter_<function> for each entry of pkg/nccltrack's table. */
#define OP_ENTRY(fn, op)                               \
	SEC("uprobe")                                  \
	int enter_##fn(struct pt_regs *ctx)            \
	{                                              \
		on_entry(ctx, op);                     \
		return 0;                              \
	}

OP_ENTRY(ncclAllReduce, NCCL_OP_ALL_REDUCE)
OP_ENTRY(ncclAllGather, NCCL_OP_ALL_GATHER)
OP_ENTRY(ncclReduceScatter, NCCL_OP_REDUCE_SCATTER)
OP_ENTRY(ncclBroadcast, NCCL_OP_BROADCAST)
OP_ENTRY(ncclBcast, NCCL_OP_BCAST)
OP_ENTRY(ncclReduce, NCCL_OP_REDUCE)
OP_ENTRY(ncclSend, NCCL_OP_SEND)
OP_ENTRY(ncclRecv, NCCL_OP_RECV)
OP_ENTRY(ncclCommInitRank, NCCL_OP_INIT_RANK)
OP_ENTRY(ncclCommInitRankConfig, NCCL_OP_INIT_RANK_CONFIG)
OP_ENTRY(ncclCommInitAll, NCCL_OP_INIT_ALL)
OP_ENTRY(ncclCommSplit, NCCL_OP_SPLIT)
OP_ENTRY(ncclCommDestroy, NCCL_OP_DESTROY)
OP_ENTRY(ncclCommAbort, NCCL_OP_ABORT)
