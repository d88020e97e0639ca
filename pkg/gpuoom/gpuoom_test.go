package gpuoom

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/nvml"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

const gib = 1 << 30

// device mocks one NVML device (a GPU, or a MIG instance) with total GiB
// of memory, used GiB in use, and the processes listed, pid: GiB used.
func device(uuid string, used, total uint64, procs map[int]uint64) *mock.Device {
	var infos []gonvml.ProcessInfo
	for pid, b := range procs {
		infos = append(infos, gonvml.ProcessInfo{Pid: uint32(pid), UsedGpuMemory: b * gib})
	}
	return &mock.Device{
		GetUUIDFunc: func() (string, gonvml.Return) { return uuid, gonvml.SUCCESS },
		GetNameFunc: func() (string, gonvml.Return) { return "NVIDIA H100 80GB HBM3", gonvml.SUCCESS },
		GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
			return gonvml.Memory{Total: total * gib, Used: used * gib, Free: (total - used) * gib}, gonvml.SUCCESS
		},
		GetUtilizationRatesFunc: func() (gonvml.Utilization, gonvml.Return) { return gonvml.Utilization{}, gonvml.ERROR_NOT_SUPPORTED },
		GetProcessUtilizationFunc: func(uint64) ([]gonvml.ProcessUtilizationSample, gonvml.Return) {
			return nil, gonvml.ERROR_NOT_SUPPORTED
		},
		GetComputeRunningProcessesFunc:  func() ([]gonvml.ProcessInfo, gonvml.Return) { return infos, gonvml.SUCCESS },
		GetGraphicsRunningProcessesFunc: func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.SUCCESS },
		GetMigModeFunc:                  func() (int, int, gonvml.Return) { return 0, 0, gonvml.ERROR_NOT_SUPPORTED },
	}
}

// withMIG puts gpu in MIG mode with the instances given, by slot.
func withMIG(gpu *mock.Device, instances map[int]*mock.Device) *mock.Device {
	gpu.GetMigModeFunc = func() (int, int, gonvml.Return) {
		return gonvml.DEVICE_MIG_ENABLE, gonvml.DEVICE_MIG_ENABLE, gonvml.SUCCESS
	}
	gpu.GetMaxMigDeviceCountFunc = func() (int, gonvml.Return) { return 7, gonvml.SUCCESS }
	gpu.GetMigDeviceHandleByIndexFunc = func(j int) (gonvml.Device, gonvml.Return) {
		if m, ok := instances[j]; ok {
			return m, gonvml.SUCCESS
		}
		return nil, gonvml.ERROR_NOT_FOUND
	}
	for slot, m := range instances {
		m.GetGpuInstanceIdFunc = func() (int, gonvml.Return) { return slot + 1, gonvml.SUCCESS }
	}
	return gpu
}

// sampler starts an NVML sampler on the devices given: it takes its first
// sample at once, and no other during a test.
func sampler(t *testing.T, devs ...*mock.Device) *nvml.Sampler {
	t.Helper()
	lib := &mock.Interface{
		InitFunc:                   func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:               func() gonvml.Return { return gonvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, gonvml.Return) { return len(devs), gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) { return devs[i], gonvml.SUCCESS },
		EventSetCreateFunc:         func() (gonvml.EventSet, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED },
	}
	s := nvml.New(lib)
	if err := s.Start(t.Context(), time.Hour); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Wait) // after t.Context is cancelled
	return s
}

func stage(t *testing.T, s *nvml.Sampler, pod func(int, model.Pod) model.Pod, profile func(int, time.Time) string) *Stage {
	t.Helper()
	proc, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	return New(Config{NVML: s, Proc: proc, Pod: pod, Profile: profile})
}

func frames(fn string) []model.Frame {
	return []model.Frame{{Kind: model.FramePython, Function: fn, File: "engine.py", Line: 210}}
}

// names are the comms of ps, in order.
func names(ps []model.SnapshotProcess) (out []string) {
	for _, p := range ps {
		out = append(out, p.Comm)
	}
	return out
}

// Out of memory on a GPU shared with two other processes, one watched
// (with its sites), one not (its pod from Config.Pod): the snapshot names
// both with their memory, the failing process's memory over the minute
// before ends at the failure, and the gap is NVML's figure less the
// hooked bytes. It is completed once, in the poll it appears in.
func TestNeighbours(t *testing.T) {
	const self, watchedPID, other = 100, 200, 300
	stranger := os.Getpid() // a real process, for its comm
	s := sampler(t,
		device("GPU-aaaa", 79, 80, map[int]uint64{self: 22, stranger: 51, watchedPID: 5}),
		device("GPU-bbbb", 3, 80, map[int]uint64{other: 3}))
	var podAsked []int
	pod := func(pid int, known model.Pod) model.Pod {
		podAsked = append(podAsked, pid)
		return model.Pod{Namespace: "batch", Name: "embed-7", Container: "embed"}
	}
	var profiles int
	profile := func(pid int, at time.Time) string {
		profiles++
		return "/debug/pprof/gpu?pid=100&at=" + at.Format(time.RFC3339Nano)
	}
	st := stage(t, s, pod, profile)

	fail := time.Now()
	p := &model.Process{PID: self, Comm: "python3", Pod: model.Pod{Namespace: "serve", Name: "llm-0"}}
	neighbour := &model.Process{PID: watchedPID, Comm: "vllm", Pod: model.Pod{Namespace: "serve", Name: "vllm-1"}}
	// The minute and more before the failure, a poll every 5 s: the
	// process's live bytes grow 1 GiB a poll; NVML adds 2 GiB.
	for i := range 14 {
		now := fail.Add(-70*time.Second + time.Duration(i)*5*time.Second)
		p.CUDA = model.CUDAStats{LiveBytes: uint64(i+6) * gib, LivePeakBytes: uint64(i+7) * gib, HasNVML: true, NVMLUsedBytes: uint64(i+8) * gib,
			Libraries: []string{"libcudart.so.12"}}
		neighbour.CUDA = model.CUDAStats{LiveBytes: 4 * gib, Libraries: []string{"libcudart.so.12"}}
		st.Observe(now, []*model.Process{p, neighbour})
	}

	// The failure: 20 GiB live at four sites.
	snap := &model.GPUMemorySnapshot{Time: fail, API: "cudaMalloc", Error: "cudaErrorMemoryAllocation", Code: 2, SizeBytes: 2 * gib,
		Why: model.SnapshotOutOfMemory, LiveBytes: 20 * gib, LiveAllocations: 5, Sites: []model.SnapshotSite{
			{Bytes: 12 * gib, Allocations: 2, Stack: frames("allocate_kv_cache")},
			{Bytes: 5 * gib, Allocations: 1, Stack: frames("load_weights")},
			{Bytes: 2 * gib, Allocations: 1, Stack: frames("workspace")},
			{Bytes: 1 * gib, Allocations: 1, Stack: frames("scratch")},
		}}
	poll := fail.Add(time.Second)
	p.CUDA.Snapshots = []*model.GPUMemorySnapshot{snap}
	p.CUDA.LiveBytes = 18 * gib // freed a little since
	neighbour.CUDA.Sites = []model.CUDASite{
		{Bytes: 3 * gib, Allocs: []time.Time{poll.Add(-30 * time.Second), poll.Add(-90 * time.Second)}, Stack: frames("embed")},
		{Bytes: 1 * gib, Allocs: []time.Time{poll.Add(-10 * time.Second)}, Stack: frames("cache")},
		{Bytes: 0, Stack: frames("freed")},
	}
	st.Observe(poll, []*model.Process{p, neighbour})

	// History: the points of the minute before, the failure's last.
	h := snap.History
	if len(h) != 13 {
		t.Fatalf("history of %d points, want 13 (12 polls in the minute before, then the failure's): %+v", len(h), h)
	}
	if first := h[0]; !first.Time.Equal(fail.Add(-60*time.Second)) || first.LiveBytes != 8*gib || first.PeakBytes != 9*gib || first.NVMLBytes == nil || *first.NVMLBytes != 10*gib {
		t.Errorf("first point %+v, want the poll 60 s before: 8 GiB live, peak 9, NVML 10", first)
	}
	for i := 1; i < len(h); i++ {
		if !h[i-1].Time.Before(h[i].Time) {
			t.Errorf("history out of order at %d: %v then %v", i, h[i-1].Time, h[i].Time)
		}
	}
	if last := h[len(h)-1]; !last.Time.Equal(fail) || last.LiveBytes != 20*gib || last.PeakBytes != 20*gib || last.NVMLBytes == nil || *last.NVMLBytes != 22*gib {
		t.Errorf("last point %+v, want the failure's: 20 GiB live, NVML 22", last)
	}

	// The gap the hooks do not see.
	if snap.NVMLUsedBytes == nil || *snap.NVMLUsedBytes != 22*gib || snap.GapBytes == nil || *snap.GapBytes != 2*gib {
		t.Errorf("NVML %v, gap %v; want 22 GiB and 2 GiB", snap.NVMLUsedBytes, snap.GapBytes)
	}

	// Who was on the device: GPU 0 alone, most memory first.
	if len(snap.Devices) != 1 {
		t.Fatalf("devices %+v, want GPU 0 alone", snap.Devices)
	}
	d := snap.Devices[0]
	if d.Index != 0 || d.MIG != nil || d.UUID != "GPU-aaaa" || d.MemoryUsedBytes != 79*gib || d.MemoryTotalBytes != 80*gib || d.SampledAt.IsZero() || d.SampledAt.After(fail) {
		t.Errorf("device %+v, want GPU 0 (GPU-aaaa), 79 of 80 GiB, sampled before the failure", d)
	}
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := names(d.Processes), []string{strings.TrimSpace(string(comm)), "python3", "vllm"}; !slices.Equal(got, want) {
		t.Fatalf("processes %q, want %q", got, want)
	}
	un, me, nb := d.Processes[0], d.Processes[1], d.Processes[2]
	if un.PID != stranger || un.UsedBytes != 51*gib || un.Self || un.Watched || un.LiveBytes != nil || un.TopSites != nil ||
		un.Pod != (model.Pod{Namespace: "batch", Name: "embed-7", Container: "embed"}) {
		t.Errorf("the unwatched neighbour: %+v, want 51 GiB, pod batch/embed-7, no hooked figures", un)
	}
	if !slices.Equal(podAsked, []int{stranger}) {
		t.Errorf("Config.Pod asked for %v, want the unwatched process's alone", podAsked)
	}
	if me.PID != self || !me.Self || !me.Watched || me.UsedBytes != 22*gib || me.LiveBytes == nil || *me.LiveBytes != 20*gib ||
		me.Pod.Name != "llm-0" || len(me.TopSites) != 3 || me.TopSites[0].Bytes != 12*gib || me.TopSites[2].Stack[0].Function != "workspace" {
		t.Errorf("the failing process: %+v, want self, 22 GiB per NVML, 20 live, its top three sites", me)
	}
	if nb.PID != watchedPID || nb.Self || !nb.Watched || nb.UsedBytes != 5*gib || nb.LiveBytes == nil || *nb.LiveBytes != 4*gib || nb.Pod.Name != "vllm-1" {
		t.Errorf("the watched neighbour: %+v, want 5 GiB per NVML, 4 GiB live, pod vllm-1", nb)
	}
	if len(nb.TopSites) != 2 || nb.TopSites[0].Bytes != 3*gib || nb.TopSites[0].Allocations != 2 || nb.TopSites[0].OldestAgeSeconds != 90 ||
		nb.TopSites[1].Stack[0].Function != "cache" || nb.TopSites[1].OldestAgeSeconds != 10 {
		t.Errorf("the watched neighbour's sites %+v, want embed (3 GiB, 2 allocations, oldest 90 s) and cache (10 s): none that holds nothing", nb.TopSites)
	}
	if want := "/debug/pprof/gpu?pid=100&at=" + fail.Format(time.RFC3339Nano); snap.Profile != want {
		t.Errorf("profile %q, want %q", snap.Profile, want)
	}

	// Completed once: a later poll leaves it as it is, and completes a
	// new one.
	before := len(snap.History)
	second := &model.GPUMemorySnapshot{Time: poll.Add(500 * time.Millisecond), LiveBytes: 19 * gib}
	p.CUDA.Snapshots = []*model.GPUMemorySnapshot{snap, second}
	st.Observe(poll.Add(5*time.Second), []*model.Process{p, neighbour})
	if len(snap.History) != before || profiles != 2 || second.Devices == nil || second.History[len(second.History)-1].LiveBytes != 19*gib {
		t.Errorf("after the next poll: the first snapshot's history %d points (was %d), profiles named %d, the second %+v; want the second alone completed",
			len(snap.History), before, profiles, second)
	}
	if got := second.History[len(second.History)-2].Time; !got.Equal(poll) {
		t.Errorf("the second snapshot's last poll at %v, want %v", got, poll)
	}

	st.Forget(self)
	if _, ok := st.procs[self]; ok {
		t.Error("Forget kept the process's state")
	}
}

// Without NVML a snapshot has no devices and no NVML figure, and its
// history none either.
func TestNoNVML(t *testing.T) {
	s := nvml.New(&mock.Interface{InitFunc: func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }})
	if err := s.Start(t.Context(), time.Second); err == nil {
		t.Fatal("Start succeeded")
	}
	st := stage(t, s, nil, nil)
	fail := time.Now()
	p := &model.Process{PID: 100, Comm: "python3", CUDA: model.CUDAStats{LiveBytes: gib, Libraries: []string{"libcudart.so.12"}}}
	st.Observe(fail.Add(-time.Second), []*model.Process{p})
	snap := &model.GPUMemorySnapshot{Time: fail, LiveBytes: 2 * gib}
	p.CUDA.Snapshots = []*model.GPUMemorySnapshot{snap}
	st.Observe(fail.Add(time.Second), []*model.Process{p})
	if snap.Devices != nil || snap.NVMLUsedBytes != nil || snap.GapBytes != nil || snap.Profile != "" {
		t.Errorf("snapshot without NVML: devices %+v, NVML %v, gap %v, profile %q; want none", snap.Devices, snap.NVMLUsedBytes, snap.GapBytes, snap.Profile)
	}
	if len(snap.History) != 2 || snap.History[0].LiveBytes != gib || snap.History[1].LiveBytes != 2*gib ||
		snap.History[0].NVMLBytes != nil || snap.History[1].NVMLBytes != nil {
		t.Errorf("history %+v, want the poll's 1 GiB then the failure's 2, no NVML figure", snap.History)
	}
}

// On a GPU in MIG mode the process's instance is its device, with the
// processes on that instance alone. A process NVML lists nowhere has
// every device, the instances standing for their GPU.
func TestMIG(t *testing.T) {
	s := sampler(t,
		withMIG(device("GPU-aaaa", 30, 80, nil), map[int]*mock.Device{
			0: device("MIG-0000", 9, 40, map[int]uint64{300: 9}),
			1: device("MIG-1111", 39, 40, map[int]uint64{100: 30, 200: 9}),
		}),
		device("GPU-bbbb", 3, 80, map[int]uint64{400: 3}))
	st := stage(t, s, nil, nil)
	fail := time.Now()
	on := &model.GPUMemorySnapshot{Time: fail, LiveBytes: 28 * gib}
	nowhere := &model.GPUMemorySnapshot{Time: fail, LiveBytes: gib}
	p := &model.Process{PID: 100, Comm: "python3", CUDA: model.CUDAStats{Snapshots: []*model.GPUMemorySnapshot{on}}}
	q := &model.Process{PID: 500, Comm: "unlisted", CUDA: model.CUDAStats{Snapshots: []*model.GPUMemorySnapshot{nowhere}}}
	st.Observe(fail.Add(time.Second), []*model.Process{p, q})

	if len(on.Devices) != 1 {
		t.Fatalf("devices %+v, want the MIG instance alone", on.Devices)
	}
	d := on.Devices[0]
	if d.Index != 0 || d.MIG == nil || *d.MIG != 1 || d.UUID != "MIG-1111" || d.MemoryUsedBytes != 39*gib || d.MemoryTotalBytes != 40*gib ||
		len(d.Processes) != 2 || d.Processes[0].PID != 100 || d.Processes[1].PID != 200 || d.Processes[1].UsedBytes != 9*gib {
		t.Errorf("device %+v, want 0/mig1 (39 of 40 GiB) with pids 100 and 200", d)
	}
	if on.NVMLUsedBytes == nil || *on.NVMLUsedBytes != 30*gib || *on.GapBytes != 2*gib {
		t.Errorf("NVML %v, gap %v; want 30 GiB and 2", on.NVMLUsedBytes, on.GapBytes)
	}

	var labels []string
	for _, d := range nowhere.Devices {
		labels = append(labels, model.DeviceLabel(d.Index, d.MIG))
	}
	if want := []string{"0/mig0", "0/mig1", "1"}; !slices.Equal(labels, want) {
		t.Errorf("a process listed nowhere: devices %v, want %v", labels, want)
	}
	if nowhere.NVMLUsedBytes != nil || nowhere.GapBytes != nil || nowhere.History[0].NVMLBytes != nil {
		t.Errorf("a process listed nowhere: NVML %v, gap %v, history %+v; want no NVML figure", nowhere.NVMLUsedBytes, nowhere.GapBytes, nowhere.History)
	}
}
