package cudatrack

import "testing"

// The Go table must follow enum cuda_api: the index is the BPF cookie.
func TestAPIsFollowEnum(t *testing.T) {
	if len(APIs) != int(cudaCudaApiAPI_MAX) {
		t.Fatalf("%d APIs in Go, %d in BPF", len(APIs), cudaCudaApiAPI_MAX)
	}
	want := map[cudaCudaApi]string{
		cudaCudaApiAPI_CUDA_MALLOC:                  "cudaMalloc",
		cudaCudaApiAPI_CUDA_MALLOC_ASYNC:            "cudaMallocAsync",
		cudaCudaApiAPI_CUDA_MALLOC_FROM_POOL_ASYNC:  "cudaMallocFromPoolAsync",
		cudaCudaApiAPI_CUDA_MALLOC_MANAGED:          "cudaMallocManaged",
		cudaCudaApiAPI_CUDA_MALLOC_PITCH:            "cudaMallocPitch",
		cudaCudaApiAPI_CUDA_MALLOC_HOST:             "cudaMallocHost",
		cudaCudaApiAPI_CUDA_HOST_ALLOC:              "cudaHostAlloc",
		cudaCudaApiAPI_CUDA_FREE:                    "cudaFree",
		cudaCudaApiAPI_CUDA_FREE_ASYNC:              "cudaFreeAsync",
		cudaCudaApiAPI_CUDA_FREE_HOST:               "cudaFreeHost",
		cudaCudaApiAPI_CU_MEM_ALLOC:                 "cuMemAlloc_v2",
		cudaCudaApiAPI_CU_MEM_ALLOC_ASYNC:           "cuMemAllocAsync",
		cudaCudaApiAPI_CU_MEM_ALLOC_FROM_POOL_ASYNC: "cuMemAllocFromPoolAsync",
		cudaCudaApiAPI_CU_MEM_ALLOC_MANAGED:         "cuMemAllocManaged",
		cudaCudaApiAPI_CU_MEM_ALLOC_PITCH:           "cuMemAllocPitch_v2",
		cudaCudaApiAPI_CU_MEM_ALLOC_HOST:            "cuMemAllocHost_v2",
		cudaCudaApiAPI_CU_MEM_HOST_ALLOC:            "cuMemHostAlloc",
		cudaCudaApiAPI_CU_MEM_FREE:                  "cuMemFree_v2",
		cudaCudaApiAPI_CU_MEM_FREE_ASYNC:            "cuMemFreeAsync",
		cudaCudaApiAPI_CU_MEM_FREE_HOST:             "cuMemFreeHost",
		cudaCudaApiAPI_CU_MEM_CREATE:                "cuMemCreate",
		cudaCudaApiAPI_CU_MEM_RELEASE:               "cuMemRelease",
		cudaCudaApiAPI_CU_MEM_MAP:                   "cuMemMap",
		cudaCudaApiAPI_CU_MEM_UNMAP:                 "cuMemUnmap",
		cudaCudaApiAPI_CUDA_DEVICE_SYNCHRONIZE:      "cudaDeviceSynchronize",
		cudaCudaApiAPI_CUDA_STREAM_SYNCHRONIZE:      "cudaStreamSynchronize",
		cudaCudaApiAPI_CUDA_EVENT_SYNCHRONIZE:       "cudaEventSynchronize",
		cudaCudaApiAPI_CUDA_MEMCPY:                  "cudaMemcpy",
		cudaCudaApiAPI_CU_CTX_SYNCHRONIZE:           "cuCtxSynchronize",
		cudaCudaApiAPI_CU_STREAM_SYNCHRONIZE:        "cuStreamSynchronize",
		cudaCudaApiAPI_CU_EVENT_SYNCHRONIZE:         "cuEventSynchronize",
		cudaCudaApiAPI_CU_MEMCPY_DTOH:               "cuMemcpyDtoH_v2",
		cudaCudaApiAPI_CU_MEMCPY_HTOD:               "cuMemcpyHtoD_v2",
		cudaCudaApiAPI_CU_MEMCPY_DTOD:               "cuMemcpyDtoD_v2",
		cudaCudaApiAPI_CUDA_LAUNCH_KERNEL:           "cudaLaunchKernel",
		cudaCudaApiAPI_CUDA_GRAPH_LAUNCH:            "cudaGraphLaunch",
		cudaCudaApiAPI_CU_LAUNCH_KERNEL:             "cuLaunchKernel",
	}
	for id, name := range want {
		if APIs[id].Name != name {
			t.Errorf("API %d is %s in Go, %s in BPF", id, APIs[id].Name, name)
		}
		// The BPF side takes the layer from the id (layer_of, timed_layer).
		runtime := id < cudaCudaApiAPI_CU_MEM_ALLOC
		if APIs[id].Timed() {
			runtime = id < cudaCudaApiAPI_CU_CTX_SYNCHRONIZE || (id >= cudaCudaApiAPI_CUDA_LAUNCH_KERNEL && id < cudaCudaApiAPI_CU_LAUNCH_KERNEL)
		}
		if runtime != (APIs[id].Layer == LayerRuntime) {
			t.Errorf("%s: layer %s", name, APIs[id].Layer)
		}
	}
	if int(cudaCudaShapeSHAPE_COUNT) != shapeCount || int(cudaCudaShapeSHAPE_PITCH) != shapePitch || int(cudaCudaShapeSHAPE_FREE) != shapeFree ||
		int(cudaCudaShapeSHAPE_SYNC) != shapeSync || int(cudaCudaShapeSHAPE_LAUNCH) != shapeLaunch {
		t.Error("shapes differ between Go and BPF")
	}
}

func TestErrorName(t *testing.T) {
	for _, c := range []struct {
		layer string
		code  int
		want  string
	}{
		{LayerRuntime, 2, "cudaErrorMemoryAllocation"},
		{LayerRuntime, 100, "cudaErrorNoDevice"},
		{LayerRuntime, 35, "cudaErrorInsufficientDriver"},
		{LayerRuntime, 3, "cudaErrorInitializationError"},
		{LayerRuntime, 1, "cudaErrorInvalidValue"},
		{LayerRuntime, 999, "cudaErrorUnknown"},
		{LayerDriver, 2, "CUDA_ERROR_OUT_OF_MEMORY"},
		{LayerDriver, 100, "CUDA_ERROR_NO_DEVICE"},
		{LayerDriver, 3, "CUDA_ERROR_NOT_INITIALIZED"},
		{LayerDriver, 1, "CUDA_ERROR_INVALID_VALUE"},
		{LayerDriver, 999, "CUDA_ERROR_UNKNOWN"},
		{LayerRuntime, 12345, "12345"},
		{LayerDriver, -7, "-7"},
	} {
		if got := ErrorName(c.layer, c.code); got != c.want {
			t.Errorf("ErrorName(%s, %d) = %s, want %s", c.layer, c.code, got, c.want)
		}
	}
}
