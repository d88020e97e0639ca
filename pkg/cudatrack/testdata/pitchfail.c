/* Failing pitched allocations, for TestPitchFailure: the same step protocol
 * as testdata/cudawork.c (CUDAWORK_STEP=1), against the runtime stand-in.
 *
 * usage: pitchfail LIBCUDART SCENARIO SECONDS  (SCENARIO is ignored)
 *
 * Prints "ready", loads LIBCUDART after a SIGUSR1 with a 1 GiB limit on the
 * stand-in GPU and prints "loaded"; after another SIGUSR1 asks
 * cudaMallocPitch for 3000 x 1000000 bytes and cuMemAllocPitch_v2 for
 * 5000 x 300000 bytes, both over the limit, prints "done" and stays until
 * SECONDS have passed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef int (*pitch_fn)(void **, size_t *, size_t, size_t);
typedef int (*cu_pitch_fn)(unsigned long long *, size_t *, size_t, size_t, unsigned int);

static void *sym(void *h, const char *name)
{
	void *p = dlsym(h, name);
	if (!p) {
		fprintf(stderr, "pitchfail: %s: %s\n", name, dlerror());
		exit(2);
	}
	return p;
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

__attribute__((noinline)) static int load_image(pitch_fn malloc_pitch)
{
	void *p = NULL;
	size_t pitch = 0;
	return malloc_pitch(&p, &pitch, 3000, 1000000);
}

__attribute__((noinline)) static int load_image_driver(cu_pitch_fn alloc_pitch)
{
	unsigned long long p = 0;
	size_t pitch = 0;
	return alloc_pitch(&p, &pitch, 5000, 300000, 4);
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: pitchfail LIBCUDART SCENARIO SECONDS\n");
		return 2;
	}
	int seconds = atoi(argv[3]);
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	setenv("CUDA_STUB_LIMIT", "1073741824", 1);

	say("ready");
	wait_go();
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) {
		fprintf(stderr, "pitchfail: %s\n", dlerror());
		return 2;
	}
	void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!drv) {
		fprintf(stderr, "pitchfail: libcuda.so.1 not loaded: %s\n", dlerror());
		return 2;
	}
	say("loaded");
	time_t end = time(NULL) + seconds;
	wait_go();
	int rc = load_image((pitch_fn)sym(h, "cudaMallocPitch"));
	if (rc != 2) {
		fprintf(stderr, "pitchfail: cudaMallocPitch returned %d, want 2\n", rc);
		return 3;
	}
	rc = load_image_driver((cu_pitch_fn)sym(drv, "cuMemAllocPitch_v2"));
	if (rc != 2) {
		fprintf(stderr, "pitchfail: cuMemAllocPitch_v2 returned %d, want 2\n", rc);
		return 3;
	}
	say("done");
	while (time(NULL) < end)
		usleep(100 * 1000);
	return 0;
}
