/* Stand-in for the CUDA runtime (soname libcudart.so.11.0, symbols under the
 * real version node, see cudart_stub.map): every allocation entry point calls
 * the driver stand-in (libcuda.so.1) on the same thread, as the real runtime
 * does, and maps its errors to runtime errors. */
#include <stddef.h>

typedef int cudaError_t;
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *cudaStream_t;
typedef void *cudaMemPool_t;

enum {
	cudaSuccess = 0,
	cudaErrorInvalidValue = 1,
	cudaErrorMemoryAllocation = 2,
};

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, void *stream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, void *pool, void *stream);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int elem);
CUresult cuMemAllocHost_v2(void **pp, size_t size);
CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemFreeAsync(CUdeviceptr dptr, void *stream);
CUresult cuMemFreeHost(void *p);

static cudaError_t err(CUresult rc)
{
	switch (rc) {
	case 0:
		return cudaSuccess;
	case 2:
		return cudaErrorMemoryAllocation;
	default:
		return cudaErrorInvalidValue;
	}
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	return err(cuMemAlloc_v2((CUdeviceptr *)devPtr, size));
}

cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t stream)
{
	return err(cuMemAllocAsync((CUdeviceptr *)devPtr, size, stream));
}

cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t pool, cudaStream_t stream)
{
	return err(cuMemAllocFromPoolAsync((CUdeviceptr *)ptr, size, pool, stream));
}

cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
	return err(cuMemAllocManaged((CUdeviceptr *)devPtr, size, flags));
}

cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
	return err(cuMemAllocPitch_v2((CUdeviceptr *)devPtr, pitch, width, height, 4));
}

cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	return err(cuMemAllocHost_v2(ptr, size));
}

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	return err(cuMemHostAlloc(pHost, size, flags));
}

cudaError_t cudaFree(void *devPtr)
{
	return err(cuMemFree_v2((CUdeviceptr)devPtr));
}

cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t stream)
{
	return err(cuMemFreeAsync((CUdeviceptr)devPtr, stream));
}

cudaError_t cudaFreeHost(void *ptr)
{
	return err(cuMemFreeHost(ptr));
}
