/* Stand-in for the CUDA driver library (soname libcuda.so.1): the allocation
 * entry points with their real names and signatures, backed by malloc. A
 * "device pointer" is the address of a malloc'd block, so it is unique while
 * live; nothing is ever run on a device.
 *
 * CUDA_STUB_LIMIT (bytes, read at load): a larger request fails with
 * CUDA_ERROR_OUT_OF_MEMORY, as a full GPU would.
 * CUDA_STUB_STOP (set, read at load): the first allocation stops the
 * process (SIGSTOP) inside the call, for a debugger's view of the stack. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUstream;
typedef void *CUmemoryPool;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
};

static size_t limit = SIZE_MAX;
static int stop;

__attribute__((constructor)) static void init(void)
{
	const char *s = getenv("CUDA_STUB_LIMIT");
	if (s && *s)
		limit = strtoull(s, NULL, 10);
	stop = getenv("CUDA_STUB_STOP") != NULL;
}

static CUresult alloc(void **out, size_t size)
{
	if (!out)
		return CUDA_ERROR_INVALID_VALUE;
	if (size > limit)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (stop) {
		stop = 0;
		raise(SIGSTOP);
	}
	void *p = malloc(size ? size : 1);
	if (!p)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*out = p;
	return CUDA_SUCCESS;
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
	return alloc(pp, size);
}

CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
	(void)flags;
	return alloc(pp, size);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	free((void *)dptr);
	return CUDA_SUCCESS;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
	(void)stream;
	free((void *)dptr);
	return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p)
{
	free(p);
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
	free((void *)handle);
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
