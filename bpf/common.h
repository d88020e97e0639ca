/* Shared by every concern's BPF object: the tracked-process filter and the
 * error counters. Each object gets its own copy of these maps; the Go side
 * fills tracked_pids and reads errors for each object it loads. */
#pragma once

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Processes we watch, by tgid. Every program checks this before any work, so
 * untracked processes pay only one hash lookup. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, u8);
} tracked_pids SEC(".maps");

/* Reasons an event or update was lost; one per-CPU slot each, read by Go as
 * monotonic counters and never reset. */
enum err_kind {
	ERR_TABLE_FULL = 0,  /* live table update failed (map full) */
	ERR_STACK = 1,       /* a user stack could not be stored (stack map full or collision) */
	ERR_ENTRY_STATE = 2, /* per-thread entry state could not be saved */
	ERR_COUNTERS = 3,    /* per-process counters missing */
	ERR_READ_USER = 4,   /* bpf_probe_read_user failed */
	ERR_READ_KERNEL = 5, /* bpf_probe_read_kernel failed */
	ERR_RINGBUF = 6,     /* ring buffer reserve failed (buffer full) */
	ERR_MAX = 7,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ERR_MAX);
	__type(key, u32);
	__type(value, u64);
} errors SEC(".maps");

static __always_inline void count_err(u32 kind)
{
	u64 *n = bpf_map_lookup_elem(&errors, &kind);
	if (n)
		*n += 1;
}

static __always_inline bool is_tracked(u32 tgid)
{
	return bpf_map_lookup_elem(&tracked_pids, &tgid) != NULL;
}

/* Returns the current tgid if it is tracked, 0 otherwise. */
static __always_inline u32 tracked_tgid(void)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	return is_tracked(tgid) ? tgid : 0;
}
