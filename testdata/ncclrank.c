/* Four ranks of one NCCL communicator on one machine, each a training loop
 * stand-in, for the nccl view's tests (with the stand-in libnccl.so.2 or a
 * real one; nothing here needs a GPU: the buffers are never read).
 *
 * usage: ncclrank LIBNCCL MODE SECONDS [ARG...]
 *
 * The parent loads LIBNCCL with dlopen, takes a unique id (ncclGetUniqueId)
 * and forks four ranks that share it. Each rank sets up its communicator
 * (ncclCommInitRank), broadcasts 1000 doubles from rank 0 once (8000 bytes),
 * then every 10 ms takes a step: train_step all-reduces 262144 floats
 * (1 MiB). Modes:
 *   healthy        every rank steps until the end
 *   straggler R N  rank R stops after N steps inside load_next_batch, a data
 *                  loader that never delivers (1 ms sleeps); the others take
 *                  one more step (their all-reduce issued, as real ranks
 *                  block in the collective) and then wait in wait_collective
 *                  (1 ms sleeps): their count stands one ahead
 *   hang N         every rank stops after N steps inside wait_collective
 *   rate R         one rank alone (nranks 1) all-reduces R times a second
 *                  for SECONDS; prints "calls N cpu_ns T" (its CPU time)
 * The parent prints "rank R pid P" for each rank and "ready" once all four
 * have their communicator; each rank prints when it stops. After SECONDS
 * the parent ends the ranks and exits.
 *
 * NCCLRANK_START=signal: the ranks set up their communicators only after
 * the parent gets SIGUSR1 (tests hook the ranks first), and the parent
 * prints "ready" when they are forked, then their pids. NCCLRANK_START=S
 * (seconds): they wait that long first (for a tracer that finds them at
 * its next poll). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NRANKS 4
#define STEP_NS 10000000L
#define GRAD_COUNT 262144 /* floats: 1 MiB */
#define BCAST_COUNT 1000  /* doubles */

typedef struct {
	char internal[128];
} ncclUniqueId;
typedef void *ncclComm_t;
enum { ncclFloat32 = 7, ncclFloat64 = 8 };
enum { ncclSum = 0 };

static struct {
	int (*get_unique_id)(ncclUniqueId *);
	int (*comm_init_rank)(ncclComm_t *, int, ncclUniqueId, int);
	int (*comm_destroy)(ncclComm_t);
	int (*all_reduce)(const void *, void *, size_t, int, int, ncclComm_t, void *);
	int (*broadcast)(const void *, void *, size_t, int, int, ncclComm_t, void *);
	const char *(*error_string)(int);
} nccl;

static void *sym(void *h, const char *name)
{
	void *f = dlsym(h, name);
	if (!f) {
		fprintf(stderr, "ncclrank: %s: %s\n", name, dlerror());
		exit(2);
	}
	return f;
}

static void check(int rc, const char *what)
{
	if (rc != 0) {
		fprintf(stderr, "ncclrank: %s: %s\n", what, nccl.error_string(rc));
		exit(1);
	}
}

static void sleep_ns(long ns)
{
	struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
	while (nanosleep(&ts, &ts) != 0)
		;
}

static float grads[GRAD_COUNT];
static double params[BCAST_COUNT];

/* The collectives' call sites, named for the tests' oracle. */
__attribute__((noinline)) static void train_step(ncclComm_t comm)
{
	check(nccl.all_reduce(grads, grads, GRAD_COUNT, ncclFloat32, ncclSum, comm, NULL), "ncclAllReduce");
}

__attribute__((noinline)) static void sync_params(ncclComm_t comm)
{
	check(nccl.broadcast(params, params, BCAST_COUNT, ncclFloat64, 0, comm, NULL), "ncclBroadcast");
}

/* A data loader that never delivers: the straggler's thread keeps
 * switching off the CPU here, as one waiting on storage does. */
__attribute__((noinline)) static void load_next_batch(void)
{
	for (;;)
		sleep_ns(1000000);
}

/* A rank whose collective cannot finish without its peers: the host polls,
 * as a stream synchronisation does. */
__attribute__((noinline)) static void wait_collective(void)
{
	for (;;)
		sleep_ns(1000000);
}

static void rank_main(int rank, int nranks, ncclUniqueId id, const char *mode, int straggler, long stop, int ready)
{
	ncclComm_t comm;
	check(nccl.comm_init_rank(&comm, nranks, id, rank), "ncclCommInitRank");
	sync_params(comm);
	if (ready >= 0) {
		char c = 1;
		if (write(ready, &c, 1) != 1)
			exit(1);
		close(ready);
	}
	long collectives = 1;
	for (long step = 0;; step++) {
		if (strcmp(mode, "straggler") == 0 && rank == straggler && step == stop) {
			printf("rank %d stalls in load_next_batch after %ld collectives\n", rank, collectives);
			fflush(stdout);
			load_next_batch();
		}
		train_step(comm);
		collectives++;
		if ((strcmp(mode, "straggler") == 0 && step == stop) || (strcmp(mode, "hang") == 0 && step + 1 == stop)) {
			printf("rank %d waits in wait_collective after %ld collectives\n", rank, collectives);
			fflush(stdout);
			wait_collective();
		}
		sleep_ns(STEP_NS);
	}
}

static void rate_main(long rate, long seconds, ncclUniqueId id)
{
	ncclComm_t comm;
	check(nccl.comm_init_rank(&comm, 1, id, 0), "ncclCommInitRank");
	printf("ready\n");
	fflush(stdout);
	struct timespec start, now, cpu0, cpu1;
	clock_gettime(CLOCK_MONOTONIC, &start);
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
	long calls = 0, total = rate * seconds;
	while (calls < total) {
		train_step(comm);
		calls++;
		/* Paced: call k is due at k/rate seconds. */
		clock_gettime(CLOCK_MONOTONIC, &now);
		long due = calls * (1000000000L / rate);
		long at = (now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec);
		if (due > at)
			sleep_ns(due - at);
	}
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
	printf("calls %ld cpu_ns %ld\n", calls, (cpu1.tv_sec - cpu0.tv_sec) * 1000000000L + (cpu1.tv_nsec - cpu0.tv_nsec));
	check(nccl.comm_destroy(comm), "ncclCommDestroy");
}

static volatile sig_atomic_t go;
static void on_usr1(int sig)
{
	(void)sig;
	go = 1;
}

static void usage(void)
{
	fprintf(stderr, "usage: ncclrank LIBNCCL healthy|straggler RANK STEPS|hang STEPS|rate CALLS_PER_S SECONDS\n");
	exit(2);
}

int main(int argc, char **argv)
{
	if (argc < 4)
		usage();
	const char *mode = argv[2];
	long seconds = atol(argv[3]);
	int straggler = -1;
	long stop = -1;
	if (strcmp(mode, "straggler") == 0 && argc == 6) {
		straggler = atoi(argv[4]);
		stop = atol(argv[5]);
		if (straggler < 0 || straggler >= NRANKS || stop < 0)
			usage();
	} else if (strcmp(mode, "hang") == 0 && argc == 5) {
		stop = atol(argv[4]);
		if (stop < 1)
			usage();
	} else if (strcmp(mode, "rate") == 0 && argc == 5) {
		stop = atol(argv[4]);
		if (stop < 1 || stop > 1000000000L)
			usage();
	} else if (strcmp(mode, "healthy") != 0 || argc != 4) {
		usage();
	}
	if (seconds < 1)
		usage();
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) {
		fprintf(stderr, "ncclrank: %s\n", dlerror());
		return 2;
	}
	nccl.get_unique_id = sym(h, "ncclGetUniqueId");
	nccl.comm_init_rank = sym(h, "ncclCommInitRank");
	nccl.comm_destroy = sym(h, "ncclCommDestroy");
	nccl.all_reduce = sym(h, "ncclAllReduce");
	nccl.broadcast = sym(h, "ncclBroadcast");
	nccl.error_string = sym(h, "ncclGetErrorString");

	ncclUniqueId id;
	check(nccl.get_unique_id(&id), "ncclGetUniqueId");
	if (strcmp(mode, "rate") == 0) {
		rate_main(stop, seconds, id);
		return 0;
	}

	const char *start = getenv("NCCLRANK_START");
	int on_signal = start && strcmp(start, "signal") == 0;
	long delay = start && !on_signal ? atol(start) : 0;
	signal(SIGUSR1, on_usr1);
	sigset_t usr1, old;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigprocmask(SIG_BLOCK, &usr1, &old);

	int gate[2], ready[2];
	if (pipe(gate) != 0 || pipe(ready) != 0) {
		perror("ncclrank: pipe");
		return 1;
	}
	pid_t pids[NRANKS];
	pid_t parent = getpid();
	fflush(stdout); /* else the ranks inherit what is buffered */
	for (int r = 0; r < NRANKS; r++) {
		pids[r] = fork();
		if (pids[r] < 0) {
			perror("ncclrank: fork");
			return 1;
		}
		if (pids[r] == 0) {
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() != parent)
				_exit(1);
			close(gate[1]);
			close(ready[0]);
			char c;
			if (read(gate[0], &c, 1) != 1)
				_exit(1);
			if (delay > 0)
				sleep_ns(delay * 1000000000L);
			rank_main(r, NRANKS, id, mode, straggler, stop, ready[1]);
			_exit(0);
		}
	}
	close(gate[0]);
	close(ready[1]);
	/* On signal, "ready" first: a test waiting for it reads the ranks'
	 * pids after. */
	if (on_signal)
		printf("ready\n");
	for (int r = 0; r < NRANKS; r++)
		printf("rank %d pid %d\n", r, pids[r]);
	fflush(stdout);
	if (on_signal)
		while (!go)
			sigsuspend(&old);
	char gobytes[NRANKS] = {0};
	if (write(gate[1], gobytes, NRANKS) != NRANKS) {
		perror("ncclrank: write");
		return 1;
	}
	for (int r = 0; r < NRANKS; r++) {
		char c;
		if (read(ready[0], &c, 1) != 1) {
			fprintf(stderr, "ncclrank: a rank exited before its communicator was set up\n");
			return 1;
		}
	}
	printf("communicator of %d ranks set up\n", NRANKS);
	if (!on_signal)
		printf("ready\n");
	fflush(stdout);
	sleep_ns(seconds * 1000000000L);
	for (int r = 0; r < NRANKS; r++)
		kill(pids[r], SIGKILL);
	for (int r = 0; r < NRANKS; r++)
		waitpid(pids[r], NULL, 0);
	return 0;
}
