/* Test target for package symbolize: prints the address of leakyfn, then
 * waits to be symbolized and killed. */
#include <stdio.h>
#include <unistd.h>

/* nosize is a function without an ELF symbol size, as hand-written assembly
 * often is; it is never called. */
__asm__(".text\n"
	".globl nosize\n"
	".type nosize, %function\n"
	"nosize:\n"
	"\tnop\n"
	"\tnop\n"
	"\tret\n");

__attribute__((noinline)) int leakyfn(int n)
{
	volatile int acc = 0;
	for (int i = 0; i < n; i++)
		acc += i;
	return acc;
}

int main(void)
{
	printf("%p\n", (void *)leakyfn);
	fflush(stdout);
	leakyfn(3);
	for (;;)
		pause();
}
