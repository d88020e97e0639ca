package report

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

func TestCUDAAndGPUs(t *testing.T) {
	two := 2
	withNVML := proc(100, "trainer", 10, false)
	withNVML.CUDA = model.CUDAStats{
		LiveBytes:  3 << 30,
		AllocBytes: map[string]uint64{"cudaMalloc": 5 << 30},
		FreeBytes:  map[string]uint64{"cudaFree": 2 << 30},
		AllocCalls: map[string]uint64{"cudaMalloc": 40},
		Failures:   []model.CUDAFailure{{API: "cudaMalloc", Code: 2, Error: "cudaErrorMemoryAllocation"}},
		HasNVML:    true, NVMLUsedBytes: 3<<30 + 1<<20, UntrackedBytes: 1 << 20,
		Libraries: []string{"/usr/lib/libcudart.so.12"},
		GPUUtil: []model.GPUUtil{{Device: 0, UUID: "GPU-aaaa", SM: 0.75, Memory: 0.5, Source: model.UtilProcess},
			{Device: 1, MIG: &two, UUID: "MIG-cccc", SM: 0.25, Memory: 0.125, Source: model.UtilDevice}},
		Verdict: "gpu_bound", VerdictHost: &model.VerdictHost{WaitShare: 0.875, Confirmed: true},
	}
	noNVML := proc(200, "loader", 3, false)
	noNVML.CUDA = model.CUDAStats{Libraries: []string{"/usr/lib/libcuda.so.1"}}
	plain := proc(300, "fdwork", 3, false)

	w, buf := toStdout()
	err := w.Close(&model.Snapshot{
		Time: t0.Add(10 * time.Second), Start: t0, Targets: []int{100, 200, 300},
		Processes: []*model.Process{withNVML, noNVML, plain},
		GPUs: []model.GPU{{Index: 0, UUID: "GPU-aaaa", Name: "H100", MemoryUsed: 10 << 30, MemoryTotal: 80 << 30, Utilization: 0.25,
			MemoryUtilization: 0.125, PerProcessUtil: true, Processes: map[int]uint64{100: 3<<30 + 1<<20, 999: 1 << 30}},
			// GPU 1 in MIG mode, and its MIG device 2.
			{Index: 1, UUID: "GPU-bbbb", Name: "A100", Processes: map[int]uint64{}},
			{Index: 1, MIG: &two, GPUInstance: 5, UUID: "MIG-cccc", Name: "A100 MIG 3g.20gb", Processes: map[int]uint64{100: 1 << 20}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Processes []map[string]json.RawMessage `json:"processes"`
		GPUs      []map[string]any             `json:"gpus"`
	}
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	var cuda map[string]any
	if err := json.Unmarshal(raw.Processes[0]["cuda"], &cuda); err != nil {
		t.Fatalf("pid 100 cuda: %v (%s)", err, raw.Processes[0]["cuda"])
	}
	want := map[string]any{
		"live_bytes": float64(3 << 30), "alloc_bytes": map[string]any{"cudaMalloc": float64(5 << 30)},
		"free_bytes": map[string]any{"cudaFree": float64(2 << 30)}, "alloc_calls": map[string]any{"cudaMalloc": 40.0},
		"failures": 1.0, "nvml_used_bytes": float64(3<<30 + 1<<20), "untracked_bytes": float64(1 << 20),
		"libraries": []any{"/usr/lib/libcudart.so.12"},
		"gpu_utilization": []any{map[string]any{"device": 0.0, "uuid": "GPU-aaaa", "sm": 0.75, "memory": 0.5, "source": "process"},
			map[string]any{"device": 1.0, "mig_device": 2.0, "uuid": "MIG-cccc", "sm": 0.25, "memory": 0.125, "source": "device"}},
		"verdict": "gpu_bound", "verdict_host": map[string]any{"confirmed": true, "wait_share": 0.875},
	}
	if !reflect.DeepEqual(cuda, want) {
		t.Errorf("pid 100 cuda = %v\nwant %v", cuda, want)
	}
	cuda = nil // Unmarshal would merge into the old map
	if err := json.Unmarshal(raw.Processes[1]["cuda"], &cuda); err != nil {
		t.Fatal(err)
	}
	if _, ok := cuda["nvml_used_bytes"]; ok || cuda["alloc_bytes"] == nil || cuda["verdict_host"] != nil {
		t.Errorf("pid 200 cuda = %v, want no NVML figures, {} counts and no verdict", cuda)
	}
	if _, ok := raw.Processes[2]["cuda"]; ok {
		t.Error("cuda present for a process without CUDA activity")
	}
	wantGPU := map[string]any{"index": 0.0, "uuid": "GPU-aaaa", "name": "H100", "memory_used_bytes": float64(10 << 30),
		"memory_total_bytes": float64(80 << 30), "utilization_ratio": 0.25, "memory_utilization_ratio": 0.125, "per_process_utilization": true,
		"process_memory_used_bytes": map[string]any{"100": float64(3<<30 + 1<<20), "999": float64(1 << 30)}}
	if len(raw.GPUs) != 3 || !reflect.DeepEqual(raw.GPUs[0], wantGPU) {
		t.Errorf("gpus = %v\nwant [%v ...]", raw.GPUs, wantGPU)
	}
	if len(raw.GPUs) == 3 && (raw.GPUs[1]["mig_device"] != nil || raw.GPUs[2]["index"] != 1.0 || raw.GPUs[2]["mig_device"] != 2.0 || raw.GPUs[2]["uuid"] != "MIG-cccc") {
		t.Errorf("GPU 1 in MIG mode and its MIG device 2: %v, %v", raw.GPUs[1], raw.GPUs[2])
	}
}

func TestNoGPUs(t *testing.T) {
	w, buf := toStdout()
	if err := w.Close(&model.Snapshot{Time: t0, Start: t0}); err != nil {
		t.Fatal(err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	if string(raw["gpus"]) != "[]" {
		t.Errorf("gpus = %s, want []", raw["gpus"])
	}
}
