/* Leaks an fd every 50 ms from a function of a library with 300 000 symbols
 * (built by pkg/testutil.BigLibrary), loaded with dlopen: the symbolizer
 * must name that function without holding the whole symbol table.
 *
 * usage: biglib LIBRARY SECONDS */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: biglib LIBRARY SECONDS\n");
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
	printf("ready\n");
	fflush(stdout);
	time_t end = time(NULL) + atoi(argv[2]);
	while (time(NULL) < end) {
		if (leak() < 0)
			return 3;
		usleep(50 * 1000);
	}
	return 0;
}
