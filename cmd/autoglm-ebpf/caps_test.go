package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// procReadEnv turns the test binary into procReadMain: run under setpriv by
// TestEachCapabilityNeeded, it reads another process's /proc entries as
// the agent does, with the capabilities it was left.
const procReadEnv = "AUTOGLM_TEST_PROCREAD"

// procReads are the agent's reads of another process that the kernel
// checks against CAP_SYS_PTRACE or CAP_DAC_READ_SEARCH, each "ok" or the
// errno it failed with.
type procReads struct {
	FDList  string `json:"fd_list"`  // listing /proc/PID/fd: the fd view's table, every poll
	FDLinks string `json:"fd_links"` // readlink /proc/PID/fd/N: what each fd is (kinds, what a leak holds)
	Maps    string `json:"maps"`     // /proc/PID/maps: which libraries (CUDA discovery, symbolization)
	Root    string `json:"root"`     // the process's own executable through /proc/PID/root (uprobes, symbolization)
	Memory  string `json:"memory"`   // process_vm_readv: the python view's frames
}

// procReadMain reads pid's entries (args from the environment: the pid, the
// executable's path as the process sees it, an address it maps) and prints
// the outcome as JSON.
func procReadMain(spec string) int {
	var (
		pid  int
		exe  string
		addr uint64
	)
	if _, err := fmt.Sscanf(spec, "%d %s %x", &pid, &exe, &addr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	outcome := func(err error) string {
		var errno unix.Errno
		switch {
		case err == nil:
			return "ok"
		case errors.As(err, &errno):
			return unix.ErrnoName(errno)
		}
		return err.Error()
	}
	fs, err := procinfo.New("/proc")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var r procReads
	_, err = fs.FDNumsNow(pid)
	r.FDList = outcome(err)
	_, err = fs.FDs(pid, []int{0, 1, 2})
	r.FDLinks = outcome(err)
	_, err = fs.Maps(pid)
	r.Maps = outcome(err)
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "root", exe))
	if err == nil {
		_, err = f.Read(make([]byte, 4))
		f.Close()
	}
	r.Root = outcome(err)
	buf := make([]byte, 8)
	_, err = unix.ProcessVMReadv(pid, []unix.Iovec{{Base: &buf[0], Len: 8}}, []unix.RemoteIovec{{Base: uintptr(addr), Len: 8}}, 0)
	r.Memory = outcome(err)
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}

// containerCaps are the capabilities containerd and the other runtimes give
// a container by default, as setpriv names them: a workload's root process
// has them.
var containerCaps = []string{"chown", "dac_override", "fowner", "fsetid", "kill", "setgid", "setuid", "setpcap",
	"net_bind_service", "net_raw", "sys_chroot", "mknod", "audit_write", "setfcap"}

// Each capability the DaemonSet adds is needed, as deploy/README.md's table
// says: under the DaemonSet's bounding set less that one, the agent refuses
// to start naming it, and the kernel refuses what the table says needs it.
// CAP_BPF and CAP_PERFMON: every tracing program (check's probes fail).
// CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH: reads of the workloads' /proc
// entries, made as the agent makes them, of a root process with a
// container's default capabilities and of a process of another user whose
// files are its own (mode 0700). Each of those the fd view, which every
// watched process needs, makes for its table (fd_list, fd_links): without
// either capability the agent would watch next to nothing, so it refuses to
// start rather than run blind.
func TestEachCapabilityNeeded(t *testing.T) {
	testutil.RequireRoot(t)
	caps := daemonSetCaps(t)
	fdwork := testutil.Fixture(t, "fdwork")

	// The root workload: its capabilities are no subset of the agent's.
	root := testutil.StartProc(t, nil, "setpriv", "--bounding-set="+boundingSet(containerCaps), "--", fdwork, "pool", "120")
	// The other user's: its executable in its own folder, mode 0700.
	home, err := os.MkdirTemp("", "autoglm-caps-home") // mode 0700, in /tmp which all may search
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	private := filepath.Join(home, "fdwork")
	if out, err := exec.Command("cp", fdwork, private).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	for _, p := range []string{home, private} {
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	user := testutil.StartProc(t, nil, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", private, "pool", "120")

	// reads runs procReadMain on w under bounding.
	type workload struct {
		name string
		pid  int
		exe  string
	}
	workloads := []workload{{"root with a container's capabilities", root.Cmd.Process.Pid, fdwork}, {"uid 65534, mode 0700", user.Cmd.Process.Pid, private}}
	reads := func(t *testing.T, bounding string, w workload) procReads {
		t.Helper()
		fs, err := procinfo.New("/proc")
		if err != nil {
			t.Fatal(err)
		}
		maps, err := fs.Maps(w.pid)
		if err != nil || len(maps) == 0 {
			t.Fatalf("maps of %d: %v", w.pid, err)
		}
		cmd := exec.Command("setpriv", "--bounding-set="+bounding, "--", os.Args[0])
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %s %x", procReadEnv, w.pid, w.exe, maps[0].StartAddr))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("reading %d's entries under %s: %v", w.pid, bounding, err)
		}
		var r procReads
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		t.Logf("%s under %s: %+v", w.name, bounding, r)
		return r
	}
	all := procReads{FDList: "ok", FDLinks: "ok", Maps: "ok", Root: "ok", Memory: "ok"}
	for _, w := range workloads {
		if r := reads(t, boundingSet(caps), w); r != all {
			t.Errorf("%s under the DaemonSet's capabilities: %+v, want every read ok", w.name, r)
		}
	}

	check := func(t *testing.T, bounding string) string {
		t.Helper()
		out, err := exec.Command("setpriv", "--bounding-set="+bounding, "--", binary, "check").CombinedOutput()
		if err == nil || !strings.Contains(string(out), "verdict: NOT READY") {
			t.Errorf("check under %s: %v, want NOT READY:\n%s", bounding, err, out)
		}
		return string(out)
	}
	for _, c := range caps {
		t.Run(c, func(t *testing.T) {
			bounding := boundingSet(slices.DeleteFunc(slices.Clone(caps), func(o string) bool { return o == c }))
			name := "CAP_" + strings.ToUpper(c)
			out, err := exec.Command("setpriv", "--bounding-set="+bounding, "--", binary, "attach", "--pid", strconv.Itoa(root.Cmd.Process.Pid), "--duration", "1s").CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != exitRuntime || !strings.Contains(string(out), "missing "+name+" (") {
				t.Errorf("attach without %s: %v, want exit %d naming it alone:\n%s", name, err, exitRuntime, out)
			}
			switch c {
			case "bpf", "perfmon":
				// Tracing programs need both (bpf_prog_load: CAP_BPF,
				// and CAP_PERFMON for tracing types).
				got := check(t, bounding)
				for _, line := range []string{
					`capabilities\s+MISSING\s+missing ` + name + ` \(`,
					`program type TracePoint\s+MISSING\s+.*operation not permitted`,
				} {
					if !regexp.MustCompile(`(?m)^` + line).MatchString(got) {
						t.Errorf("check without %s: no line %q:\n%s", name, line, got)
					}
				}
			case "sys_ptrace":
				// Whoever owns the process, the fd links, its files and its
				// memory need ptrace read (attach, for memory) access,
				// which a process whose capabilities are no superset of
				// the target's only has with CAP_SYS_PTRACE.
				for _, w := range workloads {
					r := reads(t, bounding, w)
					if r.FDLinks == "ok" || r.Root == "ok" || r.Memory == "ok" {
						t.Errorf("%s without %s: %+v, want fd_links, root and memory refused", w.name, name, r)
					}
				}
			case "dac_read_search":
				// A root process's entries are root's: all read. Another
				// user's /proc/PID/fd is its own, mode 0500, and so is its
				// folder: not even listed.
				if r := reads(t, bounding, workloads[0]); r != all {
					t.Errorf("%s without %s: %+v, want every read ok", workloads[0].name, name, r)
				}
				if r := reads(t, bounding, workloads[1]); r.FDList == "ok" || r.FDLinks == "ok" || r.Root == "ok" {
					t.Errorf("%s without %s: %+v, want fd_list, fd_links and root refused", workloads[1].name, name, r)
				}
			default:
				t.Errorf("the DaemonSet adds %s, which this test does not know: say here what fails without it", name)
			}
		})
	}
}

// Under a seccomp filter that refuses bpf() and perf_event_open(), as the
// runtimes' default profiles before containerd 1.6.9 do without
// CAP_SYS_ADMIN, the agent has its capabilities but loads nothing: it exits
// naming the filter as a cause, not only the capabilities it has.
func TestSeccompRefusalNamed(t *testing.T) {
	testutil.RequireRoot(t)
	deny := testutil.Fixture(t, "noseccompbpf")
	out, err := exec.Command(deny, binary, "attach", "--pid", strconv.Itoa(os.Getpid()), "--duration", "1s").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != exitRuntime || !strings.Contains(string(out), "seccomp filter refused it") {
		t.Errorf("attach under a filter refusing bpf(): %v, want exit %d naming the filter:\n%s", err, exitRuntime, out)
	}
}
