/* gpuhold: for scripts/gpu-check.sh on a machine with an NVIDIA GPU. Loads the
 * real CUDA runtime with dlopen (no CUDA headers or nvcc needed), allocates
 * COUNT blocks of MiB MiB with cudaMalloc from hold_weights(), prints "ready",
 * holds them for SECONDS, frees them and exits. With BUSY set (GPUHOLD_BUSY=1)
 * it keeps the GPU busy while holding them, in keep_busy(): cudaMemset over
 * every block, again and again (the runtime's memset is a kernel: SM and
 * memory utilization rise), so that per-process utilization has something
 * to show.
 *
 * usage: gpuhold LIBCUDART COUNT MiB SECONDS */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <time.h>

typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);
typedef int (*memset_fn)(void *, int, size_t);
typedef int (*sync_fn)(void);

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

__attribute__((noinline)) void keep_busy(memset_fn memset_dev, sync_fn sync, void **blocks, int count, size_t bytes,
					 int seconds)
{
	time_t end = time(NULL) + seconds;
	for (int v = 0; time(NULL) < end; v++) {
		for (int i = 0; i < count; i++)
			memset_dev(blocks[i], v & 0xff, bytes);
		sync();
	}
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
	memset_fn memset_dev = (memset_fn)dlsym(h, "cudaMemset");
	sync_fn sync = (sync_fn)dlsym(h, "cudaDeviceSynchronize");
	if (getenv("GPUHOLD_BUSY") && memset_dev && sync)
		keep_busy(memset_dev, sync, blocks, count, bytes, atoi(argv[4]));
	else
		sleep(atoi(argv[4]));
	for (int i = 0; i < count; i++)
		cuda_free(blocks[i]);
	return 0;
}
