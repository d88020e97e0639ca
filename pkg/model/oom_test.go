package model

import (
	"testing"
	"time"
)

// kvStack is a PyTorch-style stack: the runtime's frame, then the
// caller's Python lines.
var kvStack = []Frame{
	{Kind: FrameNative, Function: "cudaMalloc", Module: "libcudart.so.12", Offset: 0x10},
	{Kind: FramePython, Function: "allocate_kv_cache", File: "engine.py", Line: 210},
	{Kind: FramePython, Function: "main", File: "serve.py", Line: 12},
}

// innermostPython names a site as the tests here want: its first Python
// frame, else its first frame (the detectors pass pkg/detect/stack's).
func innermostPython(stack []Frame) string {
	for _, f := range stack {
		if f.Kind == FramePython {
			return f.String()
		}
	}
	if len(stack) > 0 {
		return stack[0].String()
	}
	return ""
}

// oomSnapshot is an out of memory on GPU 3 with a neighbour pod that held
// more than the failing process.
func oomSnapshot() *GPUMemorySnapshot {
	nvml, gap := uint64(25<<30), int64(3<<30)
	return &GPUMemorySnapshot{
		Time: time.Date(2026, 12, 5, 17, 0, 0, 0, time.UTC), API: "cudaMalloc", Error: "cudaErrorMemoryAllocation", Code: 2,
		SizeBytes: 2 << 30, Stack: kvStack, Why: SnapshotOutOfMemory,
		LiveBytes: 22 << 30, LiveAllocations: 40,
		Sites:         []SnapshotSite{{Bytes: 18 << 30, Allocations: 2, Stack: kvStack}, {Bytes: 4 << 30, Allocations: 38}},
		NVMLUsedBytes: &nvml, GapBytes: &gap,
		Devices: []SnapshotDevice{
			{Index: 1, Name: "H100", MemoryUsedBytes: 70 << 30, MemoryTotalBytes: 80 << 30,
				Processes: []SnapshotProcess{{PID: 9, Comm: "elsewhere", UsedBytes: 70 << 30}}},
			{Index: 3, Name: "H100", MemoryUsedBytes: 79 << 30, MemoryTotalBytes: 80 << 30, Processes: []SnapshotProcess{
				{PID: 77, Comm: "python", Pod: Pod{Namespace: "batch", Name: "embed-7"}, UsedBytes: 51 << 30},
				{PID: 42, Comm: "vllm", UsedBytes: 25 << 30, Self: true, Watched: true},
				{PID: 78, Comm: "small", UsedBytes: 1 << 30},
			}},
		},
	}
}

func TestDescribeSnapshot(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(s *GPUMemorySnapshot)
		want string
	}{
		{"the issue's example: the neighbour by its pod, the gap", func(*GPUMemorySnapshot) {},
			"Out of memory on GPU 3: this process held 22.0 GiB (top: allocate_kv_cache (engine.py:210) 18.0 GiB); " +
				"pod batch/embed-7 held 51.0 GiB on the same GPU. NVML counts 3.0 GiB more: context, workspaces, unhooked paths."},
		{"a neighbour outside a pod, a burst freed right after, no NVML figure for the process", func(s *GPUMemorySnapshot) {
			s.Devices[1].Processes[0].Pod = Pod{}
			s.FreedAfterBytes = 4 << 30
			s.NVMLUsedBytes, s.GapBytes = nil, nil
		}, "Out of memory on GPU 3: this process held 22.0 GiB (top: allocate_kv_cache (engine.py:210) 18.0 GiB; 4.0 GiB of it freed right after); " +
			"python (pid 77) held 51.0 GiB on the same GPU."},
		{"alone on a MIG instance; the hooks saw more than NVML (no gap said)", func(s *GPUMemorySnapshot) {
			two, gap := 2, int64(-1<<20)
			s.Devices = []SnapshotDevice{{Index: 0, MIG: &two, MemoryUsedBytes: 20 << 30, MemoryTotalBytes: 20 << 30,
				Processes: []SnapshotProcess{{PID: 42, Self: true, UsedBytes: 20 << 30}}}}
			s.GapBytes = &gap
		}, "Out of memory on GPU 0/mig2: this process held 22.0 GiB (top: allocate_kv_cache (engine.py:210) 18.0 GiB); no other process on the same GPU."},
		{"on two devices: the neighbour's own", func(s *GPUMemorySnapshot) {
			s.Devices[0].Processes = append(s.Devices[0].Processes, SnapshotProcess{PID: 42, Self: true})
			s.GapBytes = nil
		}, "Out of memory on GPUs 1, 3: this process held 22.0 GiB (top: allocate_kv_cache (engine.py:210) 18.0 GiB); elsewhere (pid 9) held 70.0 GiB on GPU 1."},
		{"another error with the device full; NVML without figures per process, one device", func(s *GPUMemorySnapshot) {
			s.Why, s.Error, s.Code = SnapshotDeviceFull, "", 999
			s.Devices = s.Devices[1:]
			s.Devices[0].Processes = nil
			s.Sites[0].Stack = nil
			s.GapBytes = nil
		}, "cudaMalloc returned error 999 on GPU 3 (99 % used): this process held 22.0 GiB (top: a site without a stack 18.0 GiB); no other process on the same GPU."},
		{"without NVML: no device, nothing held", func(s *GPUMemorySnapshot) {
			s.Devices, s.NVMLUsedBytes, s.GapBytes = nil, nil, nil
			s.LiveBytes, s.Sites = 0, nil
		}, "Out of memory: this process held 0 B."},
	} {
		s := oomSnapshot()
		c.edit(s)
		if got := s.Describe(innermostPython); got != c.want {
			t.Errorf("%s:\n got %q\nwant %q", c.name, got, c.want)
		}
	}
}
