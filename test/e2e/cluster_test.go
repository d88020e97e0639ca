//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The node's network: a bridge the run makes itself, the pods' subnet on
// it, and the service range whose first address the pods reach the API
// server at (a DNAT to its loopback port: there is no kube-proxy).
const (
	nodeName    = "autoglm-e2e"
	bridge      = "autoglm-e2e0"
	gatewayIP   = "10.244.0.1"
	podSubnet   = "10.244.0.0/24"
	serviceCIDR = "10.96.0.0/24"
	apiSvcIP    = "10.96.0.1"
	apiPort     = "6443"
	etcdClient  = "http://127.0.0.1:23790"
	etcdPeer    = "http://127.0.0.1:23800"
	nftTable    = "autoglm_e2e"
	// The sandbox image (containerd's sandbox_image) and the workload's.
	pauseImage    = "docker.io/autoglm-e2e/pause:1"
	workloadImage = "docker.io/autoglm-e2e/workload:1"
)

// cluster is one node of real Kubernetes components (etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, containerd with runc and the
// CNI bridge plugin, kubelet), all state under dir, as
// ../shared/k8s-offline.md measured. down undoes everything up did.
type cluster struct {
	t       *testing.T
	kubeBin string // the kube-* binaries
	dir     string // this run's folder; nothing else is written
	pki     *pki
	admin   string // the admin kubeconfig
	procs   []*exec.Cmd
	before  hostState
	// tracefs is mounted for the run where the host has not (systemd
	// mounts it at boot on a real node).
	mountedTracefs bool
}

// savedState is where up keeps the host's state before the run, so that a
// run that was killed is undone by the next one before it starts.
func savedState(dir string) string { return dir + ".host-before.json" }

func newCluster(t *testing.T, kubeBin, dir string) *cluster {
	c := &cluster{t: t, kubeBin: kubeBin, dir: dir}
	// A run killed before its teardown (a timeout, ^C) left its state:
	// undo it against the host state saved then.
	if data, err := os.ReadFile(savedState(dir)); err == nil {
		t.Logf("undoing what an interrupted run left in %s", dir)
		if err := json.Unmarshal(data, &c.before); err != nil {
			t.Fatal(err)
		}
		c.mountedTracefs = !slices.Contains(c.before.Mounts, "/sys/kernel/tracing")
		c.down()
	}
	return c
}

// up starts the cluster; t.Cleanup runs down, which also checks that the
// host is as before.
func (c *cluster) up(ctx context.Context) {
	t := c.t
	var err error
	if c.before, err = snapshotHost(c.dir); err != nil {
		t.Fatalf("host state: %v", err)
	}
	if len(c.before.Processes) > 0 {
		t.Fatalf("processes of a cluster already run here: %v", c.before.Processes)
	}
	data, _ := json.Marshal(c.before)
	if err := os.WriteFile(savedState(c.dir), data, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs()
		}
		c.down()
		after, err := snapshotHost(c.dir)
		if err != nil {
			t.Errorf("host state after: %v", err)
		}
		if d := c.before.diff(after); len(d) > 0 {
			t.Errorf("the run left the host changed:\n%s", strings.Join(d, "\n"))
		} else {
			os.Remove(savedState(c.dir))
		}
	})
	for _, d := range []string{"logs", "etcd", "containerd", "cni/net.d", "kubelet", "pod-logs", "kubectl-cache"} {
		if err := os.MkdirAll(filepath.Join(c.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c.hostNetwork()
	c.certificates()
	c.start("etcd", "/usr/bin/etcd", "--name=e2e", "--data-dir="+c.path("etcd"),
		"--listen-client-urls="+etcdClient, "--advertise-client-urls="+etcdClient,
		"--listen-peer-urls="+etcdPeer, "--initial-advertise-peer-urls="+etcdPeer,
		"--initial-cluster=e2e="+etcdPeer, "--unsafe-no-fsync", "--log-level=warn")
	c.waitHTTP(ctx, "etcd", etcdClient+"/health")
	p := c.pki
	c.start("kube-apiserver", c.kube("kube-apiserver"),
		"--etcd-servers="+etcdClient, "--bind-address=127.0.0.1", "--secure-port="+apiPort,
		"--advertise-address="+gatewayIP, "--service-cluster-ip-range="+serviceCIDR,
		"--authorization-mode=Node,RBAC", "--client-ca-file="+p.path("ca.crt"),
		"--tls-cert-file="+p.path("apiserver.crt"), "--tls-private-key-file="+p.path("apiserver.key"),
		"--kubelet-client-certificate="+p.path("apiserver-kubelet.crt"), "--kubelet-client-key="+p.path("apiserver-kubelet.key"),
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-key-file="+p.path("sa.key"), "--service-account-signing-key-file="+p.path("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local")
	c.waitFor(ctx, "the API server", func() error { _, err := c.kubectl(ctx, "get", "--raw=/readyz"); return err })
	c.start("kube-controller-manager", c.kube("kube-controller-manager"),
		"--kubeconfig="+c.admin, "--bind-address=127.0.0.1", "--leader-elect=false",
		"--service-account-private-key-file="+p.path("sa.key"), "--root-ca-file="+p.path("ca.crt"),
		"--controllers=*,-nodeipam,-service-lb-controller,-cloud-node-lifecycle")
	c.start("kube-scheduler", c.kube("kube-scheduler"), "--kubeconfig="+c.admin, "--bind-address=127.0.0.1", "--leader-elect=false")
	c.containerd(ctx)
	c.kubelet(ctx)
}

func (c *cluster) path(elem ...string) string {
	return filepath.Join(append([]string{c.dir}, elem...)...)
}
func (c *cluster) kube(name string) string { return filepath.Join(c.kubeBin, name) }

// start runs a component in its own process group, its output in logs/.
func (c *cluster) start(name, bin string, args ...string) {
	log, err := os.Create(c.path("logs", name+".log"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("%s: %v", name, err)
	}
	c.procs = append(c.procs, cmd)
}

// waitFor polls ready until it succeeds; on timeout it fails the test with
// the last error.
func (c *cluster) waitFor(ctx context.Context, what string, ready func() error) {
	c.t.Helper()
	if err := poll(ctx, 2*time.Minute, ready); err != nil {
		c.t.Fatalf("%s: %v (logs in %s)", what, err, c.path("logs"))
	}
}

// poll calls f every half second until it returns nil or within passes.
func poll(ctx context.Context, within time.Duration, f func() error) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %v: %w", within, err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (c *cluster) waitHTTP(ctx context.Context, what, url string) {
	c.waitFor(ctx, what, func() error {
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	})
}

// kubectl runs the cluster's kubectl as admin and returns its stdout.
func (c *cluster) kubectl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.kube("kubectl"), append([]string{"--kubeconfig=" + c.admin, "--cache-dir=" + c.path("kubectl-cache")}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// mustKubectl is kubectl failing the test on an error.
func (c *cluster) mustKubectl(ctx context.Context, args ...string) string {
	c.t.Helper()
	out, err := c.kubectl(ctx, args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

func (c *cluster) certificates() {
	var err error
	if c.pki, err = newPKI(c.path("pki")); err != nil {
		c.t.Fatal(err)
	}
	p := c.pki
	errs := []error{
		p.issue("apiserver", "kube-apiserver", "", "127.0.0.1", apiSvcIP, gatewayIP, "localhost",
			"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"),
		p.issue("admin", "e2e-admin", "system:masters"),
		p.issue("apiserver-kubelet", "kube-apiserver-kubelet-client", "system:masters"),
		p.issue("kubelet", "system:node:"+nodeName, "system:nodes", gatewayIP, nodeName),
		p.serviceAccountKey(),
	}
	if err := errors.Join(errs...); err != nil {
		c.t.Fatal(err)
	}
	server := "https://127.0.0.1:" + apiPort
	if c.admin, err = p.kubeconfig("admin", server); err != nil {
		c.t.Fatal(err)
	}
	if _, err = p.kubeconfig("kubelet", server); err != nil {
		c.t.Fatal(err)
	}
}

// hostNetwork makes the bridge the CNI plugin will use (so that its
// route_localnet can be set before the first pod), the DNAT from the API
// server's service address to its loopback port, and mounts tracefs where
// the host has not.
func (c *cluster) hostNetwork() {
	run := func(name string, args ...string) {
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			c.t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
	}
	run("ip", "link", "add", bridge, "type", "bridge")
	run("ip", "addr", "add", gatewayIP+"/24", "dev", bridge)
	run("ip", "link", "set", bridge, "up")
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+bridge+"/route_localnet", []byte("1"), 0o644); err != nil {
		c.t.Fatal(err)
	}
	rules := fmt.Sprintf(`table ip %s {
	chain prerouting {
		type nat hook prerouting priority dstnat;
		iifname %q ip daddr %s tcp dport 443 dnat to 127.0.0.1:%s
	}
}
`, nftTable, bridge, apiSvcIP, apiPort)
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("nft: %v: %s", err, out)
	}
	if !slices.Contains(c.before.Mounts, "/sys/kernel/tracing") {
		run("mount", "-t", "tracefs", "tracefs", "/sys/kernel/tracing")
		c.mountedTracefs = true
	}
}

func (c *cluster) containerd(ctx context.Context) {
	conf := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  # root here has no CAP_SYS_RESOURCE: without this runc cannot write
  # oom_score_adj and no sandbox starts.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[6]q
`, c.path("containerd", "root"), c.path("containerd", "state"), c.sock(), c.sock()+".ttrpc", pauseImage, c.path("cni", "net.d"))
	cni := fmt.Sprintf(`{"cniVersion": "0.4.0", "name": "autoglm-e2e", "plugins": [{
  "type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
  "ipam": {"type": "host-local", "ranges": [[{"subnet": %q, "gateway": %q}]],
           "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}}]}
`, bridge, podSubnet, gatewayIP, c.path("cni", "ipam"))
	errs := []error{
		os.WriteFile(c.path("containerd", "config.toml"), []byte(conf), 0o644),
		os.WriteFile(c.path("cni", "net.d", "10-autoglm-e2e.conflist"), []byte(cni), 0o644),
	}
	if err := errors.Join(errs...); err != nil {
		c.t.Fatal(err)
	}
	c.start("containerd", "/usr/bin/containerd", "--config", c.path("containerd", "config.toml"))
	c.waitFor(ctx, "containerd", func() error { _, err := c.ctr(ctx, "version"); return err })
}

func (c *cluster) sock() string { return c.path("containerd", "containerd.sock") }

// ctr runs containerd's client in the namespace the kubelet uses.
func (c *cluster) ctr(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", c.sock(), "-n", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// importImage loads an image archive (OCI layout or docker save) into the
// kubelet's containerd namespace.
func (c *cluster) importImage(ctx context.Context, archive string) {
	if _, err := c.ctr(ctx, "images", "import", archive); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) kubelet(ctx context.Context) {
	p := c.pki
	conf := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[2]q}
authorization: {mode: Webhook}
tlsCertFile: %[3]q
tlsPrivateKeyFile: %[4]q
containerRuntimeEndpoint: unix://%[5]s
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
podLogsDir: %[6]q
resolvConf: ""
# A disk or memory nearly full on the machine running the test must not
# evict the pods under test.
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`, gatewayIP, p.path("ca.crt"), p.path("kubelet.crt"), p.path("kubelet.key"), c.sock(), c.path("pod-logs"))
	if err := os.WriteFile(c.path("kubelet.yaml"), []byte(conf), 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.start("kubelet", c.kube("kubelet"), "--config="+c.path("kubelet.yaml"),
		"--kubeconfig="+p.path("kubelet.kubeconfig"), "--root-dir="+c.path("kubelet"),
		"--hostname-override="+nodeName, "--node-ip="+gatewayIP,
		// The agent's DaemonSet runs on GPU nodes only (GPU Feature
		// Discovery's label).
		"--node-labels=nvidia.com/gpu.present=true")
	c.waitFor(ctx, "the node Ready", func() error {
		out, err := c.kubectl(ctx, "get", "node", nodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil {
			return err
		}
		if out != "True" {
			return fmt.Errorf("Ready=%q", out)
		}
		return nil
	})
}

// down stops every process, unmounts and removes what the run made outside
// its folder, and restores the sysctls. It does its best and goes on
// after an error: the host check after it says what is left.
func (c *cluster) down() {
	logf := c.t.Logf
	// Pods first (their processes are in kubepods cgroups), then the
	// components, last started first.
	killAll := func() {
		for _, pid := range clusterProcesses(c.dir) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		syscall.Kill(-c.procs[i].Process.Pid, syscall.SIGKILL)
		c.procs[i].Wait()
	}
	c.procs = nil
	for range 20 {
		killAll()
		if len(clusterProcesses(c.dir)) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond) // teardown: killed processes being reaped, retried at most 20 times
	}
	// Mounts: the kubelet's (it bind-mounts its root over itself, and the
	// pods' volumes), containerd's (rootfs, shm) and the pods' network
	// namespaces; deepest first, detached if busy.
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	var mounts []string
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (strings.HasPrefix(f[4], c.dir+"/") || strings.HasPrefix(f[4], "/run/netns/") ||
			strings.HasPrefix(f[4], "/run/containerd/")) && !slices.Contains(c.before.Mounts, f[4]) {
			mounts = append(mounts, f[4])
		}
	}
	if c.mountedTracefs {
		mounts = append(mounts, "/sys/kernel/tracing")
		c.mountedTracefs = false
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, m := range mounts {
		if err := syscall.Unmount(m, 0); err != nil {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
				logf("unmount %s: %v", m, err)
			}
		}
	}
	// The cgroups the kubelet made, in every hierarchy, deepest first. A
	// killed process keeps its cgroup busy until it is reaped, which is
	// init's to do for those whose shim went first: retry a while.
	var busy []error
	for try := 0; try < 50; try++ {
		busy = nil
		for _, top := range c.newCgroups() {
			var dirs []string
			filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				if err := os.Remove(dirs[i]); err != nil {
					busy = append(busy, err)
				}
			}
		}
		if len(busy) == 0 {
			break
		}
		killAll()
		time.Sleep(200 * time.Millisecond)
	}
	for _, err := range busy {
		logf("cgroup: %v", err)
	}
	exec.Command("ip", "link", "del", bridge).Run()
	// The pods' veth ends go with their network namespaces, which the
	// kernel tears down after the last process and mount let go.
	poll(context.Background(), 10*time.Second, func() error {
		if now, _ := snapshotHost(c.dir); !slices.Equal(now.Links, c.before.Links) {
			return errors.New("interfaces still going")
		}
		return nil
	})
	exec.Command("nft", "delete", "table", "ip", nftTable).Run()
	for _, k := range touchedSysctls {
		if v, ok := c.before.Sysctls[k]; ok {
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				logf("sysctl %s: %v", k, err)
			}
		}
	}
	// What the kubelet, containerd and the CNI plugins make in fixed
	// places (device-plugins, /var/log/containers, /run/containerd,
	// /run/netns, /var/lib/cni results, ...): whatever is new in the
	// watched folders.
	now, _ := snapshotHost(c.dir)
	for _, p := range now.Paths {
		if !slices.Contains(c.before.Paths, p) {
			if err := os.RemoveAll(p); err != nil {
				logf("remove %s: %v", p, err)
			}
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		logf("remove %s: %v", c.dir, err)
	}
}

// newCgroups are the cgroups at the top of a hierarchy that were not there
// before the run (kubepods, in each).
func (c *cluster) newCgroups() []string {
	var made []string
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hier {
		ents, _ := os.ReadDir(h)
		for _, e := range ents {
			p := filepath.Join(h, e.Name())
			if e.IsDir() && !slices.Contains(c.before.Cgroups, p) {
				made = append(made, p)
			}
		}
	}
	return made
}

// dumpLogs prints, for a failed run, the end of each component's log and
// of the pods' (the run's folder goes with the teardown).
func (c *cluster) dumpLogs() {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if out, err := c.kubectl(ctx, "get", "pods", "-A", "-o", "wide"); err == nil {
		c.t.Logf("pods:\n%s", out)
	}
	logs, _ := filepath.Glob(c.path("logs", "*.log"))
	pods, _ := filepath.Glob(c.path("pod-logs", "*", "*", "*.log"))
	for _, f := range append(logs, pods...) {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		c.t.Logf("%s (last %d lines):\n%s", f, min(len(lines), 40), strings.Join(lines[max(0, len(lines)-40):], "\n"))
	}
}
