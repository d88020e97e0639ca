package cudatrack

import "github.com/open-autoglm/autoglm-ebpf/pkg/pyframes"

// Python frames at allocations: bpf/pyframes.h in the CUDA object,
// pkg/pyframes here. A site is a native stack and a Python stack together.

func (t *Tracker) newPy() *pyframes.Tracker {
	return pyframes.New(pyframes.Maps{Procs: t.maps.PyProcs, Stacks: t.maps.PyStacks, Errors: t.maps.PyErrors}, t.proc)
}

// siteID numbers the site of a native stack id and a Python stack id
// (model.CUDASite.StackID): the native id alone without Python frames, as
// before; both otherwise, positive. A negative native id (no stack) stays
// what it was.
func siteID(native int32, py uint32) int64 {
	if native < 0 || py == 0 {
		return int64(native)
	}
	return int64(py)<<31 | int64(native)
}

// splitSite undoes siteID for a non-negative id.
func splitSite(id int64) (native int32, py uint32) {
	return int32(id & (1<<31 - 1)), uint32(id >> 31)
}

// Lost adds the Python frame counters (cuda_py_*) to the tracker's.
func (c *Concern) Lost() (map[string]uint64, error) {
	out, err := c.Tracker.Lost()
	if err != nil {
		return nil, err
	}
	py, err := c.py.Lost("cuda")
	if err != nil {
		return nil, err
	}
	for k, v := range py {
		out[k] = v
	}
	return out, nil
}
