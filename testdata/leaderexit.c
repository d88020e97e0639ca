/* leaderexit: the main thread calls pthread_exit while a worker thread runs
 * on for SECONDS, so the process's leader shows as a zombie ("Zl" in ps)
 * while the process is alive. Prints "ready" from the worker. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void *worker(void *arg)
{
	usleep(100 * 1000); /* let the leader exit first */
	printf("ready\n");
	fflush(stdout);
	sleep(*(int *)arg);
	return NULL;
}

int main(int argc, char **argv)
{
	static int secs;
	pthread_t th;
	secs = argc > 1 ? atoi(argv[1]) : 30;
	pthread_create(&th, NULL, worker, &secs);
	pthread_exit(NULL);
}
