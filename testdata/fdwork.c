/* fdwork: fd workloads for the integration tests, the demo and the benchmarks.
 * Built with frame pointers so the tracer can walk user stacks.
 *
 *   fdwork leak RATE SECONDS      leak RATE fds/s from leak_tick()
 *   fdwork pool SECONDS           32 fds kept open, fast open/close churn
 *   fdwork burst N SECONDS        open N fds at once, hold 2.3s, release, repeat
 *   fdwork startup N SECONDS      open N fds over ~1s at start, then idle
 *   fdwork kinds SECONDS          one of every fd kind, dup2/close_range/exec paths
 *   fdwork passfd N SECONDS       after 1s, receive N fds over a unix socket (SCM_RIGHTS): no syscall tracepoint sees them
 *   fdwork exhaust LIMIT RATE SECONDS
 *                                 after 1.5 s, soft RLIMIT_NOFILE LIMIT; hold_open() until open fails
 *                                 with EMFILE, then try_open() RATE times a second, failing each time
 *   fdwork near LIMIT HELD SECONDS
 *                                 soft RLIMIT_NOFILE LIMIT; hold HELD fds, then open and close one 20 times a second
 *   fdwork churn OPENS CONNS SECONDS
 *                                 OPENS file open+close pairs and CONNS loopback TCP connections (connect,
 *                                 accept, close on both ends) a second, for the agent's own cost (benchmark)
 *   fdwork forker N LEAK CHILDREN SECONDS
 *                                 open N fds at start, then leak LEAK fds/s from leak_tick() and start
 *                                 CHILDREN children a second, each exec'ing `sleep 0.3` with every fd
 *                                 inherited (none is close-on-exec), as a leaking shell or a forking
 *                                 server does (benchmark); FDWORK_CHILD_SECONDS sets the sleep
 *   fdwork family N SECONDS       N files, a pipe, a socket pair and an eventfd; after 1 s a child that
 *                                 closes the first file, dup2s the pipe's read end to fd 200 and opens
 *                                 /dev/zero, then sleeps (a child's table from its parent's)
 *   fdwork spawn N SECONDS        N files, every other one close-on-exec; after 1 s a child that execs
 *                                 `sleep SECONDS` (a child's table from its parent's, exec in between)
 *   fdwork loop N                 N open+close pairs as fast as possible (benchmark)
 *   fdwork server N               N loopback TCP connections served (benchmark)
 *
 * Every mode prints "ready" once its setup is done, then exits after SECONDS. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
	struct timespec ts = { (time_t)s, (long)((s - (time_t)s) * 1e9) };
	nanosleep(&ts, NULL);
}

static void raise_nofile(void)
{
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	rl.rlim_cur = rl.rlim_max;
	setrlimit(RLIMIT_NOFILE, &rl);
}

static void ready(void)
{
	printf("ready\n");
	fflush(stdout);
}

/* The leak: a handle is opened per tick and never closed. */
NOINLINE int leak_tick(void)
{
	return open("/dev/null", O_RDONLY);
}

NOINLINE int pool_churn(int *pool, int n, int i)
{
	close(pool[i % n]);
	pool[i % n] = open("/dev/null", O_RDONLY);
	return pool[i % n];
}

NOINLINE void burst_open(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		fds[i] = open("/dev/null", O_RDONLY);
}

NOINLINE void startup_open(int *fds, int n)
{
	for (int i = 0; i < n; i++) {
		fds[i] = open("/dev/null", O_RDONLY);
		sleep_s(1.0 / n);
	}
}

/* Holds an fd for good: the fds that fill the table. */
NOINLINE int hold_open(void)
{
	return open("/dev/null", O_RDONLY);
}

/* The call that keeps failing once the table is full. */
NOINLINE int try_open(void)
{
	return open("/dev/null", O_RDONLY); /* exhaust: try */
}

static void set_soft_nofile(rlim_t n)
{
	struct rlimit rl;
	getrlimit(RLIMIT_NOFILE, &rl);
	rl.rlim_cur = n;
	if (setrlimit(RLIMIT_NOFILE, &rl))
		exit(1);
}

/* Passes an fd to ourselves over a unix socket: the received copy is created
 * by recvmsg, which no fd-creating tracepoint covers. */
NOINLINE int pass_fd(int sp[2])
{
	int fd = open("/dev/null", O_RDONLY);
	char c = 'x', ctl[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { &c, 1 };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	if (sendmsg(sp[0], &msg, 0) != 1)
		exit(1);
	close(fd);
	memset(ctl, 0, sizeof(ctl));
	msg.msg_controllen = sizeof(ctl);
	if (recvmsg(sp[1], &msg, 0) != 1)
		exit(1);
	memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof(int));
	return fd;
}

NOINLINE void open_kinds(void)
{
	int p[2], sp[2];
	sigset_t mask;

	sigemptyset(&mask);
	sigaddset(&mask, SIGUSR1);
	if (pipe2(p, O_CLOEXEC) || socketpair(AF_UNIX, SOCK_STREAM, 0, sp))
		exit(1);
	socket(AF_INET, SOCK_DGRAM, 0);
	eventfd(0, 0);
	epoll_create1(0);
	timerfd_create(CLOCK_MONOTONIC, 0);
	signalfd(-1, &mask, 0);
	inotify_init1(0);
	memfd_create("fdwork", 0);
	syscall(SYS_pidfd_open, getpid(), 0);
	int f = open("/dev/null", O_RDONLY);
	dup(f);
	fcntl(f, F_DUPFD_CLOEXEC, 100);
	int g = open("/dev/zero", O_RDONLY);
	dup2(f, g); /* replaces a live fd */
	dup3(f, 200, O_CLOEXEC);
	/* fds 300..309 dropped by close_range, without close() per fd */
	for (int i = 0; i < 10; i++)
		dup2(f, 300 + i);
	syscall(SYS_close_range, 300, 309, 0);
}

struct client_args {
	struct sockaddr_in addr;
	long n;
};

static void *client(void *p)
{
	struct client_args *a = p;
	char c = 'x';
	/* Reset instead of FIN: no TIME_WAIT piles up, so ephemeral ports never
	 * run short and every run measures the same thing. */
	struct linger reset = { 1, 0 };
	for (long i = 0; i < a->n; i++) {
		int s = socket(AF_INET, SOCK_STREAM, 0);
		setsockopt(s, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
		/* Request and wait for the reply: one connection in flight, so the
		 * listen backlog never overflows into SYN retransmits. */
		if (connect(s, (struct sockaddr *)&a->addr, sizeof(a->addr)) == 0 &&
		    (write(s, &c, 1) != 1 || read(s, &c, 1) != 1))
			perror("client");
		close(s);
	}
	return NULL;
}

/* A steady server: accept, read one byte, answer, close; a client thread
 * connects, sends, waits for the answer and resets the connection. */
static int serve(long n)
{
	struct client_args a = { .n = n };
	socklen_t len = sizeof(a.addr);
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	a.addr.sin_family = AF_INET;
	a.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(ls, (struct sockaddr *)&a.addr, sizeof(a.addr)) || listen(ls, 128) ||
	    getsockname(ls, (struct sockaddr *)&a.addr, &len))
		return 1;
	pthread_t th;
	double t0 = now();
	pthread_create(&th, NULL, client, &a);
	char c;
	for (long i = 0; i < n; i++) {
		int s = accept(ls, NULL, NULL);
		if (read(s, &c, 1) != 1 || write(s, &c, 1) != 1)
			perror("server");
		close(s);
	}
	pthread_join(th, NULL);
	printf("ns_per_op %.1f\n", (now() - t0) * 1e9 / n);
	return 0;
}

/* The churn mode's client connects to this many listeners in turn: the
 * TIME_WAIT sockets a host can hold towards one address and port are
 * bounded by the ephemeral ports (~14 k here with tcp_tw_reuse), and a
 * busy host has tens of thousands. */
#define CHURN_LISTENERS 3

/* Paced loops of the churn mode: each runs rate iterations a second, in
 * batches every 10 ms, until end, and counts what it did. */
struct pace {
	double rate, end;
	long done;
	struct sockaddr_in addr[CHURN_LISTENERS];
};

static void *churn_files(void *p)
{
	struct pace *pc = p;
	double next = now();
	while (now() < pc->end) {
		for (int i = 0; i < (int)(pc->rate / 100); i++, pc->done++)
			close(open("/dev/null", O_RDONLY));
		next += 0.01;
		if (next > now())
			sleep_s(next - now());
	}
	return NULL;
}

/* Connects and hangs up at once, so the client ends of the connections
 * pile up in TIME_WAIT, as on a busy host. */
static void *churn_client(void *p)
{
	struct pace *pc = p;
	double next = now();
	while (now() < pc->end) {
		for (int i = 0; i < (int)(pc->rate / 100); i++) {
			int s = socket(AF_INET, SOCK_STREAM, 0);
			struct sockaddr_in *a = &pc->addr[pc->done % CHURN_LISTENERS];
			if (connect(s, (struct sockaddr *)a, sizeof(*a)) == 0)
				pc->done++;
			close(s);
		}
		next += 0.01;
		if (next > now())
			sleep_s(next - now());
	}
	return NULL;
}

static int churn(double opens, double conns, double secs)
{
	double t0 = now(), end = t0 + secs;
	struct pace files = { .rate = opens, .end = end }, client = { .rate = conns, .end = end };
	struct pollfd ls[CHURN_LISTENERS];
	for (int i = 0; i < CHURN_LISTENERS; i++) {
		struct sockaddr_in *a = &client.addr[i];
		socklen_t len = sizeof(*a);
		a->sin_family = AF_INET;
		a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		ls[i].fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		ls[i].events = POLLIN;
		if (bind(ls[i].fd, (struct sockaddr *)a, sizeof(*a)) || listen(ls[i].fd, 4096) ||
		    getsockname(ls[i].fd, (struct sockaddr *)a, &len))
			return 1;
	}
	pthread_t tf, tc;
	pthread_create(&tf, NULL, churn_files, &files);
	pthread_create(&tc, NULL, churn_client, &client);
	ready();
	long accepted = 0;
	while (now() < end) {
		if (poll(ls, CHURN_LISTENERS, 100) <= 0)
			continue;
		for (int i = 0; i < CHURN_LISTENERS; i++) {
			int s;
			while ((s = accept(ls[i].fd, NULL, NULL)) >= 0) {
				close(s);
				accepted++;
			}
		}
	}
	pthread_join(tf, NULL);
	pthread_join(tc, NULL);
	double dt = now() - t0;
	printf("opens_per_s %.0f\nconns_per_s %.0f\naccepts_per_s %.0f\n", files.done / dt, client.done / dt, accepted / dt);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: fdwork MODE ARGS... (see source)\n");
		return 2;
	}
	const char *mode = argv[1];
	raise_nofile();

	if (!strcmp(mode, "loop")) {
		long n = atol(argv[2]);
		double t0 = now();
		for (long i = 0; i < n; i++)
			close(open("/dev/null", O_RDONLY));
		printf("ns_per_op %.1f\n", (now() - t0) * 1e9 / n);
		return 0;
	}
	if (!strcmp(mode, "server"))
		return serve(atol(argv[2]));
	if (!strcmp(mode, "churn") && argc == 5)
		return churn(atof(argv[2]), atof(argv[3]), atof(argv[4]));

	double secs = atof(argv[argc - 1]);
	double end = now() + secs;

	if (!strcmp(mode, "leak") && argc == 4) {
		double rate = atof(argv[2]);
		ready();
		for (double next = now(); now() < end; next += 1.0 / rate) {
			leak_tick();
			double d = next + 1.0 / rate - now();
			if (d > 0)
				sleep_s(d);
		}
	} else if (!strcmp(mode, "pool")) {
		int pool[32];
		for (int i = 0; i < 32; i++)
			pool[i] = open("/dev/null", O_RDONLY);
		ready();
		for (int i = 0; now() < end; i++) {
			pool_churn(pool, 32, i);
			if (i % 50 == 0)
				sleep_s(0.01);
		}
	} else if (!strcmp(mode, "burst") && argc == 4) {
		int n = atoi(argv[2]);
		int *fds = calloc(n, sizeof(int));
		ready();
		/* Hold and pause for odd lengths, so that the burst does not fall
		 * at the same point of every 1 s sampling interval. */
		while (now() < end) {
			burst_open(fds, n);
			sleep_s(2.3);
			for (int i = 0; i < n; i++)
				close(fds[i]);
			sleep_s(3.1);
		}
	} else if (!strcmp(mode, "startup") && argc == 4) {
		int n = atoi(argv[2]);
		int *fds = calloc(n, sizeof(int));
		startup_open(fds, n);
		ready();
		while (now() < end)
			sleep_s(0.1);
	} else if (!strcmp(mode, "forker") && argc == 6) {
		int n = atoi(argv[2]);
		double leak = atof(argv[3]), children = atof(argv[4]);
		signal(SIGCHLD, SIG_IGN); /* children reaped by the kernel */
		for (int i = 0; i < n; i++)
			if (hold_open() < 0)
				return 1;
		ready();
		double next_leak = now(), next_child = now();
		while (now() < end) {
			double t = now();
			if (leak > 0 && t >= next_leak) {
				leak_tick();
				next_leak += 1.0 / leak;
			}
			if (children > 0 && t >= next_child) {
				next_child += 1.0 / children;
				if (fork() == 0) {
					/* FDWORK_CHILD_SECONDS: children that outlive a poll */
					const char *s = getenv("FDWORK_CHILD_SECONDS");
					execlp("sleep", "sleep", s ? s : "0.3", (char *)NULL);
					_exit(127);
				}
			}
			double d = 1e9;
			if (leak > 0)
				d = next_leak - now();
			if (children > 0 && next_child - now() < d)
				d = next_child - now();
			if (d > 0)
				sleep_s(d < 0.1 ? d : 0.1);
		}
	} else if (!strcmp(mode, "family") && argc == 4) {
		int n = atoi(argv[2]), first = -1, p[2], sp[2];
		for (int i = 0; i < n; i++) {
			int fd = hold_open();
			if (first < 0)
				first = fd;
		}
		if (pipe(p) || socketpair(AF_UNIX, SOCK_STREAM, 0, sp) || eventfd(0, 0) < 0)
			return 1;
		signal(SIGCHLD, SIG_IGN);
		ready();
		sleep_s(1);
		if (fork() == 0) {
			close(first);
			dup2(p[0], 200);
			open("/dev/zero", O_RDONLY);
			while (now() < end)
				sleep_s(0.1);
			_exit(0);
		}
		while (now() < end)
			sleep_s(0.1);
	} else if (!strcmp(mode, "spawn") && argc == 4) {
		int n = atoi(argv[2]);
		for (int i = 0; i < n; i++)
			if ((i % 2 ? open("/dev/null", O_RDONLY | O_CLOEXEC) : hold_open()) < 0)
				return 1;
		signal(SIGCHLD, SIG_IGN);
		ready();
		sleep_s(1);
		if (fork() == 0) {
			execlp("sleep", "sleep", argv[3], (char *)NULL);
			_exit(127);
		}
		while (now() < end)
			sleep_s(0.1);
	} else if (!strcmp(mode, "passfd") && argc == 4) {
		int sp[2], n = atoi(argv[2]);
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, sp))
			return 1;
		sleep_s(1); /* after the reconcile that follows our exec */
		for (int i = 0; i < n; i++)
			pass_fd(sp);
		ready();
		while (now() < end)
			sleep_s(0.1);
	} else if (!strcmp(mode, "exhaust") && argc == 5) {
		/* Until its first poll after exec the tracer knows the code ranges
		 * of the shell `run` started, not ours: fds opened before then
		 * have no callers. Give it that poll. */
		sleep_s(1.5);
		set_soft_nofile(atoi(argv[2]));
		double rate = atof(argv[3]);
		while (hold_open() >= 0)
			;
		if (errno != EMFILE)
			return 1;
		ready();
		while (now() < end) {
			int fd = try_open();
			if (fd >= 0)
				close(fd);
			sleep_s(1.0 / rate);
		}
	} else if (!strcmp(mode, "near") && argc == 5) {
		set_soft_nofile(atoi(argv[2]));
		for (int i = atoi(argv[3]); i > 0; i--)
			if (hold_open() < 0)
				return 1;
		ready();
		while (now() < end) {
			close(try_open());
			sleep_s(0.05);
		}
	} else if (!strcmp(mode, "kinds")) {
		open_kinds();
		ready();
		while (now() < end)
			sleep_s(0.1);
	} else {
		fprintf(stderr, "fdwork: unknown mode or wrong arguments: %s\n", mode);
		return 2;
	}
	return 0;
}
