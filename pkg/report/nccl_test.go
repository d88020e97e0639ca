package report

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// A rank's communicators are in the JSON report; a process that is no
// rank has no nccl object.
func TestNCCLCommunicators(t *testing.T) {
	rank := proc(100, "trainer", 10, false)
	last := t0.Add(9 * time.Second)
	rank.NCCL = model.NCCLStats{Library: "/usr/lib/libnccl.so.2", Comms: []model.NCCLComm{
		{ID: "00c0ffee00c0ffee", Rank: 2, NRanks: 4, Calls: map[string]uint64{"allreduce": 40}, Bytes: map[string]uint64{"allreduce": 40 << 20},
			LastTime: last, LastOp: "allreduce", LastStack: []model.Frame{model.ParseFrame("train_step+0x1a (ncclrank)")}},
	}}
	plain := proc(200, "fdwork", 3, false)
	w, buf := toStdout()
	if err := w.Close(&model.Snapshot{Time: t0.Add(10 * time.Second), Start: t0, Targets: []int{100, 200}, Processes: []*model.Process{rank, plain}}); err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Processes []map[string]json.RawMessage `json:"processes"`
	}
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(raw.Processes[0]["nccl"], &got); err != nil {
		t.Fatalf("pid 100 nccl: %v (%s)", err, raw.Processes[0]["nccl"])
	}
	want := map[string]any{"library": "/usr/lib/libnccl.so.2", "communicators": []any{map[string]any{
		"id": "00c0ffee00c0ffee", "rank": 2.0, "nranks": 4.0, "calls": map[string]any{"allreduce": 40.0},
		"bytes": map[string]any{"allreduce": float64(40 << 20)}, "last_time": last.Format(time.RFC3339Nano), "last_op": "allreduce",
		"last_stack": []any{"train_step+0x1a (ncclrank)"}, "destroyed": false}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("nccl = %v, want %v", got, want)
	}
	if _, ok := raw.Processes[1]["nccl"]; ok {
		t.Errorf("pid 200 has an nccl object: %s", raw.Processes[1]["nccl"])
	}
}
