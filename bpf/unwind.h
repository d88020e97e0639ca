/* User stacks of code built without frame pointers (distribution libraries,
 * -O2 builds: the common case), unwound in the kernel with rules that user
 * space learns from the binaries' call-frame information (.eh_frame).
 *
 * The kernel's own user-stack walker (bpf_get_stackid) follows the frame
 * pointer chain: in code that uses rbp as a general register it returns
 * garbage or stops after one frame. Unwinding needs, at each frame, where the
 * caller's frame starts (the canonical frame address, CFA) and where the
 * caller's rbp was saved. That is a property of the instruction alone, so
 * user space computes it once per return address and stores it in
 * unwind_rules; the kernel walks with those rules and, at the first address
 * without one, sends user space the registers and a bounded copy of the stack
 * from there (unwind_requests). User space unwinds that copy with .eh_frame,
 * completes the stack under the id the kernel chose, and adds the rules it
 * used, so the next call from the same site unwinds entirely in the kernel.
 *
 * Rules are keyed by file and file offset, not by process: every process
 * mapping a library (32 workers mapping libtorch, or libc and python)
 * shares one rule per instruction, whoever taught it. Which file an address
 * is in comes from unwind_mappings, a trie of each tracked process's
 * executable mappings that user space enters when it starts tracking the
 * process, so that a process's first stack through code another process
 * taught is unwound in the kernel too: a site costs one copy, not one per
 * process. The walk searches the trie only when a frame leaves the mapping
 * of the frame before. An address no file mapping covers (anonymous code:
 * JIT compilers; or a library loaded since, whose first request makes user
 * space enter it) has rules of its process's own, by address.
 *
 * A caller's rule is looked up at its return address minus one, inside the
 * call instruction, so that a call ending a function (noreturn) still finds
 * that function's row; the innermost frame's at its exact address when the
 * walk starts at an instruction pointer (a syscall) rather than at a return
 * address (a function's entry).
 *
 * x86-64 and AArch64. The stack pointer and the frame pointer (rbp; x29)
 * are the only registers a CFA is computed from in compiled code (anything
 * else, such as the stack realignment of main, ends the stack). The return
 * address is on the stack at CFA + ra_off (x86-64: always CFA - 8, where the
 * call pushed it), or on AArch64 still in the link register x30: at a
 * function's first instructions and in leaf functions, such as the syscall
 * wrappers of glibc. Only the innermost frame has that register's value (lr;
 * 0 where unknown). AArch64 return addresses may carry a pointer
 * authentication code in their upper bits (-mbranch-protection): every one
 * read is masked with unwind_ra_mask, which user space sets from the virtual
 * address size. */
#pragma once

#include "common.h"

#define UNWIND_MAX_FRAMES 64
#define UNWIND_COPY_CHUNK 512
#define UNWIND_COPY_CHUNKS 16 /* 8 KiB of stack per request */

enum unwind_cfa {
	CFA_END = 0, /* no caller: the outermost frame, or not unwindable */
	CFA_RSP = 1, /* CFA = rsp + cfa_off */
	CFA_RBP = 2, /* CFA = rbp + cfa_off */
};

/* RSP and RBP are the stack and frame pointer registers: sp and x29 on
 * AArch64. */
enum unwind_rbp {
	RBP_SAME = 0,      /* the caller's rbp is the current one */
	RBP_AT_CFA = 1,    /* saved at CFA + rbp_off */
	RBP_UNDEFINED = 2, /* not recoverable */
};

enum unwind_ra {
	RA_AT_CFA = 0, /* the return address is saved at CFA + ra_off */
	RA_IN_LR = 1,  /* still in the link register (AArch64): the innermost frame's lr */
};

/* Bits of a return address that are the address (user space sets it: on
 * AArch64 those below the virtual address size, the rest being a pointer
 * authentication code; all elsewhere). */
const volatile u64 unwind_ra_mask = ~0ULL;

/* Rules are the code's, not the process's: one per instruction of a file,
 * keyed by the file's id (user space: a hash of its build id, else of its
 * device and inode; bit 63 clear) and the instruction's offset in the file,
 * whatever process maps it where. Code of no file (anonymous memory: JIT
 * compilers; a file user space cannot read) has rules of the process's own,
 * keyed by unwind_own_code() and the address. */
struct unwind_key {
	u64 file;
	u64 at; /* offset in the file, or address in the process's own code */
};

struct unwind_rule {
	u8 cfa; /* enum unwind_cfa */
	u8 rbp; /* enum unwind_rbp */
	u8 ra;  /* enum unwind_ra */
	u8 pad;
	s32 cfa_off;
	s32 rbp_off;
	s32 ra_off;
};

/* A process's address space, named so that user space can name it too,
 * from /proc/PID/stat (startstack and start_brk, fields 28 and 47): both are
 * set by exec and randomized independently, so an exec, which replaces the
 * mappings, changes it. The mm pointer would do for the kernel alone, but
 * user space could learn it only from a request: naming the space from
 * /proc lets it enter a process's mappings when it starts tracking it,
 * before the process's first stack. */
static __always_inline u64 unwind_asid(struct mm_struct *mm)
{
	return BPF_CORE_READ(mm, start_stack) * 0x9e3779b97f4a7c15ULL ^ BPF_CORE_READ(mm, start_brk);
}

/* The id under which the rules of a process's own code are kept: bit 63
 * set, so that no file's id is one, then 31 bits of the address space (the
 * rules of the image an exec replaced are not the new one's) and the tgid. */
#define UNWIND_OWN_CODE (1ULL << 63)

static __always_inline u64 unwind_own_code(u32 tgid, u64 asid)
{
	return UNWIND_OWN_CODE | (asid & 0x7fffffff00000000ULL) | tgid;
}

/* Which file each address of a process maps, for the rule lookups: a
 * longest-prefix-match trie over (tgid, address space, address), so that
 * one entry covers an aligned block of addresses. User space splits each
 * executable mapping into such blocks when it starts tracking a process
 * (and again when a request shows one it does not know: dlopen), and
 * removes them once no view tracks the process. An exec'd process has
 * another address space: the old image's entries never match it. The trie
 * matches bytes in order: the fields after prefixlen are big-endian. */
struct unwind_mapping_key {
	u32 prefixlen; /* 96 + the bits of addr the block shares */
	u32 tgid;
	u64 asid;
	u64 addr;
};

#define UNWIND_MAPPING_BITS (8 * (sizeof(struct unwind_mapping_key) - sizeof(u32)))

struct unwind_mapping {
	u64 file;  /* the file's id; 0: the process's own code (anonymous) */
	u64 bias;  /* an address's file offset is the address - bias */
	u64 start; /* the whole mapping, beyond this block: frames after the */
	u64 end;   /* first one in it need no lookup */
};

/* Stack ids below this are hashes of the frames (the kernel unwound the whole
 * stack); ids from it up were handed to a request and user space fills them. */
#define UNWIND_REQUEST_IDS 0x40000000

struct unwound_stack {
	u64 hash;
	u32 n;
	u32 truncated; /* 1: the walk stopped early (request lost, max frames) */
	u64 pcs[UNWIND_MAX_FRAMES];
};

/* What user space needs to finish a stack the kernel could not: the frames
 * so far (the last, pc, is the one without a rule), the registers at pc (lr:
 * the link register where pc is the innermost frame's, else 0) and the
 * stack from sp up. */
struct unwind_request {
	u64 mm;
	u64 asid; /* unwind_asid(): which mappings user space must know */
	u64 hash; /* of pcs[0..n): with mm, the key of the request in unwind_pending */
	u32 tgid;
	s32 stack_id;
	u64 sp;
	u64 bp;
	u64 lr;
	u32 n;
	u32 copied; /* bytes of stack from sp */
	u32 exact;  /* pcs[n - 1] is an instruction pointer, not a return address */
	u32 max;    /* frames wanted in all */
	u64 pcs[UNWIND_MAX_FRAMES];
	u8 stack[UNWIND_COPY_CHUNK * UNWIND_COPY_CHUNKS];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct unwind_key);
	__type(value, struct unwind_rule);
} unwind_rules SEC(".maps");

/* Sized from the processes tracked (pkg/stacks). */
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct unwind_mapping_key);
	__type(value, struct unwind_mapping);
} unwind_mappings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, struct unwound_stack);
} unwound_stacks SEC(".maps");

/* About 29 requests: user space answers each in well under a millisecond,
 * and a burst from one site joins a request in flight once the ring is half
 * full. User space maps the whole ring (twice, for records that wrap) and
 * all of it counts in its resident memory. */
#define UNWIND_RING_BYTES (256 * 1024)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, UNWIND_RING_BYTES);
} unwind_requests SEC(".maps");

/* Requests in flight, by address space and hash of the frames so far. When
 * the ring is half full (a burst of allocations from a new site, faster than
 * user space answers), an event that stops where a request in flight did
 * takes that request's stack id instead of sending another copy. Its frames
 * further out are assumed to be the request's: exact for a burst from one
 * site, and only under pressure. User space deletes the entry once it has
 * answered; LRU drops any it missed. */
struct unwind_pending_key {
	u64 mm;
	u64 hash;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct unwind_pending_key);
	__type(value, s32);
} unwind_pending SEC(".maps");

/* The next request id of each CPU. A request id is the CPU's number and its
 * count: unique without an atomic fetch-and-add, which kernels before 5.12
 * refuse anywhere in a program. */
#define UNWIND_SEQ_BITS 20

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u32);
} unwind_seq SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct unwound_stack);
} unwind_scratch SEC(".maps");

const struct unwind_key *unused_unwind_key __attribute__((unused));
const struct unwind_rule *unused_unwind_rule __attribute__((unused));
const struct unwind_mapping_key *unused_unwind_mapping_key __attribute__((unused));
const struct unwind_mapping *unused_unwind_mapping __attribute__((unused));
const struct unwound_stack *unused_unwound_stack __attribute__((unused));
const struct unwind_request *unused_unwind_request __attribute__((unused));
const struct unwind_pending_key *unused_unwind_pending_key __attribute__((unused));

/* FNV-1a over the frames, a word at a time; user space does not recompute
 * it, it only has to tell stacks apart within one map. */
static __always_inline u64 unwind_hash(u64 h, u64 pc)
{
	return (h ^ pc) * 0x100000001b3ULL;
}

/* Stores the stack in s under an id derived from its hash, probing a few
 * neighbours when another stack holds that id. Returns the id, or -1 (lost,
 * counted). */
static __always_inline s32 store_stack(struct unwound_stack *s)
{
	u32 id = s->hash & (UNWIND_REQUEST_IDS - 1);
	for (int i = 0; i < 4; i++, id = (id + 1) & (UNWIND_REQUEST_IDS - 1)) {
		struct unwound_stack *old = bpf_map_lookup_elem(&unwound_stacks, &id);
		if (old) {
			if (old->hash == s->hash && old->n == s->n)
				return id;
			continue;
		}
		if (!bpf_map_update_elem(&unwound_stacks, &id, s, BPF_NOEXIST))
			return id;
		/* Another CPU stored a stack under id just now: same or not? */
		old = bpf_map_lookup_elem(&unwound_stacks, &id);
		if (old && old->hash == s->hash && old->n == s->n)
			return id;
	}
	count_err(ERR_STACK);
	return -1;
}

/* Hands the rest of the walk to user space, or under pressure joins the
 * request in flight that stopped at the same frames. Returns the request's stack id; when the
 * request cannot be sent (counted), the frames so far are stored as a
 * truncated stack. */
static __always_inline s32 request_unwind(struct unwound_stack *s, u64 mm, u64 asid, u32 tgid, u64 sp, u64 bp,
					  u64 lr, bool exact, u32 max)
{
	struct unwind_pending_key pk = { .mm = mm, .hash = s->hash };
	if (bpf_ringbuf_query(&unwind_requests, BPF_RB_AVAIL_DATA) > UNWIND_RING_BYTES / 2) {
		s32 *pending = bpf_map_lookup_elem(&unwind_pending, &pk);
		if (pending)
			return *pending;
	}
	struct unwind_request *r = bpf_ringbuf_reserve(&unwind_requests, sizeof(*r), 0);
	if (!r) {
		count_err(ERR_RINGBUF);
		s->truncated = 1;
		return store_stack(s);
	}
	u32 zero = 0;
	u32 *seq = bpf_map_lookup_elem(&unwind_seq, &zero);
	u32 n = 0;
	if (seq)
		n = (*seq)++;
	u32 cpu = bpf_get_smp_processor_id();
	s32 id = UNWIND_REQUEST_IDS | (((cpu << UNWIND_SEQ_BITS) | (n & ((1 << UNWIND_SEQ_BITS) - 1))) &
				       (UNWIND_REQUEST_IDS - 1));
	/* Before the submit, so that user space's delete comes after it. */
	bpf_map_update_elem(&unwind_pending, &pk, &id, BPF_ANY);
	r->mm = mm;
	r->asid = asid;
	r->hash = s->hash;
	r->tgid = tgid;
	r->stack_id = id;
	r->sp = sp;
	r->bp = bp;
	r->lr = lr;
	r->n = s->n;
	r->exact = exact;
	r->max = max;
	__builtin_memcpy(r->pcs, s->pcs, sizeof(r->pcs));
	u32 copied = 0;
	for (int i = 0; i < UNWIND_COPY_CHUNKS; i++) {
		/* The stack ends at the top of its mapping: a chunk reaching past it
		 * fails, and what was read before is all there is. */
		if (bpf_probe_read_user(&r->stack[i * UNWIND_COPY_CHUNK], UNWIND_COPY_CHUNK,
					(void *)(sp + i * UNWIND_COPY_CHUNK)))
			break;
		copied += UNWIND_COPY_CHUNK;
	}
	r->copied = copied;
	bpf_ringbuf_submit(r, 0);
	return id;
}

/* Unwinds the user stack of the current thread from pc, sp, bp and lr (the
 * link register where pc is the innermost frame's, on AArch64; else 0), at
 * most max frames (<= UNWIND_MAX_FRAMES). exact: pc is an instruction
 * pointer (a syscall's), not a return address. Returns a stack id in
 * unwound_stacks, or -1 when lost (counted). */
static __always_inline s32 unwind_user(u32 tgid, u64 pc, u64 sp, u64 bp, u64 lr, bool exact, u32 max)
{
	u32 zero = 0;
	struct unwound_stack *s = bpf_map_lookup_elem(&unwind_scratch, &zero);
	if (!s) {
		count_err(ERR_STACK);
		return -1;
	}
	struct mm_struct *mm = BPF_CORE_READ(current_task(), mm);
	u64 asid = unwind_asid(mm);
	u64 own = unwind_own_code(tgid, asid);
	s->hash = 0xcbf29ce484222325ULL;
	s->n = 0;
	s->truncated = 0;
	struct unwind_mapping_key mk = {
		.prefixlen = UNWIND_MAPPING_BITS,
		.tgid = __builtin_bswap32(tgid),
		.asid = __builtin_bswap64(asid),
	};
	/* The mapping of the last frame looked up, [lo, hi): none at first. */
	u64 lo = 0, hi = 0, bias = 0, file = own;
	struct unwind_key key;
	u64 bp_at = 0; /* where the current rbp is saved, not read yet; 0: bp holds it */
	u64 mask = unwind_ra_mask;
	pc &= mask;
	lr &= mask;
	for (u32 i = 0; i < UNWIND_MAX_FRAMES; i++) {
		if (!pc)
			break;
		s->pcs[i] = pc;
		s->n = i + 1;
		s->hash = unwind_hash(s->hash, pc);
		/* The last frame kept needs no rule: its caller is not kept. */
		if (i + 1 >= max) {
			s->truncated = 1;
			break;
		}
		bool at_ip = exact && i == 0;
		u64 at = at_ip ? pc : pc - 1;
		/* Callers are mostly in the mapping of the frame before: the
		 * trie, dearer than the rules' hash, is searched only when a
		 * frame leaves it. */
		if (at < lo || at >= hi) {
			mk.addr = __builtin_bswap64(at);
			struct unwind_mapping *m = bpf_map_lookup_elem(&unwind_mappings, &mk);
			if (m) {
				lo = m->start;
				hi = m->end;
				bias = m->bias;
				file = m->file ? m->file : own;
			} else {
				lo = hi = bias = 0;
				file = own;
			}
		}
		key.file = file;
		key.at = at - bias;
		struct unwind_rule *rule = bpf_map_lookup_elem(&unwind_rules, &key);
		if (!rule) {
			if (bp_at && bpf_probe_read_user(&bp, sizeof(bp), (void *)bp_at))
				bp = 0;
			return request_unwind(s, (u64)mm, asid, tgid, sp, bp, lr, at_ip, max);
		}
		if (rule->cfa == CFA_END)
			break;
		if (rule->cfa == CFA_RBP && bp_at) {
			if (bpf_probe_read_user(&bp, sizeof(bp), (void *)bp_at))
				bp = 0;
			bp_at = 0;
		}
		u64 cfa = (rule->cfa == CFA_RBP ? bp : sp) + (s64)rule->cfa_off;
		if (rule->ra == RA_IN_LR) {
			/* A caller's link register was overwritten by its call:
			 * lr is the innermost frame's only. */
			pc = lr;
		} else {
			if (bpf_probe_read_user(&pc, sizeof(pc), (void *)(cfa + (s64)rule->ra_off)))
				break;
			pc &= mask;
		}
		lr = 0;
		/* A saved rbp is read only when a frame further out computes its
		 * CFA from it: code without frame pointers saves rbp as any
		 * callee-saved register and never needs it, and each read costs
		 * as much as the rule lookup. */
		if (rule->rbp == RBP_AT_CFA) {
			bp_at = cfa + (s64)rule->rbp_off;
		} else if (rule->rbp == RBP_UNDEFINED) {
			bp = 0;
			bp_at = 0;
		}
		sp = cfa;
	}
	/* Frames past n are left over from a longer stack: readers stop at n. */
	return store_stack(s);
}
