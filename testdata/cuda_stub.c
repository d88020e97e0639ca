/* Stand-in for the CUDA driver library (soname libcuda.so.1): the allocation
 * entry points with their real names and signatures, backed by malloc. A
 * "device pointer" is the address of a malloc'd block, so it is unique while
 * live; nothing is ever run on a device.
 *
 * CUDA_STUB_LIMIT (bytes, read at load): a larger request fails with
 * CUDA_ERROR_OUT_OF_MEMORY, as a full GPU would.
 * CUDA_STUB_MEMORY (bytes, read at load): the device's memory. A device
 * allocation that would take the live total of device allocations over it
 * fails with CUDA_ERROR_OUT_OF_MEMORY; frees give it back. Pinned host
 * memory does not count.
 * CUDA_STUB_STOP (set, read at load): the first allocation stops the
 * process (SIGSTOP) inside the call, for a debugger's view of the stack.
 * CUDA_STUB_SYNC_US (microseconds, read at load, default 5): how long each
 * synchronising call (cuCtxSynchronize, cuStreamSynchronize,
 * cuEventSynchronize, the synchronous cuMemcpy*) waits, as for a GPU still
 * busy: at least that long (clock_nanosleep to a deadline), so tests can
 * bound the waits they see from below; 0: no wait, the call returns at once
 * (a benchmark's sync call costs the call and its hooks, not a sleep's
 * timer). Launches return at once. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef void *CUevent;
typedef void *CUfunction;
typedef void *CUgraphExec;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
};

static size_t limit = SIZE_MAX;
static size_t memory = SIZE_MAX;
static size_t in_use; /* device bytes live, updated atomically */
static int stop;
static long long sync_ns = 5000;

__attribute__((constructor)) static void init(void)
{
	const char *s = getenv("CUDA_STUB_LIMIT");
	if (s && *s)
		limit = strtoull(s, NULL, 10);
	s = getenv("CUDA_STUB_MEMORY");
	if (s && *s)
		memory = strtoull(s, NULL, 10);
	stop = getenv("CUDA_STUB_STOP") != NULL;
	s = getenv("CUDA_STUB_SYNC_US");
	if (s && *s)
		sync_ns = strtoll(s, NULL, 10) * 1000;
}

/* The GPU "finishes" sync_ns after the call began: sleeping to an absolute
 * deadline never returns early, even when a signal interrupts the sleep. */
static void gpu_wait(void)
{
	if (sync_ns <= 0)
		return;
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	long long ns = t.tv_nsec + sync_ns;
	t.tv_sec += ns / 1000000000LL;
	t.tv_nsec = ns % 1000000000LL;
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) != 0)
		;
}

/* Each block starts with a header giving its size and kind, so that a free
 * gives the device its bytes back; the pointer handed out follows it. */
struct header {
	size_t size;
	int device;
	int pad;
};

/* Takes size bytes of the device's memory; 0 when it has not that much. */
static int take(size_t size)
{
	size_t was = __atomic_load_n(&in_use, __ATOMIC_RELAXED);
	do {
		if (size > memory || was > memory - size)
			return 0;
	} while (!__atomic_compare_exchange_n(&in_use, &was, was + size, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
	return 1;
}

static CUresult alloc_kind(void **out, size_t size, int device)
{
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	if (size > limit)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (stop) {
		stop = 0;
		raise(SIGSTOP);
	}
	if (device && !take(size))
		return CUDA_ERROR_OUT_OF_MEMORY;
	struct header *h = malloc(sizeof(*h) + (size ? size : 1));
	if (!h) {
		if (device)
			__atomic_fetch_sub(&in_use, size, __ATOMIC_RELAXED);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	h->size = size;
	h->device = device;
	*out = h + 1;
	return CUDA_SUCCESS;
}

static CUresult alloc(void **out, size_t size)
{
	return alloc_kind(out, size, 1);
}

static void release(void *p)
{
	if (!p)
		return;
	struct header *h = (struct header *)p - 1;
	if (h->device)
		__atomic_fetch_sub(&in_use, h->size, __ATOMIC_RELAXED);
	free(h);
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
	return alloc((void **)dptr, size);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream)
{
	(void)stream;
	return alloc((void **)dptr, size);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream)
{
	(void)pool;
	(void)stream;
	return alloc((void **)dptr, size);
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
	(void)flags;
	return alloc((void **)dptr, size);
}

/* Rows are padded to 512 bytes, as real devices align them. */
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elem)
{
	(void)elem;
	if (!pitch)
		return CUDA_ERROR_INVALID_VALUE;
	size_t p = (width + 511) & ~(size_t)511;
	CUresult rc = alloc((void **)dptr, p * height);
	if (rc == CUDA_SUCCESS)
		*pitch = p;
	return rc;
}

CUresult cuMemAllocHost_v2(void **pp, size_t size)
{
	return alloc_kind(pp, size, 0);
}

CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
	(void)flags;
	return alloc_kind(pp, size, 0);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	release((void *)dptr);
	return CUDA_SUCCESS;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
	(void)stream;
	release((void *)dptr);
	return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p)
{
	release(p);
	return CUDA_SUCCESS;
}

/* Virtual memory management: a handle names physical memory, mapped into a
 * reserved range separately. */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const void *prop, unsigned long long flags)
{
	(void)prop;
	(void)flags;
	return alloc((void **)handle, size);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	release((void *)handle);
	return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags)
{
	(void)ptr;
	(void)size;
	(void)offset;
	(void)handle;
	(void)flags;
	return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	(void)ptr;
	(void)size;
	return CUDA_SUCCESS;
}

/* Synchronisation: the host waits until the device is done. */
CUresult cuCtxSynchronize(void)
{
	gpu_wait();
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
	(void)hStream;
	gpu_wait();
	return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
	(void)hEvent;
	gpu_wait();
	return CUDA_SUCCESS;
}

/* Synchronous copies: "device" memory is host memory here, so the copy is a
 * memcpy, after which the host waits as for the device. */
CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	if (ByteCount && (!dstHost || !srcDevice))
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(dstHost, (const void *)srcDevice, ByteCount);
	gpu_wait();
	return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	if (ByteCount && (!dstDevice || !srcHost))
		return CUDA_ERROR_INVALID_VALUE;
	memcpy((void *)dstDevice, srcHost, ByteCount);
	gpu_wait();
	return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	if (ByteCount && (!dstDevice || !srcDevice))
		return CUDA_ERROR_INVALID_VALUE;
	memmove((void *)dstDevice, (const void *)srcDevice, ByteCount);
	gpu_wait();
	return CUDA_SUCCESS;
}

/* Launches are queued on a stream and return at once. */
CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
			unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
			unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
	(void)gridDimX;
	(void)gridDimY;
	(void)gridDimZ;
	(void)blockDimX;
	(void)blockDimY;
	(void)blockDimZ;
	(void)sharedMemBytes;
	(void)hStream;
	(void)kernelParams;
	(void)extra;
	return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	(void)hStream;
	return hGraphExec ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
