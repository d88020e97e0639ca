/* demo: a stand-in inference worker for `make demo`. It serves fake requests
 * at ~20/s: every request opens and closes its scratch files properly, but
 * cache_tokenizer() opens the tokenizer file again on every request and never
 * closes it, so the worker leaks one fd per request. Runs for SECONDS (default
 * 60). Built with frame pointers so stacks can be walked. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline))

static int handles[100000];
static int nhandles;

/* The bug: a per-request open meant to be cached once. */
NOINLINE void cache_tokenizer(void)
{
	int fd = open("/etc/hostname", O_RDONLY);
	if (fd >= 0 && nhandles < 100000)
		handles[nhandles++] = fd;
}

/* Healthy: scratch files are opened and closed within the request. */
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
}

NOINLINE void handle_request(void)
{
	cache_tokenizer();
	run_inference();
}

int main(int argc, char **argv)
{
	int secs = argc > 1 ? atoi(argv[1]) : 60;
	struct timespec tick = { 0, 50 * 1000 * 1000 };
	printf("demo worker %d: serving requests for %ds\n", getpid(), secs);
	fflush(stdout);
	for (int i = 0; i < secs * 20; i++) {
		handle_request();
		nanosleep(&tick, NULL);
	}
	return 0;
}
