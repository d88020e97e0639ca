/* sockwork: TCP workloads on loopback for the socket concern's tests.
 *
 *   sockwork leaky-server RATE SECONDS
 *       a server on 127.0.0.1 (ephemeral port) accepts connections and never
 *       closes them: each client hangs up at once, so the accepted sockets
 *       pile up in CLOSE_WAIT.
 *   sockwork healthy-server RATE SECONDS
 *       the same, but the server reads to end of file and closes.
 *
 * A forked client connects RATE times a second and closes right away. Only
 * the server (the parent) is watched: the client's sockets are not its own,
 * and its FINs reach the server's sockets in softirq context. The server
 * also holds one UDP socket and a unix socket pair, so that sockets of every
 * kind are there to count. It prints "ready" once listening and exits after
 * SECONDS; the client dies with it.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static void client(struct sockaddr_in addr, int rate, double end, pid_t parent)
{
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) || getppid() != parent)
		_exit(0);
	double next = now();
	while (now() < end) {
		int s = socket(AF_INET, SOCK_STREAM, 0);
		if (s < 0)
			die("client socket");
		/* A failed connect (backlog full) is simply the next one's turn. */
		connect(s, (struct sockaddr *)&addr, sizeof(addr));
		close(s);
		next += 1.0 / rate;
		double wait = next - now();
		if (wait > 0)
			usleep((useconds_t)(wait * 1e6));
	}
	_exit(0);
}

/* Named, so that the opening stack of a leaked socket points here. */
__attribute__((noinline)) static int accept_conn(int ls)
{
	return accept4(ls, NULL, NULL, SOCK_CLOEXEC);
}

int main(int argc, char **argv)
{
	if (argc != 4 || (strcmp(argv[1], "leaky-server") && strcmp(argv[1], "healthy-server"))) {
		fprintf(stderr, "usage: sockwork leaky-server|healthy-server RATE SECONDS\n");
		return 2;
	}
	int leaky = strcmp(argv[1], "leaky-server") == 0;
	int rate = atoi(argv[2]);
	double end = now() + atof(argv[3]);
	if (rate <= 0)
		rate = 1;

	/* Every leaked socket holds an fd: lift the soft limit to the hard one. */
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}

	int ls = socket(AF_INET, SOCK_STREAM, 0);
	if (ls < 0)
		die("socket");
	struct sockaddr_in addr = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(addr);
	if (bind(ls, (struct sockaddr *)&addr, sizeof(addr)) || listen(ls, 4096) ||
	    getsockname(ls, (struct sockaddr *)&addr, &len))
		die("listen");

	int udp = socket(AF_INET, SOCK_DGRAM, 0);
	int pair[2];
	if (udp < 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, pair))
		die("udp/unix sockets");

	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0)
		client(addr, rate, end, parent);

	printf("ready\n");
	fflush(stdout);

	while (now() < end) {
		struct pollfd p = { .fd = ls, .events = POLLIN };
		if (poll(&p, 1, 100) <= 0)
			continue;
		int c = accept_conn(ls);
		if (c < 0)
			continue;
		if (leaky)
			continue; /* the bug: never closed */
		char buf[256];
		while (read(c, buf, sizeof(buf)) > 0)
			;
		close(c);
	}
	return 0;
}
