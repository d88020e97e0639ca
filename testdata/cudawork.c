/* CUDA allocation workload for the cuda concern's tests, run against the
 * runtime stand-in (or any libcudart exporting the same names).
 *
 * usage: cudawork LIBCUDART SCENARIO SECONDS [ARG...]
 * LIBCUDART "-": the runtime is linked into the executable (static runtime).
 *
 * Prints "ready", waits a moment, then loads LIBCUDART with dlopen (late, as
 * PyTorch does) and prints "loaded". Scenarios:
 *   leak            leak_weights leaks 1 MiB every 50 ms; scratch churns
 *   burst [N]       every second burst_alloc takes N x 64 KiB (default 5000),
 *                   holds them 300 ms and frees them
 *   steady          every 10 ms steady_step takes 32 x 128 KiB and frees them
 *   spike           every 100 ms leak_step leaks 8 MiB; every 3 s burst_step
 *                   takes 300 x 64 MiB and frees them, within milliseconds:
 *                   gone by the next poll
 * and, after SIGUSR1 (so the test hooks the library first), then "done":
 *   fail            load_checkpoint asks 2 GiB over a 1 GiB limit, once
 *   once            each runtime allocation API once (sizes below), three freed
 *   driver          the driver API directly: cuMemAlloc_v2, cuMemCreate +
 *                   cuMemMap + cuMemUnmap, cuMemAllocHost_v2 + cuMemFreeHost
 *   unload          dlclose the runtime (and with it the driver)
 *   depth           cudaMalloc 1 MiB and cudaFree it, then from a deeper
 *                   frame cudaMalloc 7 MiB, freed from the first
 *   bench N         N x (cudaMalloc 4 KiB + cudaFree); prints "ns TOTAL"
 *   rate R THREADS  R allocation+free pairs per second over THREADS threads
 *                   for SECONDS; prints "pairs N ns TOTAL"
 *   churn R THREADS SIZE  as rate, with buffers of SIZE bytes taken and freed
 *                   at once by churn_pair: R x SIZE bytes a second pass
 *                   through, never more than THREADS x SIZE live
 *   waits N         a thread named "waiter" calls sync_stream N times
 *                   (cudaStreamSynchronize) then copy_back N times (cudaMemcpy,
 *                   device to host), prints "done" and stays until the end
 *   launches N      launch_step: N x cudaLaunchKernel, then N x
 *                   cudaGraphLaunch; prints "done"
 *   launchbench N   N x cudaLaunchKernel; prints "ns TOTAL"
 *   syncbench N     N x sync_stream (cudaStreamSynchronize, which calls
 *                   cuStreamSynchronize); prints "ns TOTAL"
 *   oom             with the stand-in's CUDA_STUB_MEMORY at 512 MiB or less:
 *                   oom_weights takes 4 x 16 MiB and keeps them,
 *                   oom_activations 100 x 1 MiB, then oom_grow asks for
 *                   1 GiB, which fails; right after, oom_release frees the
 *                   activations; prints "done"
 *   oomloop R D     oom_weights as in oom, then for D seconds R times a
 *                   second oom_churn (cudaMalloc 64 KiB + cudaFree) and
 *                   oom_grow (fails as in oom); prints "fails N pairs M"
 * Exits after SECONDS (bench, rate, churn: when done).
 *
 * With CUDAWORK_STEP=1 in the environment, tests drive it with SIGUSR1: the
 * library is loaded only after one, and burst starts after another, prints
 * "held" after taking its buffers and "released" after freeing them, and
 * waits for one after each. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct dim3 {
	unsigned int x, y, z;
};

/* The runtime's entry points, from dlopen, or linked in when LIBCUDART is
 * "-" (the executable was built with the runtime stand-in: a static runtime). */
struct runtime {
	int (*malloc)(void **, size_t);
	int (*malloc_async)(void **, size_t, void *);
	int (*malloc_from_pool_async)(void **, size_t, void *, void *);
	int (*malloc_managed)(void **, size_t, unsigned int);
	int (*malloc_pitch)(void **, size_t *, size_t, size_t);
	int (*malloc_host)(void **, size_t);
	int (*host_alloc)(void **, size_t, unsigned int);
	int (*free)(void *);
	int (*free_async)(void *, void *);
	int (*free_host)(void *);
	/* Synchronising calls and launches, for the waits and --launches. */
	int (*stream_sync)(void *);
	int (*memcpy)(void *, const void *, size_t, int);
	int (*launch_kernel)(const void *, struct dim3, struct dim3, void **, size_t, void *);
	int (*graph_launch)(void *, void *);
};
static struct runtime rt;
static void *handle; /* of the runtime, when loaded with dlopen */

/* Weak: defined only in the static build. */
int cudaMalloc(void **, size_t) __attribute__((weak));
int cudaMallocAsync(void **, size_t, void *) __attribute__((weak));
int cudaMallocFromPoolAsync(void **, size_t, void *, void *) __attribute__((weak));
int cudaMallocManaged(void **, size_t, unsigned int) __attribute__((weak));
int cudaMallocPitch(void **, size_t *, size_t, size_t) __attribute__((weak));
int cudaMallocHost(void **, size_t) __attribute__((weak));
int cudaHostAlloc(void **, size_t, unsigned int) __attribute__((weak));
int cudaFree(void *) __attribute__((weak));
int cudaFreeAsync(void *, void *) __attribute__((weak));
int cudaFreeHost(void *) __attribute__((weak));
int cudaStreamSynchronize(void *) __attribute__((weak));
int cudaMemcpy(void *, const void *, size_t, int) __attribute__((weak));
int cudaLaunchKernel(const void *, struct dim3, struct dim3, void **, size_t, void *) __attribute__((weak));
int cudaGraphLaunch(void *, void *) __attribute__((weak));

#define MiB (1UL << 20)

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);
	if (!p) {
		fprintf(stderr, "cudawork: %s: %s\n", name, dlerror());
		exit(2);
	}
	return p;
}

static void load(const char *lib)
{
	if (strcmp(lib, "-") == 0) {
		if (!cudaMalloc) {
			fprintf(stderr, "cudawork: not built with a static runtime\n");
			exit(2);
		}
		rt = (struct runtime){ cudaMalloc, cudaMallocAsync, cudaMallocFromPoolAsync, cudaMallocManaged,
				       cudaMallocPitch, cudaMallocHost, cudaHostAlloc, cudaFree, cudaFreeAsync,
				       cudaFreeHost, cudaStreamSynchronize, cudaMemcpy, cudaLaunchKernel,
				       cudaGraphLaunch };
		return;
	}
	void *h = dlopen(lib, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "cudawork: %s\n", dlerror());
		exit(2);
	}
	handle = h;
	rt.malloc = sym(h, "cudaMalloc");
	rt.malloc_async = sym(h, "cudaMallocAsync");
	rt.malloc_from_pool_async = sym(h, "cudaMallocFromPoolAsync");
	rt.malloc_managed = sym(h, "cudaMallocManaged");
	rt.malloc_pitch = sym(h, "cudaMallocPitch");
	rt.malloc_host = sym(h, "cudaMallocHost");
	rt.host_alloc = sym(h, "cudaHostAlloc");
	rt.free = sym(h, "cudaFree");
	rt.free_async = sym(h, "cudaFreeAsync");
	rt.free_host = sym(h, "cudaFreeHost");
	rt.stream_sync = sym(h, "cudaStreamSynchronize");
	rt.memcpy = sym(h, "cudaMemcpy");
	rt.launch_kernel = sym(h, "cudaLaunchKernel");
	rt.graph_launch = sym(h, "cudaGraphLaunch");
}

static void check(int rc, const char *what)
{
	if (rc != 0) {
		fprintf(stderr, "cudawork: %s failed: %d\n", what, rc);
		exit(3);
	}
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static void say(const char *s)
{
	printf("%s\n", s);
	fflush(stdout);
}

static void wait_go(void)
{
	sigset_t set;
	int sig;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	sigwait(&set, &sig);
}

__attribute__((noinline)) static void leak_weights(void)
{
	void *p;
	check(rt.malloc(&p, MiB), "leak_weights");
}

__attribute__((noinline)) static void scratch(void)
{
	void *p;
	check(rt.malloc(&p, 256 << 10), "scratch");
	check(rt.free(p), "scratch free");
}

__attribute__((noinline)) static void burst_alloc(void **bufs, int n)
{
	for (int i = 0; i < n; i++)
		check(rt.malloc(&bufs[i], 64 << 10), "burst_alloc");
}

__attribute__((noinline)) static void burst_release(void **bufs, int n)
{
	for (int i = 0; i < n; i++)
		check(rt.free(bufs[i]), "burst_release");
}

__attribute__((noinline)) static void leak_step(void)
{
	void *p;
	check(rt.malloc(&p, 8 * MiB), "leak_step");
}

__attribute__((noinline, noclone)) static void burst_step(void **bufs, int n)
{
	for (int i = 0; i < n; i++)
		check(rt.malloc(&bufs[i], 64 * MiB), "burst_step"); /* spike: alloc */
	for (int i = 0; i < n; i++)
		check(rt.free(bufs[i]), "burst_step");
}

__attribute__((noinline)) static void steady_step(void)
{
	void *bufs[32];
	for (int i = 0; i < 32; i++)
		check(rt.malloc(&bufs[i], 128 << 10), "steady_step");
	for (int i = 0; i < 32; i++)
		check(rt.free(bufs[i]), "steady_step free");
}

__attribute__((noinline)) static int load_checkpoint(void)
{
	void *p = NULL;
	return rt.malloc(&p, 2048 * MiB);
}

/* The memory snapshot's sites (oom, oomloop). */
__attribute__((noinline)) static void oom_weights(void)
{
	void *p;
	for (int i = 0; i < 4; i++)
		check(rt.malloc(&p, 16 * MiB), "oom_weights");
}

__attribute__((noinline)) static void oom_activations(void **bufs, int n)
{
	for (int i = 0; i < n; i++)
		check(rt.malloc(&bufs[i], MiB), "oom_activations");
}

__attribute__((noinline)) static void oom_release(void **bufs, int n)
{
	for (int i = 0; i < n; i++)
		check(rt.free(bufs[i]), "oom_release");
}

__attribute__((noinline)) static void oom_grow(void)
{
	void *p = NULL;
	int rc = rt.malloc(&p, 1024 * MiB);
	if (rc != 2) {
		fprintf(stderr, "cudawork: oom_grow returned %d, want 2 (CUDA_STUB_MEMORY at most 512 MiB?)\n", rc);
		exit(3);
	}
}

__attribute__((noinline)) static void oom_churn(void)
{
	void *p;
	check(rt.malloc(&p, 64 << 10), "oom_churn");
	check(rt.free(p), "oom_churn free");
}

/* Sizes the test expects, one per API. */
static void once(void)
{
	void *a, *b, *c, *d, *e, *f, *g;
	size_t pitch;
	check(rt.malloc(&a, 1 * MiB), "cudaMalloc");
	check(rt.malloc_async(&b, 2 * MiB, NULL), "cudaMallocAsync");
	check(rt.malloc_from_pool_async(&c, 3 * MiB, NULL, NULL), "cudaMallocFromPoolAsync");
	check(rt.malloc_managed(&d, 4 * MiB, 1), "cudaMallocManaged");
	check(rt.malloc_pitch(&e, &pitch, 1000, 10), "cudaMallocPitch");
	check(rt.malloc_host(&f, 5 * MiB), "cudaMallocHost");
	check(rt.host_alloc(&g, 6 * MiB, 0), "cudaHostAlloc");
	check(rt.free_async(b, NULL), "cudaFreeAsync");
	check(rt.free(d), "cudaFree");
	check(rt.free_host(f), "cudaFreeHost");
}

typedef int (*cu_alloc_fn)(unsigned long long *, size_t);
typedef int (*cu_create_fn)(unsigned long long *, size_t, const void *, unsigned long long);
typedef int (*cu_map_fn)(unsigned long long, size_t, size_t, unsigned long long, unsigned long long);
typedef int (*cu_unmap_fn)(unsigned long long, size_t);
typedef int (*cu_host_fn)(void **, size_t);
typedef int (*cu_free_host_fn)(void *);

/* The runtime's dependency is already loaded: this finds it by soname. */
static void driver(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h) {
		fprintf(stderr, "cudawork: libcuda.so.1 not loaded: %s\n", dlerror());
		exit(2);
	}
	unsigned long long dptr, handle;
	void *host;
	check(((cu_alloc_fn)sym(h, "cuMemAlloc_v2"))(&dptr, 8 * MiB), "cuMemAlloc_v2");
	check(((cu_create_fn)sym(h, "cuMemCreate"))(&handle, 2 * MiB, NULL, 0), "cuMemCreate");
	check(((cu_map_fn)sym(h, "cuMemMap"))(0x10000000, 2 * MiB, 0, handle, 0), "cuMemMap");
	check(((cu_unmap_fn)sym(h, "cuMemUnmap"))(0x10000000, 2 * MiB), "cuMemUnmap");
	check(((cu_host_fn)sym(h, "cuMemAllocHost_v2"))(&host, 3 * MiB), "cuMemAllocHost_v2");
	check(((cu_free_host_fn)sym(h, "cuMemFreeHost"))(host), "cuMemFreeHost");
}

/* A free whose return is not probed leaves its state behind: an allocation
 * from a deeper frame after it must not look nested in it. */
__attribute__((noinline)) static void *deeper_alloc(void)
{
	void *p;
	check(rt.malloc(&p, 7 * MiB), "cudaMalloc (deeper)");
	return p;
}

static void depth(void)
{
	void *a;
	check(rt.malloc(&a, 1 * MiB), "cudaMalloc");
	check(rt.free(a), "cudaFree");
	check(rt.free(deeper_alloc()), "cudaFree (deeper)");
}

__attribute__((noinline)) static void bench_pair(void)
{
	void *p;
	check(rt.malloc(&p, 4096), "bench");
	check(rt.free(p), "bench free");
}

struct pacer {
	double per_sec;
	uint64_t end;
	uint64_t pairs;
};

static void *paced(void *arg)
{
	struct pacer *pc = arg;
	uint64_t start = now_ns();
	for (;;) {
		for (int i = 0; i < 100; i++)
			bench_pair();
		pc->pairs += 100;
		uint64_t t = now_ns();
		if (t >= pc->end)
			break;
		/* Ahead of schedule: sleep until the next batch is due. */
		uint64_t due = start + (uint64_t)(pc->pairs / pc->per_sec * 1e9);
		if (due > t) {
			struct timespec ts = { (due - t) / 1000000000ULL, (due - t) % 1000000000ULL };
			nanosleep(&ts, NULL);
		}
	}
	return NULL;
}

__attribute__((noinline)) static void churn_pair(size_t size)
{
	void *p;
	check(rt.malloc(&p, size), "churn_pair");
	check(rt.free(p), "churn_pair free");
}

struct churner {
	struct pacer pc;
	size_t size;
};

/* paced, for churn_pair. */
static void *churned(void *arg)
{
	struct churner *ch = arg;
	struct pacer *pc = &ch->pc;
	uint64_t start = now_ns();
	for (;;) {
		for (int i = 0; i < 100; i++)
			churn_pair(ch->size);
		pc->pairs += 100;
		uint64_t t = now_ns();
		if (t >= pc->end)
			break;
		uint64_t due = start + (uint64_t)(pc->pairs / pc->per_sec * 1e9);
		if (due > t) {
			struct timespec ts = { (due - t) / 1000000000ULL, (due - t) % 1000000000ULL };
			nanosleep(&ts, NULL);
		}
	}
	return NULL;
}

/* Host waits on the GPU, from two functions the tests name. */
__attribute__((noinline)) static void sync_stream(void)
{
	check(rt.stream_sync(NULL), "sync_stream");
}

__attribute__((noinline)) static void copy_back(char *dst, const char *src)
{
	check(rt.memcpy(dst, src, 64, 2 /* cudaMemcpyDeviceToHost */), "copy_back");
}

struct waits {
	long n;
	time_t end;
};

/* Stays until the end, so that its name can still be read. */
static void *waiter(void *arg)
{
	struct waits *w = arg;
	static char src[64], dst[64];
	pthread_setname_np(pthread_self(), "waiter");
	for (long i = 0; i < w->n; i++)
		sync_stream();
	for (long i = 0; i < w->n; i++)
		copy_back(dst, src);
	say("done");
	while (time(NULL) < w->end)
		usleep(100 * 1000);
	return NULL;
}

/* Any non-null pointer stands for a kernel or a graph. */
static const char kernel_fn[1];

__attribute__((noinline)) static void launch_step(long n)
{
	struct dim3 grid = { 1, 1, 1 }, block = { 32, 1, 1 };
	for (long i = 0; i < n; i++)
		check(rt.launch_kernel(kernel_fn, grid, block, NULL, 0, NULL), "cudaLaunchKernel");
	for (long i = 0; i < n; i++)
		check(rt.graph_launch((void *)kernel_fn, NULL), "cudaGraphLaunch");
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: cudawork LIBCUDART SCENARIO SECONDS [ARG...]\n");
		return 2;
	}
	const char *scenario = argv[2];
	int seconds = atoi(argv[3]);
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	if (strcmp(scenario, "fail") == 0)
		setenv("CUDA_STUB_LIMIT", "1073741824", 1);

	const char *step_env = getenv("CUDAWORK_STEP");
	int step = step_env && strcmp(step_env, "1") == 0;
	say("ready");
	if (step)
		wait_go();
	else
		usleep(300 * 1000);
	load(argv[1]);
	say("loaded");
	time_t end = time(NULL) + seconds;

	if (strcmp(scenario, "leak") == 0) {
		while (time(NULL) < end) {
			leak_weights();
			scratch();
			usleep(50 * 1000);
		}
	} else if (strcmp(scenario, "burst") == 0) {
		int n = argc > 4 ? atoi(argv[4]) : 5000;
		void **bufs = calloc(n, sizeof(*bufs));
		if (step)
			wait_go();
		while (time(NULL) < end) {
			burst_alloc(bufs, n);
			if (step) {
				say("held");
				wait_go();
			} else {
				usleep(300 * 1000);
			}
			burst_release(bufs, n);
			if (step) {
				say("released");
				wait_go();
			} else {
				usleep(700 * 1000);
			}
		}
	} else if (strcmp(scenario, "spike") == 0) {
		void *bufs[300];
		for (int i = 1; time(NULL) < end; i++) {
			leak_step();
			if (i % 30 == 0)
				burst_step(bufs, 300);
			usleep(100 * 1000);
		}
	} else if (strcmp(scenario, "steady") == 0) {
		while (time(NULL) < end) {
			steady_step();
			usleep(10 * 1000);
		}
	} else if (strcmp(scenario, "fail") == 0 || strcmp(scenario, "once") == 0 || strcmp(scenario, "driver") == 0 ||
		   strcmp(scenario, "unload") == 0 || strcmp(scenario, "depth") == 0) {
		wait_go();
		if (scenario[0] == 'u') {
			if (!handle || dlclose(handle) != 0) {
				fprintf(stderr, "cudawork: dlclose failed\n");
				return 3;
			}
		} else if (scenario[0] == 'f') {
			int rc = load_checkpoint();
			if (rc != 2) {
				fprintf(stderr, "cudawork: load_checkpoint returned %d, want 2\n", rc);
				return 3;
			}
		} else if (scenario[0] == 'o') {
			once();
		} else if (strcmp(scenario, "depth") == 0) {
			depth();
		} else {
			driver();
		}
		say("done");
		while (time(NULL) < end)
			usleep(100 * 1000);
	} else if (strcmp(scenario, "oom") == 0) {
		void *bufs[100];
		wait_go();
		oom_weights();
		oom_activations(bufs, 100);
		oom_grow();
		oom_release(bufs, 100);
		say("done");
		while (time(NULL) < end)
			usleep(100 * 1000);
	} else if (strcmp(scenario, "oomloop") == 0) {
		double rate = argc > 4 ? atof(argv[4]) : 1000;
		uint64_t span = (uint64_t)(argc > 5 ? atof(argv[5]) * 1e9 : 3e9);
		wait_go();
		oom_weights();
		uint64_t t0 = now_ns(), n = 0;
		for (uint64_t t = t0; t - t0 < span; t = now_ns()) {
			/* Paced to a schedule: late iterations catch up. */
			uint64_t due = t0 + (uint64_t)(n * 1e9 / rate);
			if (due > t) {
				usleep((due - t) / 1000);
				continue;
			}
			oom_churn();
			oom_grow();
			n++;
		}
		printf("fails %llu pairs %llu\n", (unsigned long long)n, (unsigned long long)n);
		fflush(stdout);
		while (time(NULL) < end)
			usleep(100 * 1000);
	} else if (strcmp(scenario, "waits") == 0) {
		struct waits w = { argc > 4 ? atol(argv[4]) : 100, end };
		pthread_t tid;
		wait_go();
		pthread_create(&tid, NULL, waiter, &w);
		pthread_join(tid, NULL);
	} else if (strcmp(scenario, "launches") == 0) {
		wait_go();
		launch_step(argc > 4 ? atol(argv[4]) : 100);
		say("done");
		while (time(NULL) < end)
			usleep(100 * 1000);
	} else if (strcmp(scenario, "launchbench") == 0) {
		long n = argc > 4 ? atol(argv[4]) : 100000;
		struct dim3 grid = { 1, 1, 1 }, block = { 32, 1, 1 };
		wait_go();
		uint64_t t0 = now_ns();
		for (long i = 0; i < n; i++)
			check(rt.launch_kernel(kernel_fn, grid, block, NULL, 0, NULL), "launchbench");
		printf("ns %llu\n", (unsigned long long)(now_ns() - t0));
		fflush(stdout);
	} else if (strcmp(scenario, "syncbench") == 0) {
		long n = argc > 4 ? atol(argv[4]) : 100000;
		wait_go();
		uint64_t t0 = now_ns();
		for (long i = 0; i < n; i++)
			sync_stream();
		printf("ns %llu\n", (unsigned long long)(now_ns() - t0));
		fflush(stdout);
	} else if (strcmp(scenario, "bench") == 0) {
		long n = argc > 4 ? atol(argv[4]) : 100000;
		wait_go();
		uint64_t t0 = now_ns();
		for (long i = 0; i < n; i++)
			bench_pair();
		printf("ns %llu\n", (unsigned long long)(now_ns() - t0));
		fflush(stdout);
	} else if (strcmp(scenario, "rate") == 0) {
		double rate = argc > 4 ? atof(argv[4]) : 100000;
		int threads = argc > 5 ? atoi(argv[5]) : 1;
		if (threads < 1 || threads > 64)
			threads = 1;
		pthread_t tids[64];
		struct pacer pcs[64];
		wait_go();
		uint64_t t0 = now_ns();
		for (int i = 0; i < threads; i++) {
			pcs[i] = (struct pacer){ .per_sec = rate / threads, .end = t0 + (uint64_t)seconds * 1000000000ULL };
			pthread_create(&tids[i], NULL, paced, &pcs[i]);
		}
		uint64_t pairs = 0;
		for (int i = 0; i < threads; i++) {
			pthread_join(tids[i], NULL);
			pairs += pcs[i].pairs;
		}
		printf("pairs %llu ns %llu\n", (unsigned long long)pairs, (unsigned long long)(now_ns() - t0));
		fflush(stdout);
	} else if (strcmp(scenario, "churn") == 0) {
		double rate = argc > 4 ? atof(argv[4]) : 16000;
		int threads = argc > 5 ? atoi(argv[5]) : 1;
		size_t size = argc > 6 ? strtoull(argv[6], NULL, 10) : MiB;
		if (threads < 1 || threads > 64)
			threads = 1;
		pthread_t tids[64];
		struct churner chs[64];
		wait_go();
		uint64_t t0 = now_ns();
		for (int i = 0; i < threads; i++) {
			chs[i] = (struct churner){ .pc = { .per_sec = rate / threads,
							   .end = t0 + (uint64_t)seconds * 1000000000ULL },
						   .size = size };
			pthread_create(&tids[i], NULL, churned, &chs[i]);
		}
		uint64_t pairs = 0;
		for (int i = 0; i < threads; i++) {
			pthread_join(tids[i], NULL);
			pairs += chs[i].pc.pairs;
		}
		printf("pairs %llu ns %llu\n", (unsigned long long)pairs, (unsigned long long)(now_ns() - t0));
		fflush(stdout);
	} else {
		fprintf(stderr, "cudawork: unknown scenario %s\n", scenario);
		return 2;
	}
	return 0;
}
