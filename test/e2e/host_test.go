//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// hostState is what a run may change outside its own folder and must
// leave as it found it: mounts, cgroups, network links, nftables, sysctls,
// the BPF programs loaded, the folders kubelet, containerd and the CNI
// plugins make in fixed places, and processes of the cluster's programs.
type hostState struct {
	Mounts    []string          // mount points
	Cgroups   []string          // the top of each cgroup hierarchy: HIERARCHY/ENTRY
	Links     []string          // network interfaces
	Nft       string            // `nft list ruleset`
	Sysctls   map[string]string // the values of touchedSysctls
	Progs     []string          // BPF program ids with their names
	Paths     []string          // entries of watchedDirs
	Processes []string          // PID exe of processes of clusterPrograms
}

// touchedSysctls are what the kubelet sets (kernel defaults it protects),
// and ip_forward, which the CNI bridge plugin sets.
var touchedSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward",
}

// watchedDirs hold what the cluster's parts write in fixed places
// (/var/lib/kubelet/device-plugins, /var/log/containers, /run/containerd,
// /run/netns, /var/lib/cni, ~/.kube): their entries are compared.
var watchedDirs = []string{"/run", "/var/lib", "/var/log", "/etc", "/opt", "/root", "/var/tmp"}

// clusterPrograms are the executables a run starts (the kube-* binaries
// and the agent are matched by their folder in snapshotHost).
var clusterPrograms = []string{"etcd", "containerd", "containerd-shim-runc-v2", "runc", "prometheus", "prometheus-alertmanager"}

func snapshotHost(runDir string) (hostState, error) {
	var s hostState
	var errs []error
	mi, err := os.ReadFile("/proc/self/mountinfo")
	errs = append(errs, err)
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			s.Mounts = append(s.Mounts, f[4])
		}
	}
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hier {
		ents, _ := os.ReadDir(h)
		for _, e := range ents {
			if e.IsDir() {
				s.Cgroups = append(s.Cgroups, filepath.Join(h, e.Name()))
			}
		}
	}
	links, err := os.ReadDir("/sys/class/net")
	errs = append(errs, err)
	for _, l := range links {
		s.Links = append(s.Links, l.Name())
	}
	out, err := exec.Command("nft", "list", "ruleset").Output()
	errs = append(errs, err)
	s.Nft = string(out)
	s.Sysctls = map[string]string{}
	for _, k := range touchedSysctls {
		v, err := os.ReadFile("/proc/sys/" + k)
		errs = append(errs, err)
		s.Sysctls[k] = strings.TrimSpace(string(v))
	}
	out, err = exec.Command("bpftool", "-j", "prog", "list").Output()
	errs = append(errs, err)
	var progs []struct {
		ID   int    `json:"id"`
		Name string `json:"name"`
	}
	if err == nil {
		errs = append(errs, json.Unmarshal(out, &progs))
	}
	for _, p := range progs {
		s.Progs = append(s.Progs, fmt.Sprintf("%d %s", p.ID, p.Name))
	}
	for _, d := range watchedDirs {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			s.Paths = append(s.Paths, filepath.Join(d, e.Name()))
		}
	}
	for _, p := range clusterProcesses(runDir) {
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", p))
		s.Processes = append(s.Processes, fmt.Sprintf("%d %s", p, exe))
	}
	for _, l := range [][]string{s.Mounts, s.Cgroups, s.Links, s.Progs, s.Paths, s.Processes} {
		sort.Strings(l)
	}
	return s, errors.Join(errs...)
}

// clusterProcesses are the pids of the processes a run starts: the
// programs in clusterPrograms, anything run from runDir's parent (the
// kube-* binaries) and everything in a kubepods cgroup (the pods).
func clusterProcesses(runDir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	self := os.Getpid()
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid == self {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil {
			continue // a kernel thread, or gone
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if slices.Contains(clusterPrograms, filepath.Base(exe)) ||
			strings.HasPrefix(exe, filepath.Dir(runDir)+"/") || bytes.Contains(cg, []byte("/kubepods")) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// diff says how after differs from before, one line per difference.
func (before hostState) diff(after hostState) []string {
	var d []string
	list := func(what string, b, a []string) {
		for _, x := range a {
			if !slices.Contains(b, x) {
				d = append(d, what+" left: "+x)
			}
		}
		for _, x := range b {
			if !slices.Contains(a, x) {
				d = append(d, what+" gone: "+x)
			}
		}
	}
	list("mount", before.Mounts, after.Mounts)
	list("cgroup", before.Cgroups, after.Cgroups)
	list("network interface", before.Links, after.Links)
	list("path", before.Paths, after.Paths)
	list("process", before.Processes, after.Processes)
	// BPF programs of others may go meanwhile: only new ones are the run's.
	for _, p := range after.Progs {
		if !slices.Contains(before.Progs, p) {
			d = append(d, "BPF program left: "+p)
		}
	}
	if before.Nft != after.Nft {
		d = append(d, "nftables ruleset changed:\n"+after.Nft)
	}
	for _, k := range touchedSysctls {
		if before.Sysctls[k] != after.Sysctls[k] {
			d = append(d, fmt.Sprintf("sysctl %s: %s, was %s", k, after.Sysctls[k], before.Sysctls[k]))
		}
	}
	return d
}
