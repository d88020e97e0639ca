/* Calls the real CUDA runtime (libcudart.so.11.0, loaded with dlopen so the
 * fixture builds without CUDA headers) from a named function, so a test can
 * check that a failed cudaMalloc is reported with its error name and stack.
 *
 * usage: realcuda SECONDS [DELAY_MS]
 * Prints "ready" once the runtime is loaded, waits DELAY_MS (300) for the
 * tracer to hook it, then calls allocate_weights every 100 ms until SECONDS
 * have passed.
 * On a machine without a GPU every call fails (cudaErrorNoDevice). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);

static malloc_fn cuda_malloc;
static free_fn cuda_free;

/* noinline: the test looks for this name in the failure's stack. */
__attribute__((noinline)) int allocate_weights(size_t bytes)
{
	void *p = NULL;
	int rc = cuda_malloc(&p, bytes);
	if (rc == 0)
		cuda_free(p);
	return rc;
}

int main(int argc, char **argv)
{
	int seconds = argc > 1 ? atoi(argv[1]) : 30;
	int delay_ms = argc > 2 ? atoi(argv[2]) : 300;
	void *h = dlopen("libcudart.so.11.0", RTLD_NOW);
	if (!h) {
		fprintf(stderr, "realcuda: %s\n", dlerror());
		return 2;
	}
	cuda_malloc = (malloc_fn)dlsym(h, "cudaMalloc");
	cuda_free = (free_fn)dlsym(h, "cudaFree");
	if (!cuda_malloc || !cuda_free) {
		fprintf(stderr, "realcuda: cudaMalloc/cudaFree missing\n");
		return 2;
	}
	printf("ready\n");
	fflush(stdout);
	usleep(delay_ms * 1000);
	time_t end = time(NULL) + seconds;
	int last = -1;
	while (time(NULL) < end) {
		int rc = allocate_weights(64 << 20);
		if (rc != last) {
			fprintf(stderr, "realcuda: cudaMalloc returned %d\n", rc);
			last = rc;
		}
		usleep(100 * 1000);
	}
	return 0;
}
