package pipeline

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/gpunode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/nvml"
)

// logged captures what the pipeline logs through slog's default logger.
func logged(t *testing.T) *bytes.Buffer {
	var b bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(old) })
	return &b
}

// A GPU view that fails to load where the node has no GPU is absent, said
// at info level; where the node has GPUs it is down, a warning. The other
// views are down wherever they fail.
func TestViewAbsentWhereNotExpected(t *testing.T) {
	cudaErr := fmt.Errorf("loading cuda BPF programs: map live_allocs: %w", unix.E2BIG)
	sockErr := fmt.Errorf("loading sock BPF programs: %w", unix.EPERM)
	for _, c := range []struct {
		name         string
		devices      gpunode.Devices
		cuda         model.ViewState
		level, quote string // of cuda's log line
	}{
		{"a CPU node", gpunode.Devices{}, model.ViewState{Down: cudaErr.Error(), Absent: model.AbsentNoGPU},
			"INFO", "concern absent: not expected on this node"},
		{"a GPU node", gpunode.Devices{Node: []string{"nvidia0"}}, model.ViewState{Down: cudaErr.Error()},
			"WARN", "concern unavailable on this machine"},
	} {
		log := logged(t)
		p := &Pipeline{status: map[string]model.ViewState{}, devices: c.devices, pending: 2}
		for _, a := range []arrival{{view: view{name: "cuda"}, err: cudaErr}, {view: view{name: "sock"}, err: sockErr}} {
			if err := p.adopt(a); err != nil {
				t.Fatalf("%s: adopt %s: %v", c.name, a.view.name, err)
			}
		}
		if got := p.status["cuda"]; got != c.cuda {
			t.Errorf("%s: cuda %+v, want %+v", c.name, got, c.cuda)
		}
		if got, want := p.status["sock"], (model.ViewState{Down: sockErr.Error()}); got != want {
			t.Errorf("%s: sock %+v, want %+v", c.name, got, want)
		}
		line, _, _ := strings.Cut(log.String(), "\n")
		if !strings.Contains(line, "level="+c.level) || !strings.Contains(line, c.quote) || !strings.Contains(line, "concern=cuda") {
			t.Errorf("%s: cuda logged %q, want %s %q", c.name, line, c.level, c.quote)
		}
	}
}

// NVML that cannot start is absent on a node without GPUs and where the
// agent was not given it (no library, no GPU device nodes of its own),
// down where it was given both and still fails.
func TestNVMLAbsence(t *testing.T) {
	noLib := fmt.Errorf("%w: %w; GPU metrics off", nvml.ErrUnavailable, nvml.ErrNoLibrary)
	denied := fmt.Errorf("%w: no permission to open the NVIDIA device files; GPU metrics off", nvml.ErrUnavailable)
	gpus := []string{"nvidia0"}
	for _, c := range []struct {
		name    string
		devices gpunode.Devices
		err     error
		want    model.Absence
	}{
		{"no GPU", gpunode.Devices{}, noLib, model.AbsentNoGPU},
		{"GPUs, no library in the container", gpunode.Devices{Node: gpus, Agent: gpus}, noLib, model.AbsentNoNVML},
		{"GPUs, none in the container", gpunode.Devices{Node: gpus}, denied, model.AbsentNoNVML},
		{"GPUs and NVML given, failing", gpunode.Devices{Node: gpus, Agent: gpus}, denied, ""},
	} {
		p := &Pipeline{devices: c.devices}
		if got, want := p.stateOf("nvml", c.err), (model.ViewState{Down: c.err.Error(), Absent: c.want}); got != want {
			t.Errorf("%s: %+v, want %+v", c.name, got, want)
		}
	}
	if got := (&Pipeline{}).stateOf("nvml", nil); got != (model.ViewState{}) {
		t.Errorf("NVML started: %+v, want up", got)
	}
}
