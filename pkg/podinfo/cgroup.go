// Package podinfo says which Kubernetes pod and container a process belongs
// to: the ids from its /proc/PID/cgroup, and (through Resolver) the
// namespace, pod and container names the API server knows them by.
package podinfo

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/prometheus/procfs"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// Cgroup is where a process sits in the cgroup tree and which pod and
// container that place belongs to.
type Cgroup struct {
	// Path is the cgroup v2 path, or on cgroup v1 the path of the chosen
	// controller line. It is relative to the reader's cgroup namespace, so
	// inside a container it may start with "/..".
	Path string
	// PodUID is the pod's UID in the API server's form: dashed
	// (3f0e9b7c-1a2b-...), or 32 hex digits for a static pod. Empty outside
	// a pod.
	PodUID string
	// ContainerID is the runtime's 64-hex container id. Empty outside a pod
	// and for a pod's own processes that run in no container (CRI-O's
	// conmon).
	ContainerID string
}

// ReadCgroup reads /proc/PID/cgroup through fs. A process outside any pod
// gives empty ids and no error; lines that are not in the kernel's format,
// or a pod slice with an unreadable UID, give an error.
func ReadCgroup(fs procinfo.FS, pid int) (Cgroup, error) {
	lines, err := fs.Cgroups(pid)
	if err == nil {
		var cg Cgroup
		if cg, err = parseCgroup(lines); err == nil {
			return cg, nil
		}
	}
	return Cgroup{}, fmt.Errorf("cgroup of pid %d: %w", pid, err)
}

// parseCgroup picks the line that places the process in a pod. On cgroup v1
// every controller has its own line; the kubelet puts a pod under the same
// path in each, but a controller it does not manage (rdma, say) may still
// say "/", so the first line naming a pod wins. Without a pod the unified
// (v2) line is the most telling, then v1's name=systemd, which names the
// unit, then the first line.
func parseCgroup(lines []procfs.Cgroup) (Cgroup, error) {
	if len(lines) == 0 {
		return Cgroup{}, errors.New("no cgroup lines")
	}
	for _, l := range lines {
		if !strings.HasPrefix(l.Path, "/") {
			return Cgroup{}, fmt.Errorf("malformed line %q: path is not absolute", lineText(l))
		}
		cg, err := podOf(l.Path)
		if err != nil {
			return Cgroup{}, fmt.Errorf("line %q: %w", lineText(l), err)
		}
		if cg.PodUID != "" {
			return cg, nil
		}
	}
	for _, prefer := range []func(procfs.Cgroup) bool{
		func(l procfs.Cgroup) bool { return l.HierarchyID == 0 },
		func(l procfs.Cgroup) bool { return slices.Contains(l.Controllers, "name=systemd") },
	} {
		if i := slices.IndexFunc(lines, prefer); i >= 0 {
			return Cgroup{Path: lines[i].Path}, nil
		}
	}
	return Cgroup{Path: lines[0].Path}, nil
}

// lineText rebuilds a line for error messages; procfs keeps only its fields.
func lineText(l procfs.Cgroup) string {
	return fmt.Sprintf("%d:%s:%s", l.HierarchyID, strings.Join(l.Controllers, ","), l.Path)
}

// podOf finds the pod segment anywhere in path (a DaemonSet in its own
// cgroup namespace sees "/../../kubepods-...", and kind nests the node under
// "/docker/<node>/kubepods/...") and the container segment right below it,
// where every runtime puts a container.
func podOf(path string) (Cgroup, error) {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		uid, err := podSegment(s)
		if err != nil {
			return Cgroup{}, err
		}
		if uid == "" {
			continue
		}
		cg := Cgroup{Path: path, PodUID: uid}
		if i+1 < len(segs) {
			cg.ContainerID = containerSegment(segs[i+1])
		}
		return cg, nil
	}
	return Cgroup{Path: path}, nil
}

// podSegment returns the pod UID a path segment names, or "". The systemd
// cgroup driver writes kubepods[-<qos>]-pod<uid with _ for ->.slice; the
// cgroupfs driver writes pod<uid> (under kubepods[/<qos>], which a cgroup
// namespace may hide, so the UID's shape is what identifies it). Guaranteed
// pods have no qos level.
func podSegment(s string) (string, error) {
	if strings.HasPrefix(s, "kubepods") && strings.HasSuffix(s, ".slice") {
		i := strings.LastIndex(s, "-pod")
		if i < 0 {
			return "", nil // kubepods.slice or a qos slice
		}
		uid := strings.ReplaceAll(s[i+len("-pod"):len(s)-len(".slice")], "_", "-")
		if !isPodUID(uid) {
			return "", fmt.Errorf("malformed pod UID in %q", s)
		}
		return uid, nil
	}
	if uid, ok := strings.CutPrefix(s, "pod"); ok && isPodUID(uid) {
		return uid, nil
	}
	return "", nil
}

// containerSegment returns the container id a segment below the pod names:
// cri-containerd-<id>.scope, crio-<id>.scope, docker-<id>.scope (systemd
// driver), crio-<id> or the bare <id> (cgroupfs driver). CRI-O's monitor
// sits in crio-conmon-<id>.scope, which is no container and matches nothing
// here, since "conmon-<id>" is not an id.
func containerSegment(s string) string {
	for _, prefix := range []string{"cri-containerd-", "crio-", "docker-"} {
		if rest, ok := strings.CutPrefix(s, prefix); ok {
			s = strings.TrimSuffix(rest, ".scope")
			break
		}
	}
	if len(s) == 64 && isLowerHex(s) {
		return s
	}
	return ""
}

// isPodUID accepts the UIDs the kubelet uses for cgroups: an API-server UUID
// (8-4-4-4-12 hex) or a static pod's 32-hex hash of its manifest.
func isPodUID(s string) bool {
	if len(s) == 32 {
		return isLowerHex(s)
	}
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false
	}
	h := strings.ReplaceAll(s, "-", "")
	return len(h) == 32 && isLowerHex(h)
}

func isLowerHex(s string) bool {
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
