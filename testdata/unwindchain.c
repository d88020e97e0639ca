/* Six calls deep down to cudaMalloc, built -O2 -fomit-frame-pointer as
 * distributions build their code: rbp is a general register here, so the
 * frame-pointer chain is garbage and only the call-frame information
 * (.eh_frame) leads from cudaMalloc back to main. The unwinding tests
 * compare the stack the tracer recorded with eu-stack's view of the same
 * process, stopped inside the call (CUDA_STUB_STOP), or blocked opening a
 * FIFO (argument: its path) instead of allocating.
 *
 * Prints "ready"; at each SIGUSR1 allocates (or opens) and prints "done". */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int cudaMalloc(void **devPtr, size_t size);

static volatile sig_atomic_t go;
static void on_usr1(int sig) { (void)sig; go = 1; }

/* The frames differ in size and keep data live across the call, so that
 * every level has a CFA offset of its own; the work after each call keeps
 * it from being a tail call. */
#define LEVEL(name, next, words)                                              \
	__attribute__((noinline)) long name(long n)                           \
	{                                                                      \
		volatile long buf[words];                                      \
		for (int i = 0; i < words; i++)                                \
			buf[i] = n * i;                                        \
		long r = next(n + 1);                                          \
		return r + buf[n % words];                                     \
	}

static const char *fifo;

__attribute__((noinline)) long alloc_weights(long n)
{
	if (fifo)
		return open(fifo, O_RDONLY) < 0 ? -1 : n;
	void *p = 0;
	if (cudaMalloc(&p, (size_t)n << 20))
		return -1;
	return p ? n : -1;
}

LEVEL(build_layer, alloc_weights, 3)
LEVEL(build_block, build_layer, 17)
LEVEL(build_model, build_block, 5)
LEVEL(load_checkpoint, build_model, 29)
LEVEL(serve, load_checkpoint, 11)

int main(int argc, char **argv)
{
	fifo = argc > 1 ? argv[1] : NULL;
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1;
	sigaction(SIGUSR1, &sa, NULL);
	/* SIGUSR1 is let in only inside sigsuspend: one that came between the
	 * test of go and a pause() would be lost, and the test wait forever. */
	sigset_t usr1, open_set;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigprocmask(SIG_BLOCK, &usr1, &open_set);
	printf("ready\n");
	fflush(stdout);
	for (;;) {
		while (!go)
			sigsuspend(&open_set);
		go = 0;
		long r = serve(1);
		printf("done %ld\n", r);
		fflush(stdout);
	}
}
