/* Stand-in for the CUDA runtime (soname libcudart.so.11.0, symbols under the
 * real version node, see cudart_stub.map): every allocation, synchronising
 * and launch entry point calls the driver stand-in (libcuda.so.1) on the same
 * thread, as the real runtime does, and maps its errors to runtime errors. */
#include <stddef.h>

typedef int cudaError_t;
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *cudaStream_t;
typedef void *cudaMemPool_t;
typedef void *cudaEvent_t;
typedef void *cudaGraphExec_t;

/* As in driver_types.h / vector_types.h. */
enum cudaMemcpyKind {
	cudaMemcpyHostToHost = 0,
	cudaMemcpyHostToDevice = 1,
	cudaMemcpyDeviceToHost = 2,
	cudaMemcpyDeviceToDevice = 3,
	cudaMemcpyDefault = 4,
};

typedef struct dim3 {
	unsigned int x, y, z;
} dim3;

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
CUresult cuCtxSynchronize(void);
CUresult cuStreamSynchronize(void *hStream);
CUresult cuEventSynchronize(void *hEvent);
CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
CUresult cuLaunchKernel(void *f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
			unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
			unsigned int sharedMemBytes, void *hStream, void **kernelParams, void **extra);
CUresult cuGraphLaunch(void *hGraphExec, void *hStream);

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

cudaError_t cudaDeviceSynchronize(void)
{
	return err(cuCtxSynchronize());
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	return err(cuStreamSynchronize(stream));
}

cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	return err(cuEventSynchronize(event));
}

/* Synchronous copy: the driver's copy for the direction. Host and "device"
 * memory are both host memory here, so host-to-host and unified (Default)
 * copies take the device-to-device path. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	switch (kind) {
	case cudaMemcpyHostToDevice:
		return err(cuMemcpyHtoD_v2((CUdeviceptr)dst, src, count));
	case cudaMemcpyDeviceToHost:
		return err(cuMemcpyDtoH_v2(dst, (CUdeviceptr)src, count));
	case cudaMemcpyHostToHost:
	case cudaMemcpyDeviceToDevice:
	case cudaMemcpyDefault:
		return err(cuMemcpyDtoD_v2((CUdeviceptr)dst, (CUdeviceptr)src, count));
	}
	return cudaErrorInvalidValue;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
			     cudaStream_t stream)
{
	return err(cuLaunchKernel((void *)func, gridDim.x, gridDim.y, gridDim.z, blockDim.x, blockDim.y,
				  blockDim.z, (unsigned int)sharedMem, stream, args, NULL));
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	return err(cuGraphLaunch(graphExec, stream));
}
