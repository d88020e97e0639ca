package ncclstall

import (
	"cmp"
	"slices"

	"github.com/prometheus/procfs"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// ProcThreads reads a process's threads from /proc under root: each one's
// state (task/TID/stat) and the kernel function a sleeping one waits in
// (task/TID/wchan). Read only for a straggling rank, once per poll. A
// process that went away has none.
func ProcThreads(root string) (Threads, error) {
	fs, err := procfs.NewFS(root)
	if err != nil {
		return nil, err
	}
	return func(pid int) []model.NCCLThread {
		tasks, err := fs.AllThreads(pid)
		if err != nil {
			return nil
		}
		var out []model.NCCLThread
		for _, t := range tasks {
			st, err := t.Stat()
			if err != nil {
				continue // exited since the listing
			}
			th := model.NCCLThread{TID: t.PID, Name: st.Comm, State: stateName(st.State)}
			if th.State != "running" {
				th.WaitChannel, _ = t.Wchan() // "" where the kernel hides it
			}
			out = append(out, th)
		}
		slices.SortFunc(out, func(a, b model.NCCLThread) int { return cmp.Compare(a.TID, b.TID) })
		return out
	}, nil
}

// stateName names a /proc state letter (fs/proc/array.c's task_state_array).
func stateName(s string) string {
	switch s {
	case "R":
		return "running"
	case "S":
		return "sleeping"
	case "D":
		return "blocked"
	case "T", "t":
		return "stopped"
	case "Z":
		return "zombie"
	case "I":
		return "idle"
	}
	return s
}
