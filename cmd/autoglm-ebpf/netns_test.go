package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// daemonSetBounding is the capability bounding set of the shipped
// DaemonSet's agent, for setpriv: every capability dropped, those the
// manifest adds back.
func daemonSetBounding(t *testing.T) string {
	t.Helper()
	return boundingSet(daemonSetCaps(t))
}

// boundingSet is setpriv's --bounding-set for exactly caps (setpriv's
// names: lower case, no CAP_).
func boundingSet(caps []string) string {
	set := "-all"
	for _, c := range caps {
		set += ",+" + c
	}
	return set
}

// daemonSetCaps are the capabilities the shipped DaemonSet adds after
// dropping ALL, in its order, as setpriv names them.
func daemonSetCaps(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testutil.RepoRoot(), "deploy", "kubernetes", "base", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal(b, &ds); err != nil {
		t.Fatal(err)
	}
	sc := ds.Spec.Template.Spec.Containers[0].SecurityContext
	if sc == nil || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Fatalf("the DaemonSet does not drop ALL capabilities: %+v", sc)
	}
	var caps []string
	for _, c := range sc.Capabilities.Add {
		caps = append(caps, strings.ToLower(string(c)))
	}
	return caps
}

// A process in a network namespace of its own (a pod's) is watched by every
// view under exactly the DaemonSet's capabilities: without CAP_SYS_ADMIN the
// socket view cannot join the namespace for sock_diag and reads its TCP
// sockets from /proc/PID/net, and no view gives the process up.
func TestOtherNetnsUnderDaemonSetCaps(t *testing.T) {
	testutil.RequireRoot(t)
	bounding := daemonSetBounding(t)
	bin := testutil.Fixture(t, "sockwork")
	w := exec.Command("unshare", "--net", "sh", "-c", `ip link set lo up && exec "$0" leaky-server 10 60`, bin)
	w.Stderr = os.Stderr
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.Process.Kill()
		_ = w.Wait()
	})
	pid := w.Process.Pid
	testutil.Eventually(t, 20*time.Second, "sockwork to start in its network namespace", func() bool {
		comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		return strings.TrimSpace(string(comm)) == "sockwork"
	})
	self, _ := os.Readlink("/proc/self/ns/net")
	if ns, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", "net")); err != nil || ns == self {
		t.Fatalf("the workload's network namespace is %q (%v), ours %q", ns, err, self)
	}
	path := filepath.Join(t.TempDir(), "report.json")
	cmd := exec.Command("setpriv", "--bounding-set="+bounding, "--", binary, "attach", "--pid", strconv.Itoa(pid), "--duration", "15s", "--json", path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("attach under %s: %v\n%s", bounding, err, out)
	}
	if strings.Contains(string(out), "cannot follow") {
		t.Errorf("a view gave the process up:\n%s", out)
	}
	r := readReport(t, path)
	if len(r.Processes) != 1 || r.Processes[0].OpenFDs == 0 || r.Processes[0].TCPSocketsByState["CLOSE_WAIT"] == 0 {
		t.Fatalf("process not watched by the fd and socket views: %+v\n%s", r.Processes, out)
	}
	found := false
	for _, f := range r.Findings {
		found = found || (f.Kind == model.KindSocketLeak && f.PID == pid && strings.Contains(f.Summary, "opened at accept_conn"))
	}
	if !found {
		t.Errorf("no socket leak named at accept_conn: %+v\n%s", r.Findings, out)
	}
}
