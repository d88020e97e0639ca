/* demo: a stand-in inference worker for `make demo`. It serves fake requests
 * at ~20/s. Every request opens and closes its scratch files properly, but
 * cache_tokenizer() opens the tokenizer file again on every request and never
 * closes it: the worker leaks one fd per request.
 *
 * Given a CUDA runtime (argv[2]; `make demo` passes the stand-in under
 * testdata/bin/cuda), it loads it late with dlopen, as PyTorch does, and
 * each request allocates and frees a 16 MiB scratch buffer (steady GPU
 * traffic). After 12 s warmup_kv_cache() allocates 3 GiB at once and frees it
 * a second later (a burst); after 15 s load_adapter() asks for more than the
 * device has (a failed allocation).
 *
 * usage: demo [SECONDS [LIBCUDART]]   (default 60 s, no GPU side)
 * Built with frame pointers so stacks can be walked. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))
#define MiB (1024UL * 1024)

typedef int (*cuda_malloc_fn)(void **, size_t);
typedef int (*cuda_free_fn)(void *);

static cuda_malloc_fn cuda_malloc;
static cuda_free_fn cuda_free;

static int handles[100000];
static int nhandles;

/* The bug: a per-request open meant to be cached once. */
NOINLINE void cache_tokenizer(void)
{
	int fd = open("/etc/hostname", O_RDONLY);
	if (fd >= 0 && nhandles < 100000)
		handles[nhandles++] = fd;
}

/* Healthy: scratch files and GPU buffers are released within the request. */
NOINLINE void run_inference(void)
{
	char buf[256];
	int fd = open("/proc/self/stat", O_RDONLY);
	if (fd >= 0) {
		if (read(fd, buf, sizeof(buf)) < 0)
			perror("read");
		close(fd);
	}
	int p[2];
	if (pipe(p) == 0) {
		close(p[0]);
		close(p[1]);
	}
	void *scratch;
	if (cuda_malloc && cuda_malloc(&scratch, 16 * MiB) == 0)
		cuda_free(scratch);
}

NOINLINE void handle_request(void)
{
	cache_tokenizer();
	run_inference();
}

/* A burst: 48 blocks of 64 MiB, held for a second, then released. */
NOINLINE void warmup_kv_cache(void)
{
	void *blocks[48];
	int n = 0;
	for (int i = 0; i < 48; i++)
		if (cuda_malloc(&blocks[n], 64 * MiB) == 0)
			n++;
	sleep(1);
	while (n > 0)
		cuda_free(blocks[--n]);
}

/* An allocation larger than the device: fails with an out-of-memory error. */
NOINLINE void load_adapter(void)
{
	void *adapter;
	int rc = cuda_malloc(&adapter, 2048 * MiB);
	if (rc == 0)
		cuda_free(adapter);
	else
		printf("demo worker: loading the adapter failed (CUDA error %d)\n", rc);
}

static void load_cuda(const char *path)
{
	void *h = dlopen(path, RTLD_NOW);
	if (!h) {
		fprintf(stderr, "demo: %s\n", dlerror());
		exit(1);
	}
	cuda_malloc = (cuda_malloc_fn)dlsym(h, "cudaMalloc");
	cuda_free = (cuda_free_fn)dlsym(h, "cudaFree");
	if (!cuda_malloc || !cuda_free) {
		fprintf(stderr, "demo: cudaMalloc/cudaFree missing in %s\n", path);
		exit(1);
	}
}

int main(int argc, char **argv)
{
	int secs = argc > 1 ? atoi(argv[1]) : 60;
	const char *cudart = argc > 2 ? argv[2] : NULL;
	struct timespec tick = { 0, 50 * 1000 * 1000 };
	printf("demo worker %d: serving requests for %ds%s\n", getpid(), secs, cudart ? " on the GPU" : "");
	fflush(stdout);
	for (int i = 0; i < secs * 20; i++) {
		if (cudart && i == 40)
			load_cuda(cudart);
		if (cuda_malloc && i == 240)
			warmup_kv_cache();
		if (cuda_malloc && i == 300)
			load_adapter();
		handle_request();
		nanosleep(&tick, NULL);
	}
	return 0;
}
