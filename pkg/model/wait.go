package model

// KindGPUSyncStorm is many short host waits on the GPU a second (the
// .item()/.cpu() of a training loop) while the GPU is under-used.
const KindGPUSyncStorm = "gpu_sync_storm"

// CUDAWaits is how long one process's host threads waited on the GPU in
// the synchronising calls of the runtime and driver (cudaDeviceSynchronize,
// cudaStreamSynchronize, cudaEventSynchronize, synchronous cudaMemcpy,
// cuCtxSynchronize, ...), each call timed from entry to return in the
// kernel and summed there by API and call site.
type CUDAWaits struct {
	Calls     uint64    // synchronising calls since tracking began (monotonic)
	Seconds   float64   // time waited in them since tracking began (monotonic)
	Histogram Histogram // each call's wait, cumulative since tracking began
	// Sites are the call sites by API: most waited since the previous
	// poll first, then most waited since tracking began.
	Sites []CUDAWaitSite
	// Threads are the threads that waited since tracking began, most
	// waited since the previous poll first.
	Threads []ThreadWait
	// Share is the largest share of the interval since the previous poll
	// that one thread spent waiting (0..1): the thread that drives the
	// GPU, in a training loop.
	Share float64
}

// CUDAWaitSite is the waits of one API at one call site.
type CUDAWaitSite struct {
	API     string
	StackID int64
	Stack   []Frame // the caller's frames, Python lines included where read
	// Since tracking began (monotonic).
	Calls      uint64
	Seconds    float64
	MaxSeconds float64 // the longest single wait
	Histogram  Histogram
	// Since the previous poll.
	RecentCalls   uint64
	RecentSeconds float64
}

// ThreadWait is one thread's time waiting on the GPU.
type ThreadWait struct {
	TID     int
	Name    string
	Calls   uint64  // since tracking began (monotonic)
	Seconds float64 // since tracking began (monotonic)
	Share   float64 // of the interval since the previous poll, 0..1
}

// CUDALaunches counts kernel launches (cudaLaunchKernel, cuLaunchKernel,
// cudaGraphLaunch), hooked only with --launches: PyTorch eager issues tens
// of thousands a second.
type CUDALaunches struct {
	Calls     map[string]uint64 // by API since tracking began (monotonic)
	Histogram Histogram         // each call's latency, cumulative
}
