package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/report"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

var binary string

func TestMain(m *testing.M) {
	if spec := os.Getenv(procReadEnv); spec != "" {
		os.Exit(procReadMain(spec))
	}
	dir, err := os.MkdirTemp("", "autoglm-cli")
	if err != nil {
		panic(err)
	}
	// Readable by the unprivileged user of TestNoPrivileges.
	if err := os.Chmod(dir, 0o755); err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "autoglm-ebpf")
	if out, err := exec.Command("go", "build", "-buildvcs=auto", "-o", binary, ".").CombinedOutput(); err != nil {
		panic(string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cli runs the built binary and returns its combined output and exit code.
func cli(t *testing.T, cred *syscall.Credential, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(out), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(out), 0
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"attach"}, exitUsage, "--pid is required"},
		{[]string{"attach", "--pid", "abc"}, exitUsage, `invalid pid "abc": not a number`},
		{[]string{"attach", "--pid", "0"}, exitUsage, "positive"},
		{[]string{"attach", "--pid=-5"}, exitUsage, "invalid pid"},
		{[]string{"attach", "--pid", "1,,2"}, exitUsage, "empty item"},
		{[]string{"attach", "--pid", "1", "--bogus"}, exitUsage, "unknown flag"},
		{[]string{"attach", "--pid", "1", "--fail-on", "nope"}, exitUsage, `unknown kind "nope"`},
		{[]string{"attach", "--pid", "1", "--interval", "0s"}, exitUsage, "--interval must be positive"},
		// Output paths are checked before anything is attached: an hour's
		// run must not end in a report that cannot be written.
		{[]string{"attach", "--pid", "1", "--json", "/no/such/dir/r.json", "--duration", "1h"}, exitUsage, "--json /no/such/dir/r.json: cannot create a file in /no/such/dir: no such file or directory"},
		{[]string{"run", "--html", "/tmp", "--", "true"}, exitUsage, "--html /tmp: is a directory"},
		{[]string{"attach", "--pid", "1", "--listen", "nohostport"}, exitUsage, `--web.listen-address "nohostport"`},
		{[]string{"attach", "--pid", "1", "--web.listen-address", "nohostport"}, exitUsage, `--web.listen-address "nohostport"`},
		{[]string{"attach", "--pid", "1", "--web.config.file", "web.yml"}, exitUsage, "--web.config.file needs --web.listen-address"},
		{[]string{"run", "--web.expose-profiles", "--", "true"}, exitUsage, "--web.expose-profiles needs --web.listen-address"},
		{[]string{"attach", "--pid", "1", "--log.level", "loud"}, exitUsage, "--log.level must be debug, info, warn or error"},
		{[]string{"attach", "--pid", "1", "--log.format", "xml"}, exitUsage, "--log.format must be logfmt or json"},
		// pflag takes a bare boolean flag as true and leaves the value.
		{[]string{"daemon", "--runqueue-classic-buckets", "false"}, exitUsage, "a boolean flag takes its value after =, e.g. --runqueue-classic-buckets=false"},
		{[]string{"check", "extra"}, exitUsage, `unexpected argument "extra"`},
		{[]string{"run"}, exitUsage, "requires at least 1 arg"},
		{[]string{"attach", "--pid", "1", "--gpu-interval", "1ms"}, exitUsage, "--gpu-interval must be at least 10ms"},
		{[]string{"attach", "--pid", "1", "--ctx-switch-floor", "0"}, exitUsage, "--ctx-switch-floor must be positive"},
		{[]string{"attach", "--pid", "1", "--nccl-stall", "0s"}, exitUsage, "--nccl-stall must be positive"},
		{[]string{"daemon", "--nccl-stall", "-1s"}, exitUsage, "--nccl-stall and --fd-reads-per-poll must be positive"},
		{[]string{"daemon", "--metrics.granularity", "pod"}, exitUsage, `--metrics.granularity must be container or process, not "pod"`},
		{[]string{"daemon", "--metrics.process-hold", "0s"}, exitUsage, "--metrics.process-hold must be positive"},
		{[]string{"frobnicate"}, exitUsage, "unknown command"},
		{[]string{"attach", "--pid", "999999999"}, exitRuntime, "no process with pid 999999999"},
	} {
		out, code := cli(t, nil, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.msg) {
			t.Errorf("%v: exit %d, want %d; output %q should contain %q", tc.args, code, tc.code, out, tc.msg)
		}
	}
}

func TestKernelThread(t *testing.T) {
	comm, err := os.ReadFile("/proc/2/comm")
	if err != nil || strings.TrimSpace(string(comm)) != "kthreadd" {
		t.Skip("pid 2 is not kthreadd here")
	}
	out, code := cli(t, nil, "attach", "--pid", "2")
	if code != exitRuntime || !strings.Contains(out, "kernel thread") {
		t.Fatalf("exit %d, output %q", code, out)
	}
}

// A plain `go build` in a checkout names the revision it was built from.
func TestVersion(t *testing.T) {
	out, code := cli(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "autoglm-ebpf ") {
		t.Fatalf("exit %d, output %q", code, out)
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	if rev := strings.TrimSpace(string(head))[:12]; !strings.Contains(out, rev) {
		t.Errorf("version %q does not name HEAD %s", out, rev)
	}
}

func TestBuildVersion(t *testing.T) {
	setting := func(kv ...string) *debug.BuildInfo {
		info := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}
		for i := 0; i < len(kv); i += 2 {
			info.Settings = append(info.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return info
	}
	for _, tc := range []struct {
		info *debug.BuildInfo
		ok   bool
		want string
	}{
		{nil, false, "dev"},
		{setting(), true, "dev"},
		{setting("vcs.revision", "0123456789abcdef0123", "vcs.modified", "false"), true, "0123456789ab"},
		{setting("vcs.revision", "0123456789abcdef0123", "vcs.modified", "true"), true, "0123456789ab+dirty"},
		{&debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, true, "v1.2.3"},
	} {
		if got := buildVersion(tc.info, tc.ok); got != tc.want {
			t.Errorf("buildVersion(%+v) = %q, want %q", tc.info, got, tc.want)
		}
	}
}

// Privileges are capabilities, not a uid: root without one fails naming it,
// a user without any fails naming them all, and a user granted the four
// runs.
func TestNoPrivileges(t *testing.T) {
	testutil.RequireRoot(t) // to drop privileges we must have them
	self := strconv.Itoa(os.Getpid())
	out, code := cli(t, &syscall.Credential{Uid: 65534, Gid: 65534}, "attach", "--pid", self, "--duration", "1s")
	if code != exitRuntime || !strings.Contains(out, "missing CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH") {
		t.Fatalf("nobody: exit %d, output %q", code, out)
	}
	run := func(args ...string) (string, int) {
		t.Helper()
		cmd := exec.Command("setpriv", append(args, "--", binary, "attach", "--pid", self, "--duration", "1s")...)
		b, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if err != nil && !errors.As(err, &ee) {
			t.Fatal(err)
		}
		return string(b), cmd.ProcessState.ExitCode()
	}
	if out, code := run("--bounding-set=-sys_ptrace"); code != exitRuntime || !strings.Contains(out, "missing CAP_SYS_PTRACE (") {
		t.Errorf("root without CAP_SYS_PTRACE: exit %d, output %q", code, out)
	}
	caps := "+bpf,+perfmon,+sys_ptrace,+dac_read_search"
	if out, code := run("--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps="+caps, "--ambient-caps="+caps); code != exitOK {
		t.Errorf("nobody with the four capabilities: exit %d, output %q", code, out)
	}
}

func progCount(t *testing.T) int {
	t.Helper()
	out, err := exec.Command("bpftool", "prog", "list").Output()
	if err != nil {
		t.Skipf("bpftool unavailable: %v", err)
	}
	return strings.Count(string(out), "\n")
}

// attach to a leaking process, fail on fd_leak: exit 3, a report naming the
// leaking function, and nothing left loaded.
func TestAttachFailOnLeak(t *testing.T) {
	testutil.RequireRoot(t)
	before := progCount(t)
	bin := testutil.Fixture(t, "fdwork")
	target := testutil.Start(t, bin, "leak", "20", "60")
	js := filepath.Join(t.TempDir(), "report.json")
	out, code := cli(t, nil, "attach", "--pid", strconv.Itoa(target.Process.Pid), "--duration", "14s", "--json", js, "--fail-on", "fd_leak,gpu_memory_leak")
	if code != exitFailOn {
		t.Fatalf("exit %d, want %d; output:\n%s", code, exitFailOn, out)
	}
	r := readReport(t, js)
	if len(r.Findings) == 0 || r.Findings[0].Kind != "fd_leak" || !strings.Contains(strings.Join(testutil.Texts(r.Findings[0].Stack), " "), "leak_tick") {
		t.Fatalf("report findings: %+v", r.Findings)
	}
	// What leaks, not only where: the fds point at /dev/null.
	if f := r.Findings[0]; !strings.Contains(f.Summary, "leaking /dev/null (") || len(f.Evidence.(model.FDLeakEvidence).LeakedTargets) == 0 {
		t.Errorf("fd_leak does not say what leaks: %q, evidence %+v", f.Summary, f.Evidence)
	}
	if after := progCount(t); after != before {
		t.Fatalf("BPF programs before %d, after %d", before, after)
	}
}

// --json - writes the report, and nothing else, to standard output, the
// live view and the summary to standard error: the runbooks stream it back
// through kubectl exec into a file that `report` then renders.
func TestAttachReportToStdout(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Fixture(t, "fdwork")
	target := testutil.Start(t, bin, "leak", "20", "60")
	pid := target.Process.Pid
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(binary, "attach", "--pid", strconv.Itoa(pid), "--duration", "14s", "--json", "-")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v; stderr:\n%s", err, stderr.String())
	}
	js := filepath.Join(t.TempDir(), "report.json")
	if err := os.WriteFile(js, stdout.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	r := readReport(t, js)
	if len(r.Findings) == 0 || r.Findings[0].Kind != "fd_leak" || r.Findings[0].PID != pid {
		t.Fatalf("report findings: %+v", r.Findings)
	}
	if want := fmt.Sprintf("FINDING fd_leak pid=%d", pid); !strings.Contains(stderr.String(), want) {
		t.Errorf("stderr lacks the summary's %q:\n%s", want, stderr.String())
	}
	if out, code := cli(t, nil, "report", js, "--html", filepath.Join(t.TempDir(), "report.html")); code != exitOK {
		t.Errorf("report of the streamed JSON: exit %d\n%s", code, out)
	}
}

// A target that exits while watched ends the run normally with a report.
func TestRunTargetExits(t *testing.T) {
	testutil.RequireRoot(t)
	before := progCount(t)
	bin := testutil.Fixture(t, "fdwork")
	js := filepath.Join(t.TempDir(), "report.json")
	start := time.Now()
	out, code := cli(t, nil, "run", "--json", js, "--", bin, "pool", "3")
	if code != 0 {
		t.Fatalf("exit %d; output:\n%s", code, out)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("run did not end with its command (took %s)", d)
	}
	r := readReport(t, js)
	if len(r.Processes) != 1 || !r.Processes[0].Exited || r.Processes[0].Comm != "fdwork" {
		t.Fatalf("report processes: %+v", r.Processes)
	}
	if len(r.Findings) != 0 {
		t.Fatalf("healthy pool flagged: %+v", r.Findings)
	}
	if after := progCount(t); after != before {
		t.Fatalf("BPF programs before %d, after %d", before, after)
	}
}

// Start-up is quick enough to watch a process that lives 2 s: attached after
// it started, the tool sees it open files live and reports it when it exits.
func TestAttachShortLivedProcess(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Fixture(t, "fdwork")
	target := testutil.Start(t, bin, "leak", "100", "2")
	js := filepath.Join(t.TempDir(), "report.json")
	out, code := cli(t, nil, "attach", "--pid", strconv.Itoa(target.Process.Pid), "--json", js)
	if code != 0 {
		t.Fatalf("exit %d; output:\n%s", code, out)
	}
	r := readReport(t, js)
	if len(r.Processes) != 1 || !r.Processes[0].Exited {
		t.Fatalf("report processes: %+v", r.Processes)
	}
	// Seeded fds are not counted as opened: these were seen live, in the
	// last half of its life at least.
	if n := r.Processes[0].FDsOpened["file"]; n < 50 {
		t.Fatalf("%d file opens seen live of the ~200 made; output:\n%s", n, out)
	}
}

// Ctrl-C (SIGINT) still writes the report and unloads everything.
func TestInterruptWritesReport(t *testing.T) {
	testutil.RequireRoot(t)
	before := progCount(t)
	bin := testutil.Fixture(t, "fdwork")
	target := testutil.Start(t, bin, "pool", "300")
	js := filepath.Join(t.TempDir(), "report.json")
	cmd := exec.Command(binary, "attach", "--pid", strconv.Itoa(target.Process.Pid), "--json", js)
	out := &syncBuffer{}
	cmd.Stdout = out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Interrupted once it has watched the process: its first line about it.
	line := fmt.Sprintf("pid=%d (fdwork) open=", target.Process.Pid)
	testutil.Eventually(t, 30*time.Second, "attach to print "+line, func() bool { return strings.Contains(out.String(), line) })
	_ = cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("after SIGINT: %v", err)
	}
	r := readReport(t, js)
	if len(r.Processes) != 1 || r.Processes[0].OpenFDs < 32 {
		t.Fatalf("report processes: %+v", r.Processes)
	}
	if after := progCount(t); after != before {
		t.Fatalf("BPF programs before %d, after %d", before, after)
	}
}

// check mounts tracefs when it is missing; run in a private mount namespace
// so the rest of the machine keeps its tracefs.
func TestCheckMountsTracefs(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare not installed")
	}
	out, err := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c",
		"umount /sys/kernel/tracing 2>/dev/null; umount /sys/kernel/debug 2>/dev/null; "+binary+" check").CombinedOutput()
	if err != nil {
		t.Fatalf("check failed: %v\n%s", err, out)
	}
	for _, want := range []string{"mounted it at /sys/kernel/tracing", "verdict: ready", "tracepoint sock/inet_sock_set_state"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("check output lacks %q:\n%s", want, out)
		}
	}
	// Every view is loaded as a run loads it, and says so on its line.
	for _, view := range []string{"view fd ", "view sched: sched_switch", "view sock ", "view cuda ", "view python "} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(view) + `.*\s+ok\s+`).Match(out) {
			t.Errorf("check output has no ok line for %q:\n%s", view, out)
		}
	}
}

// syncBuffer is a buffer a command writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func readReport(t *testing.T, path string) report.Report {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r report.Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	return r
}

// The live endpoint: open fds equal /proc within ±1, and the exposition passes
// promlint, the linter behind `promtool check metrics`.
func TestMetricsEndpoint(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.Fixture(t, "fdwork")
	target := testutil.Start(t, bin, "pool", "60")
	pid := strconv.Itoa(target.Process.Pid)
	addr := attachListening(t, pid, "20s")

	var body []byte
	var open float64
	var inProc int
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last scrape: autoglm_open_fds = %v, /proc had %d\n%s", open, inProc, body)
		}
	})
	// The first poll follows attach by a few ms, in which the pool may open
	// nothing, and the pool fills its 32 fds over the first polls: wait for
	// a scrape that agrees with /proc read just after it. One whose count
	// never does (a wrong count) fails here.
	testutil.Eventually(t, 15*time.Second, "/metrics with the pool's open fds as /proc has them", func() bool {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		open = -1
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, `autoglm_open_fds{comm="fdwork",pid="`+pid+`"}`) {
				open, _ = strconv.ParseFloat(line[strings.LastIndex(line, " ")+1:], 64)
			}
		}
		entries, err := os.ReadDir("/proc/" + pid + "/fd")
		if err != nil {
			t.Fatal(err)
		}
		inProc = len(entries)
		d := open - float64(inProc)
		return strings.Contains(string(body), "autoglm_fds_opened_total{") && d >= -1 && d <= 1
	})
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) > 0 {
		t.Errorf("promlint: %+v", problems)
	}
	for _, m := range []string{"autoglm_fds_opened_total", "autoglm_fd_limit", "autoglm_findings_total", "autoglm_bpf_events_lost_total"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("exposition lacks %s", m)
		}
	}
}

// attachListening runs attach on pid for duration with --listen on a free
// local port, stopped when the test ends, and returns the address.
func attachListening(t *testing.T, pid, duration string) string {
	t.Helper()
	addr := testutil.FreeAddr(t)
	cmd := exec.Command(binary, "attach", "--pid", pid, "--listen", addr, "--duration", duration)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(os.Interrupt); _ = cmd.Wait() })
	return addr
}

// A command that ignores SIGTERM does not keep `run` from ending: it is
// killed after the grace period.
func TestRunKillsCommandIgnoringSIGTERM(t *testing.T) {
	testutil.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, "run", "--duration", "2s", "--", "/bin/sh", "-c", `trap "" TERM; exec sleep 300`)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("run still waiting for a command that ignores SIGTERM:\n%s", out)
	}
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "ignored SIGTERM") {
		t.Errorf("no word about killing the command:\n%s", out)
	}
}

// procMemKiB returns a /proc/PID/status field in KiB (VmHWM, RssAnon, ...).
func procMemKiB(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}

// A leak in a library with 300 000 symbols is named by its function while
// the tool stays within its memory budget: symbols are looked up lazily, not
// loaded.
func TestLargeLibraryWithinMemoryBudget(t *testing.T) {
	testutil.RequireRoot(t)
	lib := testutil.BigLibrary(t)
	target := testutil.Start(t, testutil.Fixture(t, "biglib", "-ldl"), lib, "60", testutil.CUDAStubs(t))
	js := filepath.Join(t.TempDir(), "report.json")
	cmd := exec.Command(binary, "attach", "--pid", strconv.Itoa(target.Process.Pid), "--duration", "14s", "--json", js)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var hwm, anon int
	for running := true; running; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			running = false
		case <-time.After(100 * time.Millisecond):
			// Sampling while the tool runs, not waiting: the peaks are measured.
			hwm = max(hwm, procMemKiB(t, cmd.Process.Pid, "VmHWM"))
			anon = max(anon, procMemKiB(t, cmd.Process.Pid, "RssAnon"))
		}
	}
	r := readReport(t, js)
	// The fd leak and the GPU bursts, both from the big library, are
	// named at its functions.
	named := map[string]bool{}
	for _, f := range r.Findings {
		for _, fn := range []string{"leak_in_big_library", "burst_in_big_library"} {
			named[f.Kind] = named[f.Kind] || strings.Contains(f.Summary, "at "+fn+"+")
		}
	}
	if !named["fd_leak"] || !named["gpu_alloc_burst"] {
		t.Fatalf("findings naming the big library's functions: %v; findings %+v", named, r.Findings)
	}
	t.Logf("tool peak RSS %d KiB, peak anonymous RSS %d KiB", hwm, anon)
	// What symbolization can grow is anonymous memory: the old symbolizer
	// needed ~150 MiB of heap for this library. The rest of the RSS is the
	// binary's own pages (file-backed, shared, reclaimable: ~28 MiB of its
	// 41 MB here). The whole stays within the 64 MiB of issue 17 since the
	// views' loads share one decoding of the kernel's BTF, and since
	// libnvidia-ml (installed here, scripts/install-cuda-libs.sh) is not
	// loaded where the agent has no GPU device node: its zeroed data
	// alone took 12 MiB (51 MiB measured; BENCHMARKS.md).
	if anon > 32*1024 || hwm > 64*1024 {
		t.Errorf("peak anonymous RSS %d KiB (budget 32768), peak RSS %d KiB (budget 65536)", anon, hwm)
	}
}
