/* AArch64 fixture for the call-frame tests, built with
 * -mbranch-protection=standard: functions that save x30 sign it first
 * (paciasp) and say so in their CFI (DW_CFA_AARCH64_negate_ra_state);
 * leaf() keeps its return address in x30. Hidden: called directly, not
 * through the PLT, so that a test finds each call. */
#include <stdlib.h>

__attribute__((noinline, visibility("hidden"))) long leaf(long x)
{
	return x * 3 + 1;
}

__attribute__((noinline, visibility("hidden"))) long inner(long *v, long n)
{
	long s = 0;
	for (long i = 0; i < n; i++)
		s += leaf(v[i]);
	return s;
}

long outer(long n)
{
	long *v = malloc(n * sizeof(*v));
	if (!v)
		return -1;
	for (long i = 0; i < n; i++)
		v[i] = i;
	long s = inner(v, n);
	free(v);
	return s;
}
