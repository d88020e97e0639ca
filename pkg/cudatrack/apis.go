package cudatrack

import "strconv"

// Shapes of the hooked functions' arguments; each has its own entry program.
const (
	shapeAlloc  = iota // (T **out, size_t size, ...)
	shapePitch         // (T **out, size_t *pitch, size_t width, size_t height, ...)
	shapeFree          // (T ptr, ...)
	shapeCount         // (ptr, size_t size, ...): only counted
	shapeSync          // a synchronising call: the host waits on the GPU, timed by site and thread
	shapeLaunch        // a kernel launch: timed per process, hooked only with Config.Launches
)

// Layers of the CUDA stack.
const (
	LayerRuntime = "runtime"
	LayerDriver  = "driver"
)

// API is one hooked function.
type API struct {
	Name  string
	Layer string
	Shape int
	Host  bool // allocates pinned host memory, not device memory
}

// Alloc reports whether the function allocates (and may fail to).
func (a API) Alloc() bool { return a.Shape == shapeAlloc || a.Shape == shapePitch }

// APIs lists the hooked functions; the index is the BPF cookie and follows
// enum cuda_api in bpf/cuda.bpf.c.
var APIs = []API{
	{"cudaMalloc", LayerRuntime, shapeAlloc, false},
	{"cudaMallocAsync", LayerRuntime, shapeAlloc, false},
	{"cudaMallocFromPoolAsync", LayerRuntime, shapeAlloc, false},
	{"cudaMallocManaged", LayerRuntime, shapeAlloc, false},
	{"cudaMallocPitch", LayerRuntime, shapePitch, false},
	{"cudaMallocHost", LayerRuntime, shapeAlloc, true},
	{"cudaHostAlloc", LayerRuntime, shapeAlloc, true},
	{"cudaFree", LayerRuntime, shapeFree, false},
	{"cudaFreeAsync", LayerRuntime, shapeFree, false},
	{"cudaFreeHost", LayerRuntime, shapeFree, false},
	{"cuMemAlloc_v2", LayerDriver, shapeAlloc, false},
	{"cuMemAllocAsync", LayerDriver, shapeAlloc, false},
	{"cuMemAllocFromPoolAsync", LayerDriver, shapeAlloc, false},
	{"cuMemAllocManaged", LayerDriver, shapeAlloc, false},
	{"cuMemAllocPitch_v2", LayerDriver, shapePitch, false},
	{"cuMemAllocHost_v2", LayerDriver, shapeAlloc, true},
	{"cuMemHostAlloc", LayerDriver, shapeAlloc, true},
	{"cuMemFree_v2", LayerDriver, shapeFree, false},
	{"cuMemFreeAsync", LayerDriver, shapeFree, false},
	{"cuMemFreeHost", LayerDriver, shapeFree, false},
	{"cuMemCreate", LayerDriver, shapeAlloc, false},
	{"cuMemRelease", LayerDriver, shapeFree, false},
	{"cuMemMap", LayerDriver, shapeCount, false},
	{"cuMemUnmap", LayerDriver, shapeCount, false},
	{"cudaDeviceSynchronize", LayerRuntime, shapeSync, false},
	{"cudaStreamSynchronize", LayerRuntime, shapeSync, false},
	{"cudaEventSynchronize", LayerRuntime, shapeSync, false},
	{"cudaMemcpy", LayerRuntime, shapeSync, false},
	{"cuCtxSynchronize", LayerDriver, shapeSync, false},
	{"cuStreamSynchronize", LayerDriver, shapeSync, false},
	{"cuEventSynchronize", LayerDriver, shapeSync, false},
	{"cuMemcpyDtoH_v2", LayerDriver, shapeSync, false},
	{"cuMemcpyHtoD_v2", LayerDriver, shapeSync, false},
	{"cuMemcpyDtoD_v2", LayerDriver, shapeSync, false},
	{"cudaLaunchKernel", LayerRuntime, shapeLaunch, false},
	{"cudaGraphLaunch", LayerRuntime, shapeLaunch, false},
	{"cuLaunchKernel", LayerDriver, shapeLaunch, false},
}

// Timed reports whether the function's calls are timed from entry to
// return (waits and launches): its return goes to the timed return
// programs, which keep their own per-thread state.
func (a API) Timed() bool { return a.Shape == shapeSync || a.Shape == shapeLaunch }

// retKey names the return program of a function: one per layer for the
// allocation shapes, one per layer for the timed ones.
func (a API) retKey() string {
	if a.Timed() {
		return "timed " + a.Layer
	}
	return a.Layer
}

// apiIndex maps a function name to its cookie.
var apiIndex = func() map[string]int {
	m := make(map[string]int, len(APIs))
	for i, a := range APIs {
		m[a.Name] = i
	}
	return m
}()

// LayerSymbols returns the names of the hooked functions of one layer.
func LayerSymbols(layer string) []string {
	var out []string
	for _, a := range APIs {
		if a.Layer == layer {
			out = append(out, a.Name)
		}
	}
	return out
}

// Common cudaError_t values (driver_types.h).
var runtimeErrors = map[int]string{
	0:   "cudaSuccess",
	1:   "cudaErrorInvalidValue",
	2:   "cudaErrorMemoryAllocation",
	3:   "cudaErrorInitializationError",
	4:   "cudaErrorCudartUnloading",
	34:  "cudaErrorStubLibrary",
	35:  "cudaErrorInsufficientDriver",
	36:  "cudaErrorCallRequiresNewerDriver",
	46:  "cudaErrorDevicesUnavailable",
	100: "cudaErrorNoDevice",
	101: "cudaErrorInvalidDevice",
	201: "cudaErrorDeviceUninitialized",
	209: "cudaErrorNoKernelImageForDevice",
	214: "cudaErrorECCUncorrectable",
	222: "cudaErrorUnsupportedPtxVersion",
	304: "cudaErrorOperatingSystem",
	400: "cudaErrorInvalidResourceHandle",
	600: "cudaErrorNotReady",
	700: "cudaErrorIllegalAddress",
	719: "cudaErrorLaunchFailure",
	801: "cudaErrorNotSupported",
	802: "cudaErrorSystemNotReady",
	803: "cudaErrorSystemDriverMismatch",
	999: "cudaErrorUnknown",
}

// Common CUresult values (cuda.h).
var driverErrors = map[int]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	34:  "CUDA_ERROR_STUB_LIBRARY",
	46:  "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
	214: "CUDA_ERROR_ECC_UNCORRECTABLE",
	304: "CUDA_ERROR_OPERATING_SYSTEM",
	400: "CUDA_ERROR_INVALID_HANDLE",
	600: "CUDA_ERROR_NOT_READY",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	719: "CUDA_ERROR_LAUNCH_FAILED",
	801: "CUDA_ERROR_NOT_SUPPORTED",
	802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	999: "CUDA_ERROR_UNKNOWN",
}

// ErrorName names the return code of a call of the given layer: a
// cudaError_t for the runtime, a CUresult for the driver. Unknown codes are
// shown as numbers.
func ErrorName(layer string, code int) string {
	names := runtimeErrors
	if layer == LayerDriver {
		names = driverErrors
	}
	if n, ok := names[code]; ok {
		return n
	}
	return strconv.Itoa(code)
}
