// Package cgroupmem reads the memory limit of the cgroup this process runs
// in, for autoglm_memory_limit_bytes: the agent's RSS and its BPF maps are
// charged there (Linux >= 5.11), and the cgroup's OOM killer ends it at
// that limit.
//
// The cgroup is found as the kernel names it, /proc/self/cgroup, in the
// hierarchy /proc/self/mountinfo says is mounted: cgroup v1's memory
// controller where there is one (hybrid hosts mount v1 controllers and v2
// at /sys/fs/cgroup/unified, the memory controller then being v1's),
// cgroup v2 otherwise. The limit is the least of the cgroup's and its
// ancestors' (memory.limit_in_bytes, memory.max) within that mount: a pod's
// or a systemd slice's limit bounds its containers too.
//
// The DaemonSet mounts the host's hierarchy over its container's
// /sys/fs/cgroup. With cgroup v2 the container has its own cgroup
// namespace, so /proc/self/cgroup says "/" and the mount's root shows as
// "/../../..": the cgroup is somewhere that many levels below the host's
// root. It is found there as the directory whose cgroup.procs lists this
// process.
package cgroupmem

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/procfs"
)

// Limit reads the memory limit of one cgroup and its ancestors.
type Limit struct {
	fsys fs.FS
	// dirs: the cgroup's directory, then its ancestors up to the mount's
	// root, as paths in fsys.
	dirs []string
	file string // memory.limit_in_bytes (v1) or memory.max (v2)
}

// Find locates this process's memory cgroup.
func Find() (*Limit, error) {
	p, err := procfs.NewDefaultFS()
	if err != nil {
		return nil, err
	}
	self, err := p.Self()
	if err != nil {
		return nil, err
	}
	return find(os.DirFS("/"), self)
}

// Dir is the cgroup's directory.
func (l *Limit) Dir() string { return "/" + l.dirs[0] }

// unlimitedV1 is where cgroup v1 values stop being limits: "no limit" is
// the largest page count the kernel keeps, in bytes (9223372036854771712
// with 4 KiB pages), and no memory is that large.
const unlimitedV1 = 1 << 62

// Read returns the least limit set on the cgroup and its ancestors; false
// when none is. It reads the files again at each call: a limit can be
// changed in place (Kubernetes resizes pods so).
func (l *Limit) Read() (uint64, bool) {
	var least uint64
	found := false
	for _, d := range l.dirs {
		// The root cgroup has no limit file in v2; an ancestor may vanish.
		b, err := fs.ReadFile(l.fsys, path.Join(d, l.file))
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			continue
		}
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil || n >= unlimitedV1 {
			continue
		}
		if !found || n < least {
			least, found = n, true
		}
	}
	return least, found
}

var limitDesc = prometheus.NewDesc("autoglm_memory_limit_bytes",
	"The memory limit of the agent's cgroup: the least of memory.max (v2) or memory.limit_in_bytes (v1) of its cgroup and the ancestors it can see, read at each scrape. Absent without a limit. Its RSS and, on Linux >= 5.11, its BPF maps (autoglm_bpf_memory_bytes) are charged there.",
	nil, nil)

// Describe implements prometheus.Collector.
func (l *Limit) Describe(ch chan<- *prometheus.Desc) { ch <- limitDesc }

// Collect implements prometheus.Collector: nothing when there is no limit,
// so that no alert compares against one.
func (l *Limit) Collect(ch chan<- prometheus.Metric) {
	if n, ok := l.Read(); ok {
		ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, float64(n))
	}
}

// mount is one line of mountinfo, its paths unescaped.
type mount struct {
	root, point, fstype string
	super               map[string]string // super options: a v1 hierarchy's controllers
}

func find(fsys fs.FS, proc procfs.Proc) (*Limit, error) {
	cgroups, err := proc.Cgroups()
	if err != nil {
		return nil, err
	}
	infos, err := proc.MountInfo()
	if err != nil {
		return nil, err
	}
	ms := make([]mount, 0, len(infos))
	for _, m := range infos {
		ms = append(ms, mount{root: unescape(m.Root), point: unescape(m.MountPoint), fstype: m.FSType, super: m.SuperOptions})
	}
	mounts := visible(ms)
	var v2 *procfs.Cgroup
	for i, c := range cgroups {
		if c.HierarchyID == 0 && len(c.Controllers) == 0 {
			v2 = &cgroups[i]
			continue
		}
		if !slices.Contains(c.Controllers, "memory") {
			continue
		}
		for _, m := range mounts {
			if _, ok := m.super["memory"]; ok && m.fstype == "cgroup" {
				return locate(fsys, m, c.Path, "memory.limit_in_bytes", proc.PID)
			}
		}
	}
	if v2 != nil {
		var errs []error
		for _, m := range mounts {
			if m.fstype != "cgroup2" {
				continue
			}
			l, err := locate(fsys, m, v2.Path, "memory.max", proc.PID)
			if err == nil {
				return l, nil
			}
			errs = append(errs, err)
		}
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
	}
	return nil, errors.New("no cgroup memory controller mounted")
}

// unescape undoes mountinfo's octal escapes (\040 for a space, ...), which
// procfs leaves in its paths.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// visible drops the mounts hidden by a later one on the same point or
// above it: the DaemonSet's host hierarchy over the runtime's own.
func visible(ms []mount) []mount {
	var out []mount
	for i, m := range ms {
		hidden := slices.ContainsFunc(ms[i+1:], func(later mount) bool {
			return later.point == m.point || strings.HasPrefix(m.point, later.point+"/")
		})
		if !hidden {
			out = append(out, m)
		}
	}
	return out
}

// locate finds the directory of the cgroup at p (as /proc/self/cgroup
// names it) under mount m.
func locate(fsys fs.FS, m mount, p, file string, pid int) (*Limit, error) {
	if m.point == "/" || !strings.HasPrefix(m.point, "/") || strings.HasPrefix(p, "/..") {
		return nil, fmt.Errorf("cgroup %s under a mount at %s: not a cgroup directory", p, m.point)
	}
	base := strings.TrimPrefix(m.point, "/")
	var dir string
	switch up, ok := ups(m.root); {
	case m.root == "/":
		dir = path.Join(base, p)
	case p == m.root || strings.HasPrefix(p, m.root+"/"):
		dir = path.Join(base, strings.TrimPrefix(p, m.root))
	case ok:
		// The mount's root is up levels above this process's cgroup
		// namespace, whose root's name is not shown.
		ns, err := search(fsys, base, up, p, pid)
		if err != nil {
			return nil, err
		}
		dir = path.Join(ns, p)
	default:
		return nil, fmt.Errorf("cgroup %s is not under the mount at %s (root %s)", p, m.point, m.root)
	}
	var dirs []string
	for d := dir; ; d = path.Dir(d) {
		dirs = append(dirs, d)
		if d == base {
			break
		}
	}
	return &Limit{fsys: fsys, dirs: dirs, file: file}, nil
}

// ups reads a mount's root made only of "..": how many levels above the
// cgroup namespace's root it is. A root that then goes down ("/../x") is
// not above it but beside it.
func ups(root string) (int, bool) {
	cs := strings.Split(strings.TrimPrefix(root, "/"), "/")
	for _, c := range cs {
		if c != ".." {
			return 0, false
		}
	}
	return len(cs), true
}

// search finds the directory depth levels below base whose sub/cgroup.procs
// lists pid.
func search(fsys fs.FS, base string, depth int, sub string, pid int) (string, error) {
	level := []string{base}
	for range depth {
		var next []string
		for _, d := range level {
			entries, err := fs.ReadDir(fsys, d)
			if err != nil {
				continue
			}
			for _, e := range entries {
				if e.IsDir() {
					next = append(next, path.Join(d, e.Name()))
				}
			}
		}
		level = next
	}
	want := strconv.Itoa(pid)
	for _, d := range level {
		procs, err := fs.ReadFile(fsys, path.Join(d, sub, "cgroup.procs"))
		if err == nil && slices.Contains(strings.Fields(string(procs)), want) {
			return d, nil
		}
	}
	return "", fmt.Errorf("no cgroup %d levels below /%s lists pid %d", depth, base, pid)
}
