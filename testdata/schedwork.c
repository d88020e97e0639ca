/* Scheduler workloads for the sched concern's tests and benchmark.
 *
 *   schedwork storm PAIRS SECONDS     PAIRS thread pairs bouncing one byte over
 *                                     pipes as fast as they can
 *   schedwork cpu SECONDS             one thread spinning on the CPU
 *   schedwork moderate RATE SECONDS   a thread pair exchanging RATE messages/s
 *   schedwork idle SECONDS            nothing but sleeping
 *
 * Each prints "ready" once its threads run. storm measures over SECONDS and
 * then prints "messages_per_sec N" and "switches_per_sec N" (all threads,
 * from getrusage); with SCHEDWORK_WAIT_SIGNAL set in the environment the
 * measured window starts only at SIGUSR1, so that a tracer can attach first. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void ready(void)
{
	printf("ready\n");
	fflush(stdout);
}

/* One end of a ping-pong: reads a byte from in, writes it to out. The pinger
 * starts the exchange; every exchange counts one message. */
struct end {
	int in, out;
	int ping;
	long rate; /* messages/s for the pinger, 0: as fast as possible */
	atomic_ulong *messages;
};

static void *bounce(void *arg)
{
	struct end *e = arg;
	char b = 0;
	struct timespec next;
	clock_gettime(CLOCK_MONOTONIC, &next);
	if (e->ping && write(e->out, &b, 1) != 1)
		die("write");
	for (;;) {
		if (read(e->in, &b, 1) != 1)
			die("read");
		if (e->ping) {
			atomic_fetch_add_explicit(e->messages, 1, memory_order_relaxed);
			if (e->rate > 0) {
				next.tv_nsec += 1000000000L / e->rate;
				while (next.tv_nsec >= 1000000000L) {
					next.tv_nsec -= 1000000000L;
					next.tv_sec++;
				}
				clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
			}
		}
		if (write(e->out, &b, 1) != 1)
			die("write");
	}
	return NULL;
}

static void start_pair(long rate, atomic_ulong *messages, const char *name)
{
	int a[2], b[2];
	if (pipe(a) || pipe(b))
		die("pipe");
	struct end *ends = calloc(2, sizeof(*ends));
	ends[0] = (struct end){ .in = b[0], .out = a[1], .ping = 1, .rate = rate, .messages = messages };
	ends[1] = (struct end){ .in = a[0], .out = b[1], .messages = messages };
	for (int i = 0; i < 2; i++) {
		pthread_t t;
		if (pthread_create(&t, NULL, bounce, &ends[i]))
			die("pthread_create");
		pthread_setname_np(t, name);
	}
}

static unsigned long switches(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_nvcsw + ru.ru_nivcsw;
}

static void storm(int pairs, int seconds)
{
	static atomic_ulong messages;
	sigset_t usr1;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	/* Blocked before any thread starts, so that every thread inherits it
	 * and sigwait below receives it. */
	pthread_sigmask(SIG_BLOCK, &usr1, NULL);
	for (int i = 0; i < pairs; i++)
		start_pair(0, &messages, "pingpong");
	ready();
	if (getenv("SCHEDWORK_WAIT_SIGNAL")) {
		int sig;
		sigwait(&usr1, &sig);
	}
	unsigned long m0 = atomic_load(&messages), s0 = switches();
	double t0 = now();
	sleep(seconds);
	unsigned long m1 = atomic_load(&messages), s1 = switches();
	double dt = now() - t0;
	printf("messages_per_sec %.0f\nswitches_per_sec %.0f\n", (m1 - m0) / dt, (s1 - s0) / dt);
	fflush(stdout);
}

static void *spin(void *arg)
{
	double end = *(double *)arg;
	volatile unsigned long x = 0;
	while (now() < end)
		for (int i = 0; i < 100000; i++)
			x++;
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: schedwork storm PAIRS SECONDS | cpu SECONDS | moderate RATE SECONDS | idle SECONDS\n");
		return 2;
	}
	const char *mode = argv[1];
	if (!strcmp(mode, "storm") && argc == 4) {
		storm(atoi(argv[2]), atoi(argv[3]));
	} else if (!strcmp(mode, "cpu")) {
		double end = now() + atoi(argv[2]);
		pthread_t t;
		if (pthread_create(&t, NULL, spin, &end))
			die("pthread_create");
		pthread_setname_np(t, "spinner");
		ready();
		pthread_join(t, NULL);
	} else if (!strcmp(mode, "moderate") && argc == 4) {
		static atomic_ulong messages;
		start_pair(atol(argv[2]), &messages, "moderate");
		ready();
		sleep(atoi(argv[3]));
	} else if (!strcmp(mode, "idle")) {
		ready();
		sleep(atoi(argv[2]));
	} else {
		fprintf(stderr, "schedwork: bad arguments\n");
		return 2;
	}
	return 0;
}
