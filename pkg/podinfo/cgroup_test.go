package podinfo

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// Ids used in testdata/proc/*/cgroup.
const (
	cid1 = "0c0788a33148f2ff7b0be24cdd5719943cc084295cf114d28e565e3642d2a631"
	cid2 = "96e6eb4d7cc68c67434842659660d452529fbdcc7bdaafe26fc7051e88c0f715"
	cid3 = "86cffee1c7fa46ad2068c62071241866a7bc9ed15c8ced7e38282e2aad8bd1bd"
	cid4 = "568c3c7d82ac59a640d44b991b33435b23c102bac1ca4db78fd46bfc0d26d7c1"
	cid5 = "521f3a63ffa3f3a93332bf6534098ded228a5d8fd5086796480d376a8157a274"
	cid6 = "f7acff9fd18fbb202e6bd68f379cf0495bec26163ffd4bf1e20c662602cde96c"
	cid7 = "a12bf15ef51f61ea7eadcee307c88a894ed1ae26e283df7a6327257a76fcba5d"
	cid8 = "dc0a00f3ef29a8c8eacd5b79c4350b04bbc39b39bd1cdcc778aeab1222a96f87"

	uid1      = "3aa48729-63ec-4e8f-aa56-400634b5549c"
	uid2      = "d6b0eb6f-be50-4735-82eb-325d8d3ceb8e"
	uid3      = "c037d918-78f5-455c-91d2-2bda172bb38c"
	uid4      = "7e775110-45d2-4a24-b16a-dd8a4b47279d"
	uid5      = "101029af-34e5-43df-afff-c8154a004b35"
	uid6      = "eceff65d-ddfd-4266-bab0-e80c8c209c65"
	staticUID = "24ee299d2680c87f21e0bea20b3d27bd"

	// The systemd driver's slice names write a UID with underscores.
	slice1 = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod3aa48729_63ec_4e8f_aa56_400634b5549c.slice"
	slice5 = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod101029af_34e5_43df_afff_c8154a004b35.slice"
)

func TestReadCgroup(t *testing.T) {
	tests := []struct {
		pid  int
		what string
		want Cgroup
	}{
		{100, "v2, systemd, containerd, burstable",
			Cgroup{slice1 + "/cri-containerd-" + cid1 + ".scope", uid1, cid1}},
		{101, "v2, systemd, containerd, besteffort",
			Cgroup{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podd6b0eb6f_be50_4735_82eb_325d8d3ceb8e.slice/cri-containerd-" + cid2 + ".scope", uid2, cid2}},
		{102, "v2, systemd, containerd, guaranteed (no qos level)",
			Cgroup{"/kubepods.slice/kubepods-podc037d918_78f5_455c_91d2_2bda172bb38c.slice/cri-containerd-" + cid3 + ".scope", uid3, cid3}},
		{103, "v2, cgroupfs, burstable",
			Cgroup{"/kubepods/burstable/pod" + uid4 + "/" + cid4, uid4, cid4}},
		{104, "v2, cgroupfs, guaranteed",
			Cgroup{"/kubepods/pod" + uid6 + "/" + cid5, uid6, cid5}},
		{105, "v2, systemd, CRI-O",
			Cgroup{slice5 + "/crio-" + cid6 + ".scope", uid5, cid6}},
		{106, "CRI-O's conmon: the pod, but no container",
			Cgroup{slice5 + "/crio-conmon-" + cid6 + ".scope", uid5, ""}},
		{107, "v2, systemd, docker (cri-dockerd)",
			Cgroup{slice1 + "/docker-" + cid7 + ".scope", uid1, cid7}},
		{108, "v1, cgroupfs, docker: the first pod line wins over rdma at /",
			Cgroup{"/kubepods/besteffort/pod" + uid2 + "/" + cid8, uid2, cid8}},
		{109, "v1 + unified (hybrid), systemd, containerd",
			Cgroup{slice1 + "/cri-containerd-" + cid1 + ".scope", uid1, cid1}},
		{110, "v1, kind: the pod inside the node's docker container",
			Cgroup{"/docker/" + cid3 + "/kubepods/burstable/pod" + uid4 + "/" + cid4, uid4, cid4}},
		{111, "plain docker, systemd: not a pod",
			Cgroup{"/system.slice/docker-" + cid8 + ".scope", "", ""}},
		{112, "plain docker, v1 cgroupfs: not a pod, name=systemd's path",
			Cgroup{"/docker/" + cid8, "", ""}},
		{113, "host service", Cgroup{"/system.slice/containerd.service", "", ""}},
		{114, "root cgroup", Cgroup{"/", "", ""}},
		{115, "static pod: the manifest hash as UID",
			Cgroup{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + staticUID + ".slice/cri-containerd-" + cid2 + ".scope", staticUID, cid2}},
		{116, "seen from a cgroup namespace, systemd",
			Cgroup{"/../../kubepods-besteffort.slice/kubepods-besteffort-podd6b0eb6f_be50_4735_82eb_325d8d3ceb8e.slice/cri-containerd-" + cid2 + ".scope", uid2, cid2}},
		{117, "seen from a cgroup namespace, cgroupfs",
			Cgroup{"/../../pod" + uid6 + "/" + cid5, uid6, cid5}},
		{118, "a sub-cgroup of the container",
			Cgroup{slice1 + "/cri-containerd-" + cid1 + ".scope/init.scope", uid1, cid1}},
		{119, "the pod slice itself", Cgroup{slice1, uid1, ""}},
		{120, "hybrid v1+v2, not a pod: the v2 path, though name=systemd comes first",
			Cgroup{"/autoglm-churn-1", "", ""}},
	}
	for _, tt := range tests {
		got, err := ReadCgroup(procFS(t, "testdata/proc"), tt.pid)
		if err != nil {
			t.Errorf("pid %d (%s): %v", tt.pid, tt.what, err)
			continue
		}
		if got != tt.want {
			t.Errorf("pid %d (%s):\n got %+v\nwant %+v", tt.pid, tt.what, got, tt.want)
		}
	}
}

func TestReadCgroupErrors(t *testing.T) {
	tests := []struct {
		pid  int
		what string
		want string // in the error
	}{
		{200, "two fields", `cgroup of pid 200: malformed cgroup line "0:/kubepods.slice"`},
		{201, "hierarchy id not a number", `malformed cgroup line "x::/kubepods.slice`},
		{202, "relative path", `malformed line "0::kubepods.slice/`},
		{203, "empty file", "cgroup of pid 203: no cgroup lines"},
		{204, "pod slice with a cut-off UID", `malformed pod UID in "kubepods-burstable-pod3aa48729_63ec.slice"`},
	}
	for _, tt := range tests {
		got, err := ReadCgroup(procFS(t, "testdata/proc"), tt.pid)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("pid %d (%s): got %+v, %v; want an error with %q", tt.pid, tt.what, got, err, tt.want)
		}
	}
	if _, err := ReadCgroup(procFS(t, "testdata/proc"), 999); !errors.Is(err, procinfo.ErrNoProcess) {
		t.Errorf("missing pid: %v, want procinfo.ErrNoProcess", err)
	}
}

// The running test process has a cgroup file the kernel wrote; whatever it
// says, it must parse.
func TestReadCgroupSelf(t *testing.T) {
	cg, err := ReadCgroup(procFS(t, "/proc"), os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cg.Path, "/") {
		t.Fatalf("path %q", cg.Path)
	}
}

// procFS reads the proc tree under root: the fixtures' (testdata/proc) or
// the kernel's (/proc).
func procFS(t *testing.T, root string) procinfo.FS {
	t.Helper()
	fs, err := procinfo.New(root)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}
