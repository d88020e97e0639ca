package features

import (
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/open-autoglm/autoglm-ebpf/pkg/gpunode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// NVML's line is absent, not a failure, where the node has no GPU or the
// agent was not given NVML; a failure where it was given both.
func TestNVMLLineAbsent(t *testing.T) {
	gpus := []string{"nvidia0"}
	for _, c := range []struct {
		name string
		ret  gonvml.Return
		devs gpunode.Devices
		want model.Absence
	}{
		{"a CPU node", gonvml.ERROR_LIBRARY_NOT_FOUND, gpunode.Devices{}, model.AbsentNoGPU},
		{"a GPU node, no library given", gonvml.ERROR_LIBRARY_NOT_FOUND, gpunode.Devices{Node: gpus, Agent: gpus}, model.AbsentNoNVML},
		{"a GPU node, no device given", gonvml.ERROR_DRIVER_NOT_LOADED, gpunode.Devices{Node: gpus}, model.AbsentNoNVML},
		{"a GPU node, NVML given and failing", gonvml.ERROR_NO_PERMISSION, gpunode.Devices{Node: gpus, Agent: gpus}, ""},
	} {
		// Only Init is mocked: Probe goes no further when it fails.
		r := nvml(&mock.Interface{InitFunc: func() gonvml.Return { return c.ret }}, c.devs)
		if r.OK || r.Absent != c.want || !strings.HasPrefix(r.Detail, "NVML unavailable: ") {
			t.Errorf("%s: %+v, want not OK, absent %q", c.name, r, c.want)
		}
	}
}

func TestGPUsLine(t *testing.T) {
	for _, c := range []struct {
		devs   gpunode.Devices
		ok     bool
		detail string
	}{
		{gpunode.Devices{}, false, "none on this node (its /dev and the host's): the cuda, nccl and nvml views are not expected here"},
		{gpunode.Devices{Node: []string{"nvidia0", "nvidia1"}}, true, "on the node: nvidia0 nvidia1; given to this process: none (NVML cannot read them)"},
		{gpunode.Devices{Node: []string{"nvidia0"}, Agent: []string{"nvidia0"}}, true, "on the node: nvidia0; given to this process: nvidia0"},
	} {
		if r := gpus(c.devs); r.OK != c.ok || r.Detail != c.detail || r.Required {
			t.Errorf("%+v: %+v, want OK %v, detail %q, not required", c.devs, r, c.ok, c.detail)
		}
	}
}
