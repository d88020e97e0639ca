/* The pods' sandbox process (containerd's sandbox_image): holds the pod's
 * namespaces and waits for a signal. Reaps what is reparented to it. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void quit(int sig) { _exit(0); }
static void reap(int sig) { while (waitpid(-1, NULL, WNOHANG) > 0) ; }

int main(void)
{
	signal(SIGINT, quit);
	signal(SIGTERM, quit);
	signal(SIGCHLD, reap);
	for (;;)
		pause();
}
