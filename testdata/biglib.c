/* Leaks an fd every 50 ms from a function of a library with 300 000 symbols
 * (built by pkg/testutil.BigLibrary), loaded with dlopen: the symbolizer
 * must name that function without holding the whole symbol table. With
 * LIBCUDART, every 2 s the library's burst_in_big_library also takes
 * 100 x 64 MiB of (stand-in) GPU memory and frees it at once.
 *
 * usage: biglib LIBRARY SECONDS [LIBCUDART] */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: biglib LIBRARY SECONDS [LIBCUDART]\n");
		return 2;
	}
	void *h = dlopen(argv[1], RTLD_NOW);
	if (!h) {
		fprintf(stderr, "biglib: %s\n", dlerror());
		return 2;
	}
	int (*leak)(void) = (int (*)(void))dlsym(h, "leak_in_big_library");
	if (!leak) {
		fprintf(stderr, "biglib: %s\n", dlerror());
		return 2;
	}
	int (*burst)(void *, void *) = (int (*)(void *, void *))dlsym(h, "burst_in_big_library");
	void *rt_malloc = NULL, *rt_free = NULL;
	if (argc == 4) {
		void *rt = dlopen(argv[3], RTLD_NOW);
		if (!rt || !burst) {
			fprintf(stderr, "biglib: %s\n", dlerror());
			return 2;
		}
		rt_malloc = dlsym(rt, "cudaMalloc");
		rt_free = dlsym(rt, "cudaFree");
		if (!rt_malloc || !rt_free) {
			fprintf(stderr, "biglib: %s\n", dlerror());
			return 2;
		}
	}
	printf("ready\n");
	fflush(stdout);
	time_t end = time(NULL) + atoi(argv[2]);
	for (int i = 1; time(NULL) < end; i++) {
		if (leak() < 0)
			return 3;
		if (rt_malloc && i % 40 == 0 && burst(rt_malloc, rt_free) < 0)
			return 3;
		usleep(50 * 1000);
	}
	return 0;
}
