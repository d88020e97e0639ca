package procinfo

// Descendants returns the live processes descending from any pid in roots
// (children, grandchildren, ...), not including roots themselves. It reads
// every /proc/PID/stat once: /proc/PID/task/TID/children needs
// CONFIG_PROC_CHILDREN, which many kernels lack.
func (fs FS) Descendants(roots []int) ([]int, error) {
	procs, err := fs.proc.AllProcs()
	if err != nil {
		return nil, err
	}
	kids := map[int][]int{}
	for _, p := range procs {
		st, err := fs.readStat(p.PID)
		if err != nil || st.State == "Z" || st.State == "X" {
			continue // gone while listing, or a zombie
		}
		kids[st.PPID] = append(kids[st.PPID], p.PID)
	}
	var out []int
	seen := map[int]bool{}
	queue := append([]int(nil), roots...)
	for _, r := range roots {
		seen[r] = true
	}
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		for _, c := range kids[pid] {
			if !seen[c] {
				seen[c] = true
				out = append(out, c)
				queue = append(queue, c)
			}
		}
	}
	return out, nil
}

// AllPIDs lists every process (thread group) under the proc mount.
func (fs FS) AllPIDs() ([]int, error) {
	procs, err := fs.proc.AllProcs()
	if err != nil {
		return nil, err
	}
	pids := make([]int, len(procs))
	for i, p := range procs {
		pids[i] = p.PID
	}
	return pids, nil
}
