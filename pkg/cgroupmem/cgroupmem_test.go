package cgroupmem

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/procfs"
)

const pid = 4242

func file(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }

// findIn runs find on a test tree: its proc/self files become process
// pid's in a procfs of their own, the rest is the cgroup hierarchy.
func findIn(t *testing.T, fsys fstest.MapFS) (*Limit, error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), strconv.Itoa(pid))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cgroup", "mountinfo"} {
		if err := os.WriteFile(filepath.Join(dir, name), fsys["proc/self/"+name].Data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p, err := procfs.NewFS(filepath.Dir(dir))
	if err != nil {
		t.Fatal(err)
	}
	proc, err := p.Proc(pid)
	if err != nil {
		t.Fatal(err)
	}
	return find(fsys, proc)
}

// host is a node's cgroup v2 hierarchy under root (a path in the test fs):
// this process's container under a burstable pod, a neighbour, and the
// node's services.
func host(root string, fsys fstest.MapFS) {
	pod := root + "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda1.slice"
	fsys[root+"/init.scope/cgroup.procs"] = file("1\n")
	fsys[root+"/system.slice/containerd.service/cgroup.procs"] = file("700\n")
	fsys[root+"/kubepods.slice/memory.max"] = file("67108864000\n")
	fsys[root+"/kubepods.slice/kubepods-burstable.slice/memory.max"] = file("max\n")
	fsys[pod+"/memory.max"] = file("1073741824\n")
	fsys[pod+"/cri-containerd-0a1.scope/cgroup.procs"] = file("9\n")
	fsys[pod+"/cri-containerd-0a2.scope/cgroup.procs"] = file("4241\n4242\n")
	fsys[pod+"/cri-containerd-0a2.scope/memory.max"] = file("536870912\n")
	fsys[root+"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podb2.slice/cri-containerd-0b1.scope/cgroup.procs"] = file("5000\n")
}

func TestFind(t *testing.T) {
	const ctr = "sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda1.slice/cri-containerd-0a2.scope"
	for _, c := range []struct {
		name      string
		fsys      fstest.MapFS
		dir       string
		limit     uint64
		hasLimit  bool
		errSubstr string
	}{
		{
			// The shipped DaemonSet: its own cgroup namespace, and the host's
			// hierarchy mounted over the runtime's view of its own cgroup.
			name: "v2, cgroup namespace, the host's hierarchy mounted over",
			fsys: func() fstest.MapFS {
				fsys := fstest.MapFS{
					"proc/self/cgroup": file("0::/\n"),
					"proc/self/mountinfo": file("900 800 0:50 / / ro,relatime - overlay overlay rw\n" +
						"1000 900 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw\n" +
						"1001 900 0:30 /../../../.. /sys/fs/cgroup ro,relatime master:9 - cgroup2 cgroup2 rw,nsdelegate\n"),
				}
				host("sys/fs/cgroup", fsys)
				return fsys
			}(),
			dir: "/" + ctr, limit: 536870912, hasLimit: true,
		},
		{
			name: "v2, cgroup namespace, its own hierarchy",
			fsys: fstest.MapFS{
				"proc/self/cgroup":         file("0::/\n"),
				"proc/self/mountinfo":      file("1000 900 0:30 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n"),
				"sys/fs/cgroup/memory.max": file("268435456\n"),
			},
			dir: "/sys/fs/cgroup", limit: 268435456, hasLimit: true,
		},
		{
			// A pod's limit below its container's bounds it.
			name: "v2, the host's cgroup namespace: the pod's limit",
			fsys: func() fstest.MapFS {
				fsys := fstest.MapFS{
					"proc/self/cgroup":    file("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda1.slice/cri-containerd-0a2.scope\n"),
					"proc/self/mountinfo": file("30 22 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"),
				}
				host("sys/fs/cgroup", fsys)
				fsys["sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-poda1.slice/memory.max"] = file("402653184\n")
				return fsys
			}(),
			dir: "/" + ctr, limit: 402653184, hasLimit: true,
		},
		{
			// Hybrid: v1 controllers, v2 at unified; memory is v1's.
			name: "hybrid, memory on v1",
			fsys: fstest.MapFS{
				"proc/self/cgroup": file("9:name=systemd:/\n4:memory:/process_api/bda7\n1:cpu:/\n0::/\n"),
				"proc/self/mountinfo": file("30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n" +
					"31 30 0:28 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n" +
					"34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
					"40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"),
				"sys/fs/cgroup/memory/memory.limit_in_bytes":                  file("9223372036854771712\n"),
				"sys/fs/cgroup/memory/process_api/memory.limit_in_bytes":      file("2147483648\n"),
				"sys/fs/cgroup/memory/process_api/bda7/memory.limit_in_bytes": file("9223372036854771712\n"),
				"sys/fs/cgroup/unified/memory.max":                            file("1\n"),
			},
			dir: "/sys/fs/cgroup/memory/process_api/bda7", limit: 2147483648, hasLimit: true,
		},
		{
			// A v1 container: its cgroup bind-mounted as the hierarchy's
			// root, the path the host's.
			name: "v1, container's cgroup as the mount's root",
			fsys: fstest.MapFS{
				"proc/self/cgroup":                           file("5:memory:/kubepods/burstable/poda1/0a2\n"),
				"proc/self/mountinfo":                        file("1010 1000 0:31 /kubepods/burstable/poda1/0a2 /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory\n"),
				"sys/fs/cgroup/memory/memory.limit_in_bytes": file("536870912\n"),
			},
			dir: "/sys/fs/cgroup/memory", limit: 536870912, hasLimit: true,
		},
		{
			name: "no limit anywhere",
			fsys: fstest.MapFS{
				"proc/self/cgroup":                                    file("0::/user.slice/session-1.scope\n"),
				"proc/self/mountinfo":                                 file("30 22 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"),
				"sys/fs/cgroup/user.slice/memory.max":                 file("max\n"),
				"sys/fs/cgroup/user.slice/session-1.scope/memory.max": file("max\n"),
			},
			dir: "/sys/fs/cgroup/user.slice/session-1.scope",
		},
		{
			name: "a space in the mount point",
			fsys: fstest.MapFS{
				"proc/self/cgroup":     file("0::/a\n"),
				"proc/self/mountinfo":  file("30 22 0:27 / /cg\\040root rw - cgroup2 cgroup2 rw\n"),
				"cg root/a/memory.max": file("1048576\n"),
			},
			dir: "/cg root/a", limit: 1048576, hasLimit: true,
		},
		{
			name: "the cgroup is not under the mount",
			fsys: fstest.MapFS{
				"proc/self/cgroup":    file("0::/mine\n"),
				"proc/self/mountinfo": file("30 22 0:27 /other /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"),
			},
			errSubstr: "not under the mount",
		},
		{
			name: "namespaced, and no cgroup below lists this process",
			fsys: fstest.MapFS{
				"proc/self/cgroup":               file("0::/\n"),
				"proc/self/mountinfo":            file("30 22 0:27 /../.. /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"),
				"sys/fs/cgroup/a/b/cgroup.procs": file("1\n"),
			},
			errSubstr: "lists pid 4242",
		},
	} {
		l, err := findIn(t, c.fsys)
		if c.errSubstr != "" {
			if err == nil || !strings.Contains(err.Error(), c.errSubstr) {
				t.Errorf("%s: err %v, want one with %q", c.name, err, c.errSubstr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		n, ok := l.Read()
		if l.Dir() != c.dir || n != c.limit || ok != c.hasLimit {
			t.Errorf("%s: cgroup %s, limit %d %v; want %s, %d %v", c.name, l.Dir(), n, ok, c.dir, c.limit, c.hasLimit)
		}
	}
}

// The limit is read at each scrape (a pod resized in place), and not
// exported while there is none.
func TestCollector(t *testing.T) {
	fsys := fstest.MapFS{
		"proc/self/cgroup":         file("0::/\n"),
		"proc/self/mountinfo":      file("1000 900 0:30 / /sys/fs/cgroup ro - cgroup2 cgroup rw\n"),
		"sys/fs/cgroup/memory.max": file("536870912\n"),
	}
	l, err := findIn(t, fsys)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(l)
	want := `
# HELP autoglm_memory_limit_bytes The memory limit of the agent's cgroup: the least of memory.max (v2) or memory.limit_in_bytes (v1) of its cgroup and the ancestors it can see, read at each scrape. Absent without a limit. Its RSS and, on Linux >= 5.11, its BPF maps (autoglm_bpf_memory_bytes) are charged there.
# TYPE autoglm_memory_limit_bytes gauge
autoglm_memory_limit_bytes 5.36870912e+08
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "autoglm_memory_limit_bytes"); err != nil {
		t.Error(err)
	}
	fsys["sys/fs/cgroup/memory.max"] = file("805306368\n")
	if got := testutil.ToFloat64(l); got != 805306368 {
		t.Errorf("after a resize: %v, want 805306368", got)
	}
	fsys["sys/fs/cgroup/memory.max"] = file("max\n")
	if n, err := testutil.GatherAndCount(reg, "autoglm_memory_limit_bytes"); err != nil || n != 0 {
		t.Errorf("without a limit: %d series (%v), want none", n, err)
	}
	problems, err := testutil.CollectAndLint(l)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
