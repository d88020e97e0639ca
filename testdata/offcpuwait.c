/* A thread that waits in a loop of short sleeps inside a named function,
 * as a data loader polling for a batch that never comes: it keeps leaving
 * the CPU from load_next_batch. The off-CPU tracer's test names it.
 *
 * usage: offcpuwait SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) static void nap(void)
{
	struct timespec ts = {0, 1000000};
	nanosleep(&ts, NULL);
}

__attribute__((noinline)) static void load_next_batch(long seconds)
{
	time_t end = time(NULL) + seconds;
	while (time(NULL) < end)
		nap();
}

int main(int argc, char **argv)
{
	long seconds = argc > 1 ? atol(argv[1]) : 60;
	printf("ready\n");
	fflush(stdout);
	load_next_batch(seconds);
	return 0;
}
