/* SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0) */
/* Per-site accounting, shared by the objects that record call sites (fd,
 * cuda): per process and call site (a stack id of bpf/unwind.h and a
 * Python stack id of bpf/pyframes.h), what was made there (fds opened,
 * device memory allocated) and released since tracking began, a release
 * credited to the site that made what it releases. User space reads the
 * change from one poll to the next: what passed through a site between two
 * polls shows even when nothing of it is left. Entries are made here and
 * deleted by user space when their process goes; a full table loses the
 * site's counts, counted as ERR_SITES. */
#ifndef AUTOGLM_SITES_H
#define AUTOGLM_SITES_H

#include "common.h"

struct site_key {
	u32 tgid;
	s32 stack_id; /* never negative here */
	u32 py_stack; /* 0: no Python frames */
	u32 pad;
};

struct site_counts {
	u64 made;
	u64 made_bytes; /* 0 for fds */
	u64 released;
	u64 released_bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory follows use, not capacity */
	__type(key, struct site_key);
	__type(value, struct site_counts);
} sites SEC(".maps");

/* Entries of sites per process: made here (which = SITES_MADE, counted
 * only here) and taken away by user space (SITES_SWEPT, written only
 * there): each side writes its own key, so neither loses the other's
 * count. */
enum site_owner_count {
	SITES_MADE = 0,
	SITES_SWEPT = 1,
};

struct site_owner_key {
	u32 tgid;
	u32 which;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct site_owner_key);
	__type(value, u64);
} site_owners SEC(".maps");

/* Set by user space before loading (pkg/stacks). */
const volatile u32 max_sites_per_proc = 1024;

/* Makes the entry of a new site of tgid, within its cap. Returns whether
 * it was made (by this CPU or another). */
static __always_inline bool make_site(u32 tgid, struct site_key *key)
{
	struct site_owner_key ok = { .tgid = tgid, .which = SITES_MADE };
	u64 *made = bpf_map_lookup_elem(&site_owners, &ok);
	if (!made) {
		u64 zero = 0;
		bpf_map_update_elem(&site_owners, &ok, &zero, BPF_NOEXIST);
		made = bpf_map_lookup_elem(&site_owners, &ok);
		if (!made)
			return false;
	}
	ok.which = SITES_SWEPT;
	u64 *swept = bpf_map_lookup_elem(&site_owners, &ok);
	/* Read without a lock: CPUs racing here can each make one more, a
	 * few over the cap at most. */
	if (*made - (swept ? *swept : 0) >= max_sites_per_proc)
		return false;
	struct site_counts zero = {};
	/* Another CPU may make it first: then the caller's lookup finds theirs. */
	if (!bpf_map_update_elem(&sites, key, &zero, BPF_NOEXIST))
		__sync_fetch_and_add(made, 1);
	return true;
}

/* Adds one thing made (released == false) or released, of bytes, at a site. */
static __always_inline void count_site(u32 tgid, s32 stack_id, u32 py_stack, u64 bytes, bool released)
{
	if (stack_id < 0)
		return; /* no stack: lost and counted where it was taken */
	struct site_key key = { .tgid = tgid, .stack_id = stack_id, .py_stack = py_stack };
	struct site_counts *s = bpf_map_lookup_elem(&sites, &key);
	if (!s) {
		if (make_site(tgid, &key))
			s = bpf_map_lookup_elem(&sites, &key);
		if (!s) {
			count_err(ERR_SITES);
			return;
		}
	}
	/* Atomic adds whose results are unused: the one atomic every kernel
	 * takes. An add of a constant 0 (fds have no bytes) is not written:
	 * clang turns it into an atomic or, which kernels before 5.12 refuse. */
	if (released) {
		__sync_fetch_and_add(&s->released, 1);
		if (bytes)
			__sync_fetch_and_add(&s->released_bytes, bytes);
	} else {
		__sync_fetch_and_add(&s->made, 1);
		if (bytes)
			__sync_fetch_and_add(&s->made_bytes, bytes);
	}
}

#endif
