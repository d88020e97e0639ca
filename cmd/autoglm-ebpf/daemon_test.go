package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"
	"golang.org/x/crypto/bcrypt"

	"github.com/open-autoglm/autoglm-ebpf/pkg/gpunode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracked"
)

// daemonProc is a running `autoglm-ebpf daemon` on a loopback port.
type daemonProc struct {
	cmd  *exec.Cmd
	addr string
	out  *strings.Builder // stdout: the findings log
}

// startDaemon starts the daemon with args and waits until /readyz answers.
func startDaemon(t testing.TB, args ...string) *daemonProc {
	t.Helper()
	d := launchDaemon(t, args...)
	testutil.Eventually(t, 20*time.Second, "daemon ready", func() bool {
		code, _ := get(d.addr, "/readyz")
		return code == http.StatusOK
	})
	return d
}

// launchDaemon starts a daemon without waiting for it to be ready.
func launchDaemon(t testing.TB, args ...string) *daemonProc {
	t.Helper()
	d := &daemonProc{addr: testutil.FreeAddr(t), out: &strings.Builder{}}
	d.cmd = exec.Command(binary, append([]string{"daemon", "--web.listen-address", d.addr}, args...)...)
	d.cmd.Stdout = d.out
	d.cmd.Stderr = os.Stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.cmd.Process.Kill(); _ = d.cmd.Wait() })
	return d
}

// stop sends SIGTERM and returns the exit code.
func (d *daemonProc) stop(t testing.TB) int {
	t.Helper()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	err := d.cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0
}

// scrape parses the daemon's /metrics.
func (d *daemonProc) scrape(t testing.TB) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := get(d.addr, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(pmodel.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// scrapeHas reports whether any series on /metrics names pid.
func (d *daemonProc) scrapeHas(t testing.TB, pid int) bool {
	return hasPID(d.scrape(t), pid)
}

// series returns the samples of name whose labels include want.
func series(fams map[string]*dto.MetricFamily, name string, want map[string]string) []*dto.Metric {
	var out []*dto.Metric
	f := fams[name]
	if f == nil {
		return nil
	}
next:
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		out = append(out, m)
	}
	return out
}

// hasPID reports whether any series names pid.
func hasPID(fams map[string]*dto.MetricFamily, pid int) bool {
	for name := range fams {
		if len(series(fams, name, map[string]string{"pid": strconv.Itoa(pid)})) > 0 {
			return true
		}
	}
	return false
}

func get(addr, path string) (int, string) {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// testCgroup makes the cgroup rel (a path like kubepods/besteffort/pod<uid>/
// <container id>, as the kubelet's cgroupfs driver names them) in the cgroup
// v2 hierarchy, the one a process's cgroup path is read from (on a hybrid
// machine, /sys/fs/cgroup/unified), and returns its directory. It is removed
// when the test ends, after the processes in it are gone.
func testCgroup(t *testing.T, rel string) string {
	t.Helper()
	var root string
	for _, r := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(r, "cgroup.controllers")); err == nil {
			root = r
			break
		}
	}
	if root == "" {
		t.Fatal("no cgroup v2 hierarchy mounted")
	}
	dir := filepath.Join(root, rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The processes in it are being reaped.
		testutil.Eventually(t, 20*time.Second, "cgroup "+dir+" to be removed", func() bool {
			err := os.Remove(dir)
			return err == nil || errors.Is(err, os.ErrNotExist)
		})
		// Its parents may hold other tests' cgroups: removed if empty.
		for d := filepath.Dir(dir); d != root; d = filepath.Dir(d) {
			_ = os.Remove(d)
		}
	})
	return dir
}

// inCgroup returns the arguments of a shell that moves itself into dir and
// execs the arguments appended to it, so that the program starts inside the
// container's cgroup.
func inCgroup(dir string) []string {
	return []string{"-c", fmt.Sprintf(`echo $$ > %s/cgroup.procs && exec "$@"`, dir), "sh"}
}

// The daemon runs first; CUDA processes (the stand-in runtime, loaded late
// with dlopen) start inside a kubelet-style cgroup and are watched within an
// interval of loading it: their container's series (by cgroup, as no API
// server names the pod) sum their live bytes, and the process whose
// allocation failed has series of its own and a finding with its pid and
// call site; the series are gone after they exit; SIGTERM exits 0 and
// leaves no BPF program loaded.
func TestDaemonWatchesPodProcesses(t *testing.T) {
	testutil.RequireRoot(t)
	before := progCount(t)
	rt := testutil.CUDAStubs(t)
	bin := testutil.Fixture(t, "cudawork")
	const uid = "3f0e9b7c-1a2b-4c3d-8e9f-0123456789ab"
	cid := strings.Repeat("0123456789abcdef", 4)
	dir := testCgroup(t, filepath.Join("kubepods", "besteffort", "pod"+uid, cid))

	d := startDaemon(t, "--findings-log", "--resync", "1h")
	env := []string{"CUDA_STUB_LIMIT=1073741824"}
	holder := testutil.StartProc(t, env, "/bin/sh", append(inCgroup(dir), bin, rt, "leak", "120")...)
	failer := testutil.StartProc(t, env, "/bin/sh", append(inCgroup(dir), bin, rt, "fail", "120")...)
	failer.Wait(t, "loaded", 20*time.Second)
	unit := map[string]string{"cgroup": "/" + filepath.Join("kubepods", "besteffort", "pod"+uid, cid), "comm": "cudawork"}

	// Watched (and so hooked) within an interval or two of the dlopen.
	testutil.Eventually(t, 20*time.Second, "both processes in their container's series", func() bool {
		s := series(d.scrape(t), "autoglm_container_processes", unit)
		return len(s) == 1 && s[0].GetGauge().GetValue() == 2
	})
	failer.Signal(t)
	failer.Wait(t, "done", 10*time.Second)
	failerPID := strconv.Itoa(failer.Cmd.Process.Pid)
	testutil.Eventually(t, 30*time.Second, "the container's live bytes, the failure finding and its process's own series", func() bool {
		fams := d.scrape(t)
		live := series(fams, "autoglm_container_cuda_live_bytes", unit)
		found := series(fams, "autoglm_finding", map[string]string{"pid": failerPID, "comm": "cudawork", "kind": "gpu_alloc_failure", "site": "load_checkpoint"})
		own := series(fams, "autoglm_open_fds", map[string]string{"pid": failerPID})
		return len(live) == 1 && live[0].GetGauge().GetValue() > 0 && len(found) == 1 && found[0].GetGauge().GetValue() > 0 && len(own) == 1
	})
	if fams := d.scrape(t); len(series(fams, "autoglm_watched_processes", nil)) != 1 {
		t.Error("no autoglm_watched_processes")
	}

	for _, p := range []*testutil.Proc{holder, failer} {
		_ = p.Cmd.Process.Kill()
		_ = p.Cmd.Wait()
	}
	testutil.Eventually(t, 20*time.Second, "the exited processes' series to go", func() bool {
		fams := d.scrape(t)
		return !hasPID(fams, holder.Cmd.Process.Pid) && !hasPID(fams, failer.Cmd.Process.Pid) &&
			len(series(fams, "autoglm_container_processes", unit)) == 0
	})
	if code := d.stop(t); code != 0 {
		t.Fatalf("daemon exited %d after SIGTERM", code)
	}
	// The kernel frees programs of an exited process after RCU grace
	// periods, not at once.
	testutil.Eventually(t, 20*time.Second, fmt.Sprintf("the BPF program count back to %d", before), func() bool { return progCount(t) == before })
	// The findings log has the failure as a JSON line naming the pod.
	sc := bufio.NewScanner(strings.NewReader(d.out.String()))
	logged := false
	for sc.Scan() {
		line := sc.Text()
		logged = logged || (strings.Contains(line, `"kind":"gpu_alloc_failure"`) && strings.Contains(line, `"pod_uid":"`+uid+`"`) &&
			strings.Contains(line, `"event":"active"`))
	}
	if !logged {
		t.Errorf("findings log lacks the failure:\n%s", d.out)
	}
}

// Bad input is a usage error; a port in use is a clear runtime error.
func TestDaemonBadInput(t *testing.T) {
	for _, args := range [][]string{
		{"daemon", "--match-comm", "("},
		{"daemon", "--match-cgroup", "kubepods[x"},
		{"daemon", "--max-processes", "0"},
		{"daemon", "--log-format", "xml"},
		{"daemon", "--require-views", "fd,gpu"},
	} {
		out, code := cli(t, nil, args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d; output %q", args, code, exitUsage, out)
		}
	}
	// A cap over what the kernel maps hold names both numbers.
	over := strconv.Itoa(tracked.Capacity + 1)
	out, code := cli(t, nil, "daemon", "--max-processes", over)
	if code != exitUsage || !strings.Contains(out, over) || !strings.Contains(out, strconv.Itoa(tracked.Capacity)) {
		t.Errorf("--max-processes %s: exit %d, output %q", over, code, out)
	}
	testutil.RequireRoot(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	out, code = cli(t, nil, "daemon", "--listen", ln.Addr().String())
	if code != exitRuntime || !strings.Contains(out, "address already in use") {
		t.Errorf("port in use: exit %d, output %q", code, out)
	}
}

// A view that cannot load shows as autoglm_view_up 0, and /readyz answers
// 503 naming it while it is required (the default: fd and cuda), 200 once
// it is not. The cuda view is made to fail for real: a live allocation
// table of 4e9 entries is refused by the kernel (E2BIG). On a machine
// without an NVIDIA GPU the cuda view is not expected: it is absent
// instead, with autoglm_view_absent and no autoglm_view_up, and /readyz
// says so.
func TestDaemonViewDown(t *testing.T) {
	testutil.RequireRoot(t)
	noGPU := len(gpunode.Find("/proc").Node) == 0
	for _, tc := range []struct {
		require string
		ready   bool
	}{{"fd,cuda", false}, {"fd", true}} {
		d := launchDaemon(t, "--max-allocs", "4000000000", "--require-views", tc.require)
		testutil.Eventually(t, 20*time.Second, "the first poll", func() bool {
			code, body := get(d.addr, "/metrics")
			return code == http.StatusOK && strings.Contains(body, "autoglm_view_up{")
		})
		mf := d.scrape(t)
		for view, want := range map[string]float64{"fd": 1, "sched": 1, "sock": 1, "cuda": 0, "python": 1} {
			s := series(mf, "autoglm_view_up", map[string]string{"view": view})
			if view == "cuda" && noGPU {
				if len(s) != 0 {
					t.Errorf("--require-views %s: autoglm_view_up{view=\"cuda\"} = %v on a node without GPUs, want none (absent)", tc.require, s)
				}
				continue
			}
			if len(s) != 1 || s[0].GetGauge().GetValue() != want {
				t.Errorf("--require-views %s: autoglm_view_up{view=%q} = %v, want %v", tc.require, view, s, want)
			}
		}
		absent := series(mf, "autoglm_view_absent", map[string]string{"view": "cuda", "reason": "no_gpu"})
		if noGPU != (len(absent) == 1 && absent[0].GetGauge().GetValue() == 1) {
			t.Errorf("--require-views %s, no GPU %v: autoglm_view_absent{view=\"cuda\"} = %v", tc.require, noGPU, absent)
		}
		// The kernel memory of each loaded view; none for the one refused.
		for _, view := range []string{"fd", "sched", "sock", "tracked", "stacks"} {
			if s := series(mf, "autoglm_bpf_memory_bytes", map[string]string{"view": view}); len(s) != 1 || s[0].GetGauge().GetValue() <= 0 {
				t.Errorf("autoglm_bpf_memory_bytes{view=%q} = %v", view, s)
			}
		}
		if s := series(mf, "autoglm_bpf_memory_bytes", map[string]string{"view": "cuda"}); len(s) != 0 {
			t.Errorf("autoglm_bpf_memory_bytes of the view that did not load: %v", s)
		}
		code, body := get(d.addr, "/readyz")
		if tc.ready && code != http.StatusOK {
			t.Errorf("--require-views %s: /readyz %d %q, want 200", tc.require, code, body)
		}
		why := "required views down: cuda: loading cuda BPF programs"
		if noGPU {
			why = "required views absent, not expected on this node (leave them out of --require-views on such nodes): cuda: no NVIDIA GPU on this node (loading cuda BPF programs"
		}
		if !tc.ready && (code != http.StatusServiceUnavailable || !strings.Contains(body, why)) {
			t.Errorf("--require-views %s: /readyz %d %q, want 503 with %q", tc.require, code, body, why)
		}
		if code, _ := get(d.addr, "/healthz"); code != http.StatusOK {
			t.Errorf("--require-views %s: /healthz %d: the loop runs", tc.require, code)
		}
	}
}

// daemonMaps sums, by map name, the entries of the per-process maps (hash
// and stack maps) that the daemon process holds: found from its fds, so
// other BPF users on the machine do not count.
func daemonMaps(t *testing.T, pid int) map[string]int {
	t.Helper()
	fdinfo := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(fdinfo)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	seen := map[string]bool{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(fdinfo, e.Name()))
		if err != nil {
			continue
		}
		var typ, id string
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "map_type:"); ok {
				typ = strings.TrimSpace(v)
			}
			if v, ok := strings.CutPrefix(line, "map_id:"); ok {
				id = strings.TrimSpace(v)
			}
		}
		// BPF_MAP_TYPE_HASH, PERCPU_HASH, STACK_TRACE, LRU_HASH
		if id == "" || seen[id] || (typ != "1" && typ != "5" && typ != "7" && typ != "9") {
			continue
		}
		seen[id] = true
		js, err := exec.Command("bpftool", "-j", "map", "dump", "id", id).Output()
		if err != nil {
			continue // closed meanwhile
		}
		var entries []json.RawMessage
		if err := json.Unmarshal(js, &entries); err != nil {
			t.Fatalf("bpftool map dump id %s: %v", id, err)
		}
		info, _ := exec.Command("bpftool", "-j", "map", "show", "id", id).Output()
		var m struct{ Name string }
		_ = json.Unmarshal(info, &m)
		out[m.Name] += len(entries)
	}
	return out
}

func rssKiB(t testing.TB, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// Thousands of short-lived processes and dozens of short-lived CUDA
// processes pass by a daemon watching every process of one cgroup: when they
// are gone, the daemon watches nothing, its kernel maps hold what they held
// before, and its memory is back near where it was.
func TestDaemonChurn(t *testing.T) {
	testutil.RequireRoot(t)
	rt := testutil.CUDAStubs(t)
	bin := testutil.Fixture(t, "cudawork")
	dir := testCgroup(t, "autoglm-churn-"+strconv.Itoa(os.Getpid()))
	d := startDaemon(t, "--all", "--match-cgroup", "*autoglm-churn*", "--interval", "200ms", "--resync", "2s")
	pid := d.cmd.Process.Pid
	watched := func() float64 {
		s := series(d.scrape(t), "autoglm_watched_processes", nil)
		if len(s) != 1 {
			t.Fatal("no autoglm_watched_processes")
		}
		return s[0].GetGauge().GetValue()
	}
	// Measurement window: the baseline is taken once the daemon has run a
	// resync (--resync 2s) and its polls, its memory grown to its steady
	// size; there is no signal of that to wait on.
	time.Sleep(2 * time.Second)
	baseMaps, baseRSS := daemonMaps(t, pid), rssKiB(t, pid)

	// 2000 processes too short to be watched, 200 that live 300 ms (a
	// few polls), 24 CUDA processes that load the runtime and allocate.
	script := fmt.Sprintf(`echo $$ > %s/cgroup.procs
for i in $(seq 2000); do /bin/true; done
for b in $(seq 10); do
	for i in $(seq 20); do sleep 0.3 & done
	wait
done
for b in $(seq 6); do
	for i in $(seq 4); do %s %s steady 1 >/dev/null & done
	wait
done`, dir, bin, rt)
	churn := exec.Command("/bin/sh", "-c", script)
	churn.Stderr = os.Stderr
	var peakWatched float64
	if err := churn.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- churn.Wait() }()
	for running := true; running; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			running = false
		case <-time.After(300 * time.Millisecond):
			// Sampling during the churn, not waiting: the peak is measured.
			peakWatched = max(peakWatched, watched())
		}
	}
	if peakWatched < 4 {
		t.Errorf("at most %v processes watched during the churn: the short-lived ones were not seen", peakWatched)
	}
	testutil.Eventually(t, 20*time.Second, fmt.Sprintf("no process watched and the maps back to %v after the churn", baseMaps), func() bool {
		if watched() != 0 {
			return false
		}
		for name, n := range daemonMaps(t, pid) {
			if n != baseMaps[name] {
				return false
			}
		}
		return true
	})
	rss := rssKiB(t, pid)
	t.Logf("daemon RSS %d KiB before the churn, %d KiB after (%d processes watched at the peak); maps %v", baseRSS, rss, int(peakWatched), baseMaps)
	// Go returns freed heap to the kernel lazily: allow a little.
	if rss > baseRSS+16*1024 {
		t.Errorf("daemon RSS grew from %d KiB to %d KiB over the churn", baseRSS, rss)
	}
	if fams := d.scrape(t); len(series(fams, "autoglm_bpf_events_lost_total", map[string]string{"source": "discover_ringbuf"})) != 1 {
		t.Error("discovery losses not exported")
	}
}

// More matching processes than --max-processes: as many as the cap are
// watched, each of the others is counted once as over the cap (never a
// silent track failure), and a slot freed by an exit is taken by one of
// them.
func TestDaemonOverCap(t *testing.T) {
	testutil.RequireRoot(t)
	const procs, max = 20, 8
	dir := testCgroup(t, "autoglm-cap-"+strconv.Itoa(os.Getpid()))
	d := startDaemon(t, "--all", "--match-cgroup", "*autoglm-cap*", "--max-processes", strconv.Itoa(max), "--interval", "200ms", "--resync", "1s")
	var sleepers []*exec.Cmd
	for range procs {
		c := exec.Command("/bin/sh", append(inCgroup(dir), "sleep", "600")...)
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		sleepers = append(sleepers, c)
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	}
	gauge := func(fams map[string]*dto.MetricFamily, name string) float64 {
		var v float64
		for _, m := range series(fams, name, nil) {
			v += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
		return v
	}
	state := func() (watched, over, failed float64) {
		fams := d.scrape(t)
		return gauge(fams, "autoglm_watched_processes"), gauge(fams, "autoglm_processes_over_cap_total"), gauge(fams, "autoglm_track_failures_total")
	}
	// The limits are generous: 20 processes found, tracked and refused at
	// 200 ms polls take a second here, but far longer on a loaded machine.
	testutil.Eventually(t, 60*time.Second, fmt.Sprintf("%d of %d processes watched, %d counted over the cap", max, procs, procs-max), func() bool {
		w, o, _ := state()
		return w == max && o == procs-max
	})
	// Five exit: the cap's slots they held, if any, go to those waiting.
	for _, c := range sleepers[:5] {
		_ = c.Process.Kill()
		_ = c.Wait()
	}
	testutil.Eventually(t, 60*time.Second, fmt.Sprintf("%d watched again after 5 exits", max), func() bool {
		w, _, _ := state()
		return w == max
	})
	if w, o, f := state(); o != procs-max || f != 0 {
		t.Errorf("watched %v, over the cap %v (want %d: each counted once), track failures %v (want 0)", w, o, procs-max, f)
	}
}

// The exporter conventions: /metrics negotiates its format as client_golang
// does, and --web.config.file turns on basic auth (and TLS) as node_exporter
// does. Killed with SIGKILL and started again, the daemon comes back with
// nothing doubled, and nothing stays loaded once it is gone.
func TestDaemonExporterConventionsAndRestart(t *testing.T) {
	testutil.RequireRoot(t)
	before := progCount(t)
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	webConfig := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(webConfig, []byte("basic_auth_users:\n  prom: "+string(hash)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := &daemonProc{addr: testutil.FreeAddr(t), out: &strings.Builder{}}
	d.cmd = exec.Command(binary, "daemon", "--listen", d.addr, "--web.config.file", webConfig)
	d.cmd.Stderr = os.Stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.cmd.Process.Kill(); _ = d.cmd.Wait() })
	fetch := func(user, pass, accept string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+d.addr+"/metrics", nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Content-Type")
	}
	testutil.Eventually(t, 20*time.Second, "the daemon to serve", func() bool { code, _ := fetch("prom", "s3cret", ""); return code == http.StatusOK })
	if code, _ := fetch("", "", ""); code != http.StatusUnauthorized {
		t.Errorf("no credentials: %d, want 401", code)
	}
	if code, _ := fetch("prom", "wrong", ""); code != http.StatusUnauthorized {
		t.Errorf("wrong password: %d, want 401", code)
	}
	for accept, want := range map[string]string{
		"":                             "text/plain",
		"application/openmetrics-text": "application/openmetrics-text",
		"application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited": "application/vnd.google.protobuf",
	} {
		if code, ct := fetch("prom", "s3cret", accept); code != http.StatusOK || !strings.HasPrefix(ct, want) {
			t.Errorf("Accept %q: %d %q, want %s", accept, code, ct, want)
		}
	}

	// SIGKILL: no clean-up code runs; the kernel drops what the process held.
	_ = d.cmd.Process.Kill()
	_ = d.cmd.Wait()
	again := startDaemon(t)
	fams := again.scrape(t)
	if n := len(series(fams, "autoglm_build_info", nil)); n != 1 {
		t.Errorf("%d build_info series after a restart", n)
	}
	if code := again.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	testutil.Eventually(t, 20*time.Second, fmt.Sprintf("the BPF program count back to %d", before), func() bool { return progCount(t) == before })
}
