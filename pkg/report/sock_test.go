package report

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

func TestSockets(t *testing.T) {
	server := proc(100, "server", 12, false)
	server.Sock = model.SockStats{
		TCPByState: map[string]int{"LISTEN": 1, "CLOSE_WAIT": 9},
		ByKind:     map[string]int{"tcp": 10, "udp": 1, "unix": 0, "other": 0},
	}
	plain := proc(200, "fdwork", 3, false)

	w, buf := toStdout()
	err := w.Close(&model.Snapshot{Time: t0.Add(10 * time.Second), Start: t0, Targets: []int{100, 200},
		Processes: []*model.Process{server, plain}})
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Processes []map[string]any `json:"processes"`
	}
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"tcp_sockets_by_state": map[string]any{"LISTEN": 1.0, "CLOSE_WAIT": 9.0},
			"socket_fds_by_kind": map[string]any{"tcp": 10.0, "udp": 1.0, "unix": 0.0, "other": 0.0}},
		// Without a socket view: {} rather than null.
		{"tcp_sockets_by_state": map[string]any{}, "socket_fds_by_kind": map[string]any{}},
	}
	for i, w := range want {
		for k, v := range w {
			if got := raw.Processes[i][k]; !reflect.DeepEqual(got, v) {
				t.Errorf("process %d %s = %v, want %v", i, k, got, v)
			}
		}
	}
}
