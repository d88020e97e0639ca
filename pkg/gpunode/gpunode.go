// Package gpunode finds the NVIDIA GPUs of this node, and from them says
// whether the GPU views (cuda, nccl, nvml) are expected to run here. A
// view that does not run where it is not expected is absent (model.Absence), not
// down: a CPU node, or a GPU node whose agent was deliberately not given
// NVML, raises no alarm. A view that runs is up wherever it is.
package gpunode

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/nvml"
)

// Devices are the GPU device nodes (nvidia0, nvidia1, ...) found at start.
// /dev/nvidiactl alone is not a GPU: the driver's control node, which
// exists on a node with the driver and no GPU, and in containers given the
// driver but no device.
type Devices struct {
	// Node: the node's, from the host's /dev and the agent's own.
	Node []string
	// Agent: those in the agent's own /dev, the ones its container was
	// given; NVML reads the GPUs through them.
	Agent []string
}

// Find looks for GPUs in the host's /dev, seen through procRoot/1/root
// (in a container with the host's pid namespace, as the DaemonSet runs,
// pid 1 is the host's init; elsewhere it is the agent's own root), and in
// the agent's /dev. A /dev that cannot be read (no ptrace access to pid 1)
// shows none.
func Find(procRoot string) Devices {
	return find(os.DirFS(filepath.Join(procRoot, "1", "root", "dev")), os.DirFS("/dev"))
}

func find(host, own fs.FS) Devices {
	agent := gpus(own)
	node := append(gpus(host), agent...)
	slices.Sort(node)
	return Devices{Node: slices.Compact(node), Agent: agent}
}

var gpuNode = regexp.MustCompile(`^nvidia[0-9]+$`)

func gpus(dev fs.FS) []string {
	entries, err := fs.ReadDir(dev, ".")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range entries {
		if gpuNode.MatchString(e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

// Absence says why view, which does not run (err: what failed), is not
// expected on this node, or "" when it is expected there: then it is down.
//   - cuda and nccl hook the CUDA and NCCL libraries of the node's
//     processes, which need a GPU to do anything; their BPF side needs no
//     device of the agent's own.
//   - nvml needs a GPU, and NVML given to the agent: the library and the
//     device nodes. Given both, a failure (no permission, a driver not
//     loaded, versions that differ) is a fault.
//
// The other views need only the kernel, which every node has: they are
// always expected.
func (d Devices) Absence(view string, err error) model.Absence {
	switch view {
	case "cuda", "nccl":
		if len(d.Node) == 0 {
			return model.AbsentNoGPU
		}
	case "nvml":
		switch {
		case len(d.Node) == 0:
			return model.AbsentNoGPU
		case len(d.Agent) == 0 || errors.Is(err, nvml.ErrNoLibrary):
			return model.AbsentNoNVML
		}
	}
	return ""
}
