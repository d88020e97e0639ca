package gpunode

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"testing"
	"testing/fstest"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/nvml"
)

// dev is a /dev holding the named character devices.
func dev(names ...string) fstest.MapFS {
	fsys := fstest.MapFS{"null": {Mode: fs.ModeDevice | fs.ModeCharDevice}}
	for _, n := range names {
		fsys[n] = &fstest.MapFile{Mode: fs.ModeDevice | fs.ModeCharDevice}
	}
	return fsys
}

// unreadable is a /dev that cannot be listed, as the host's is through
// /proc/1/root without ptrace access to pid 1.
type unreadable struct{}

func (unreadable) Open(string) (fs.File, error) { return nil, fs.ErrPermission }

func TestFind(t *testing.T) {
	for _, c := range []struct {
		name        string
		host, own   fs.FS
		node, agent []string
	}{
		{"a GPU node, the agent given its GPUs", dev("nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm"), dev("nvidiactl", "nvidia0", "nvidia1"),
			[]string{"nvidia0", "nvidia1"}, []string{"nvidia0", "nvidia1"}},
		{"a GPU node, the agent given none (no NVIDIA runtime)", dev("nvidiactl", "nvidia0", "nvidia-caps"), dev(),
			[]string{"nvidia0"}, nil},
		{"the driver's control node without a GPU", dev("nvidiactl"), dev("nvidiactl"), nil, nil},
		{"a CPU node", dev("sda", "tty0"), dev(), nil, nil},
		{"the host's /dev unreadable: the agent's own counts", unreadable{}, dev("nvidiactl", "nvidia3"),
			[]string{"nvidia3"}, []string{"nvidia3"}},
		{"neither readable", unreadable{}, unreadable{}, nil, nil},
	} {
		got := find(c.host, c.own)
		if !slices.Equal(got.Node, c.node) || !slices.Equal(got.Agent, c.agent) {
			t.Errorf("%s: %+v, want node %v, agent %v", c.name, got, c.node, c.agent)
		}
	}
}

func TestAbsence(t *testing.T) {
	gpuNode := Devices{Node: []string{"nvidia0"}, Agent: []string{"nvidia0"}}
	notGiven := Devices{Node: []string{"nvidia0"}}
	cpuNode := Devices{}
	noLib := fmt.Errorf("%w: %w; GPU metrics off", nvml.ErrUnavailable, nvml.ErrNoLibrary)
	failed := fmt.Errorf("%w: no permission to open the NVIDIA device files", nvml.ErrUnavailable)
	loadErr := errors.New("loading cuda BPF programs: map live_allocs: argument list too long")
	for _, c := range []struct {
		name string
		d    Devices
		view string
		err  error
		want model.Absence
	}{
		{"cuda on a CPU node", cpuNode, "cuda", loadErr, model.AbsentNoGPU},
		{"cuda on a GPU node, whatever the agent was given", notGiven, "cuda", loadErr, ""},
		{"nccl on a CPU node", cpuNode, "nccl", loadErr, model.AbsentNoGPU},
		{"nccl on a GPU node", notGiven, "nccl", loadErr, ""},
		{"nvml on a CPU node", cpuNode, "nvml", failed, model.AbsentNoGPU},
		{"nvml where the agent's container has no GPU", notGiven, "nvml", failed, model.AbsentNoNVML},
		{"nvml without the library", gpuNode, "nvml", noLib, model.AbsentNoNVML},
		{"nvml with library and devices, failing", gpuNode, "nvml", failed, ""},
		{"sched needs only the kernel", cpuNode, "sched", loadErr, ""},
		{"sock needs only the kernel", cpuNode, "sock", loadErr, ""},
		{"fd needs only the kernel", cpuNode, "fd", loadErr, ""},
	} {
		if got := c.d.Absence(c.view, c.err); got != c.want {
			t.Errorf("%s: Absence = %q, want %q", c.name, got, c.want)
		}
	}
}
