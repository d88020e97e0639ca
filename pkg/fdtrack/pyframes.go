package fdtrack

import "github.com/open-autoglm/autoglm-ebpf/pkg/pyframes"

// Python frames at fd opens: bpf/pyframes.h in the fd object, pkg/pyframes
// here. Sites are keyed by their Python stack too, and their frames merged.

func (t *Tracker) newPy() *pyframes.Tracker {
	return pyframes.New(pyframes.Maps{Procs: t.maps.PyProcs, Stacks: t.maps.PyStacks, Errors: t.maps.PyErrors}, t.proc)
}

// Track starts tracking pid, with the Python frames of its opens if it runs
// CPython.
func (c *Concern) Track(pid int) error {
	c.py.Track(pid)
	if err := c.Tracker.Track(pid); err != nil {
		c.py.Untrack(pid)
		return err
	}
	return nil
}

// Lost adds the Python frame counters (fd_py_*) to the tracker's.
func (c *Concern) Lost() (map[string]uint64, error) {
	out, err := c.Tracker.Lost()
	if err != nil {
		return nil, err
	}
	py, err := c.py.Lost("fd")
	if err != nil {
		return nil, err
	}
	for k, v := range py {
		out[k] = v
	}
	return out, nil
}
