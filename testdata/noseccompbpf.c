/* noseccompbpf: runs a command under a seccomp filter that fails bpf() and
 * perf_event_open() with EPERM, as the container runtimes' default profiles
 * before containerd 1.6.9 and containers/common 0.60 do for a container
 * without CAP_SYS_ADMIN, whatever CAP_BPF and CAP_PERFMON say.
 *
 *   noseccompbpf CMD [ARG...] */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: noseccompbpf CMD [ARG...]\n");
		return 2;
	}
	struct sock_filter filter[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_bpf, 2, 0),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_perf_event_open, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
	};
	struct sock_fprog prog = {sizeof filter / sizeof filter[0], filter};
	/* As runc does: no new privileges, then the filter (kept across exec). */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
		perror("noseccompbpf: seccomp");
		return 1;
	}
	execvp(argv[1], argv + 1);
	perror("noseccompbpf: exec");
	return 1;
}
