/* The processes the views watch: one map, tracked_pids, that user space
 * creates once and loads every view's object with in place of its own
 * (pkg/tracked), sized from the processes it may watch. A process is one
 * entry whatever the views watching it; the value has a bit per view, this
 * object's set at load as view_bit, and the fd view's fork marks. */
#pragma once

#include "common.h"

/* Value bits beside the views' (pkg/tracked): a process whose children the
 * fd view tracks from fork, and a child so marked that user space has not
 * taken yet (bpf/fd.bpf.c). Bits 0x01 to 0x20 are the views'. */
enum track_flag {
	TRACK_FOLLOW = 0x40,
	TRACK_FORKED = 0x80,
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096); /* resized from Go */
	__type(key, u32);
	__type(value, u8);
} tracked_pids SEC(".maps");

const volatile u8 view_bit = 0;

/* Every program checks this before any work: untracked processes pay one
 * hash lookup. */
static __always_inline bool is_tracked(u32 tgid)
{
	u8 *v = bpf_map_lookup_elem(&tracked_pids, &tgid);
	return v && (*v & view_bit);
}

/* A per-process entry a call needs is missing. User space makes a
 * process's entries before its filter bit and drops the bit before the
 * entries: missing while tracked is a loss; missing after untracking is a
 * call that began before it (a return probe, a thread still in the
 * library), not ours to count. */
static __always_inline void counters_missing(u32 tgid)
{
	if (is_tracked(tgid))
		count_err(ERR_COUNTERS);
}

/* Returns the current tgid if it is tracked, 0 otherwise. */
static __always_inline u32 tracked_tgid(void)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	return is_tracked(tgid) ? tgid : 0;
}
