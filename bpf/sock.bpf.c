// SPDX-License-Identifier: (BSD-2-Clause OR GPL-2.0)
/* TCP socket tracking: when each socket of a tracked process entered its
 * current state, so that user space can tell how long a socket has sat in
 * CLOSE_WAIT (the peer hung up, the process never closed it).
 *
 * Design. inet_sock_set_state often fires in softirq context, where current
 * is whoever the CPU interrupted (on loopback, typically the peer), so current
 * cannot say who owns a socket. Ownership is therefore established only where
 * it is certain, and kept per socket in sock_table, keyed by the struct sock
 * address:
 *   - connect (-> SYN_SENT) and listen (-> LISTEN) run in the owner's
 *     syscall: current's tgid owns the socket;
 *   - an accepted socket becomes ESTABLISHED in softirq before anyone owns
 *     it, so the exit of accept/accept4 looks the returned fd up in the fd
 *     table and claims its socket;
 *   - sockets that existed before tracking, or arrived another way (fork,
 *     SCM_RIGHTS, io_uring), are claimed through sock_inodes, which user
 *     space fills every poll with the socket inodes listed in /proc/PID/fd.
 * Later transitions of a claimed socket, in any context, are found by its
 * address. Entering TCP_CLOSE ends the entry: the socket is being torn down
 * and its address may be reused.
 *
 * Counts by state are not taken from here: user space reads them from
 * /proc/PID/net/tcp{,6} for the inodes the process holds, which is exact
 * whatever the kernel saw. This table supplies the time of each transition,
 * joined with /proc by inode. */
#include "tracked.h"

#define AF_INET 2
#define AF_INET6 10
#define IPPROTO_TCP 6
#define EEXIST 17

/* One claimed socket. */
struct sock_info {
	u64 since_ns; /* bpf_ktime_get_ns when it entered state */
	u64 inode;    /* sockfs inode: the join key with /proc/PID/net/tcp */
	u32 tgid;     /* owner, for cleanup when it is no longer tracked */
	u8 state;     /* TCP state, as in /proc/net/tcp's st column */
	u8 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); /* resized from Go */
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory follows use, not capacity */
	__type(key, u64);           /* struct sock address */
	__type(value, struct sock_info);
} sock_table SEC(".maps");

/* Socket inodes held by tracked processes, kept current by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); /* resized from Go */
	__uint(map_flags, BPF_F_NO_PREALLOC); /* memory follows use, not capacity */
	__type(key, u64);           /* inode */
	__type(value, u32);         /* tgid */
} sock_inodes SEC(".maps");

/* Force the shared structs into BTF so bpf2go can generate them. */
const struct sock_info *unused_sock_info __attribute__((unused));
const enum err_kind *unused_err_kind __attribute__((unused));

static __always_inline void claim(u64 sk, u32 tgid, u8 state, u64 inode)
{
	struct sock_info info = {
		.since_ns = bpf_ktime_get_ns(),
		.inode = inode,
		.tgid = tgid,
		.state = state,
	};
	/* An existing entry is kept: it knows the earlier transition time. */
	long err = bpf_map_update_elem(&sock_table, &sk, &info, BPF_NOEXIST);
	if (err && err != -EEXIST)
		count_err(ERR_TABLE_FULL);
}

SEC("tracepoint/sock/inet_sock_set_state")
int sock_set_state(struct trace_event_raw_inet_sock_set_state *ctx)
{
	if (ctx->protocol != IPPROTO_TCP)
		return 0;
	u64 sk = (u64)ctx->skaddr;
	int state = ctx->newstate;
	/* The tracked check: a claimed socket, whatever the context. */
	struct sock_info *info = bpf_map_lookup_elem(&sock_table, &sk);
	if (info) {
		if (state == TCP_CLOSE) {
			bpf_map_delete_elem(&sock_table, &sk);
			return 0;
		}
		info->state = state;
		info->since_ns = bpf_ktime_get_ns();
		return 0;
	}
	if (state == TCP_CLOSE)
		return 0;
	/* Unclaimed: the owner's own syscall, or an inode user space listed. */
	u32 tgid = 0;
	if (state == TCP_SYN_SENT || state == TCP_LISTEN)
		tgid = tracked_tgid();
	u64 inode = BPF_CORE_READ((struct sock *)ctx->skaddr, sk_socket, file, f_inode, i_ino);
	if (!tgid && inode) {
		u32 *owner = bpf_map_lookup_elem(&sock_inodes, &inode);
		if (owner)
			tgid = *owner;
	}
	if (tgid)
		claim(sk, tgid, state, inode);
	return 0;
}

/* Claims the TCP socket behind the fd an accept call returned. A
 * syscalls:sys_exit_* record is laid out as struct syscall_trace_exit, not as
 * raw_syscalls' record: the two differ where struct trace_entry is not 8
 * bytes (12 on PREEMPT_RT), and CO-RE follows the type named here. */
static __always_inline int accepted(struct syscall_trace_exit *ctx)
{
	u32 tgid = tracked_tgid();
	if (!tgid || ctx->ret < 0)
		return 0;
	struct file *f = fd_file(current_task(), (u32)ctx->ret);
	if (!f)
		return 0;
	struct socket *sock = BPF_CORE_READ(f, private_data);
	struct sock *sk = BPF_CORE_READ(sock, sk);
	if (!sk)
		return 0;
	/* accept also serves unix and MPTCP sockets: only TCP is ours. */
	u16 family = BPF_CORE_READ(sk, __sk_common.skc_family);
	if ((family != AF_INET && family != AF_INET6) || BPF_CORE_READ(sk, sk_protocol) != IPPROTO_TCP)
		return 0;
	u8 state = BPF_CORE_READ(sk, __sk_common.skc_state);
	/* Already closed (reset before accept): TCP_CLOSE ends entries, so
	 * one made now would never be dropped. */
	if (state == TCP_CLOSE)
		return 0;
	claim((u64)sk, tgid, state, BPF_CORE_READ(f, f_inode, i_ino));
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_accept4")
int exit_accept4(struct syscall_trace_exit *ctx)
{
	return accepted(ctx);
}

SEC("tracepoint/syscalls/sys_exit_accept")
int exit_accept(struct syscall_trace_exit *ctx)
{
	return accepted(ctx);
}
