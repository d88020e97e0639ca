/* gpuhold: for scripts/gpu-check.sh on a machine with an NVIDIA GPU. Loads the
 * real CUDA runtime with dlopen (no CUDA headers or nvcc needed), allocates
 * COUNT blocks of MiB MiB with cudaMalloc from hold_weights(), prints "ready",
 * holds them for SECONDS, frees them and exits.
 *
 * usage: gpuhold LIBCUDART COUNT MiB SECONDS */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);

static malloc_fn cuda_malloc;

__attribute__((noinline)) int hold_weights(void **blocks, int count, size_t bytes)
{
	for (int i = 0; i < count; i++) {
		int rc = cuda_malloc(&blocks[i], bytes);
		if (rc != 0) {
			fprintf(stderr, "gpuhold: cudaMalloc failed with %d\n", rc);
			return rc;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: gpuhold LIBCUDART COUNT MiB SECONDS\n");
		return 2;
	}
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) {
		fprintf(stderr, "gpuhold: %s\n", dlerror());
		return 1;
	}
	cuda_malloc = (malloc_fn)dlsym(h, "cudaMalloc");
	free_fn cuda_free = (free_fn)dlsym(h, "cudaFree");
	int count = atoi(argv[2]);
	size_t bytes = (size_t)atol(argv[3]) << 20;
	void **blocks = calloc(count, sizeof(void *));
	if (!cuda_malloc || !cuda_free || !blocks)
		return 1;
	/* Give the tracer time to hook the runtime loaded above. */
	sleep(3);
	if (hold_weights(blocks, count, bytes))
		return 1;
	printf("ready\n");
	fflush(stdout);
	sleep(atoi(argv[4]));
	for (int i = 0; i < count; i++)
		cuda_free(blocks[i]);
	return 0;
}
