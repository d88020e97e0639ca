// Package testutil holds helpers shared by tests: for the BPF integration
// tests the root gate and the C fixtures under testdata/, and stacks written
// as text.
package testutil

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// RequireRoot skips a test that loads BPF when not root, but only outside CI:
// in CI (CI set) such a test must run, so a missing privilege fails it.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatal("BPF integration tests must run as root in CI")
	}
	t.Skip("needs root to load BPF (runs in CI)")
}

// KernelAtLeast says whether the running kernel is major.minor or later,
// for tests whose expectation is the kernel's (a feature that came in a
// release).
func KernelAtLeast(t testing.TB, major, minor int) bool {
	t.Helper()
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(uts.Release[:]), "%d.%d", &ma, &mi); err != nil {
		t.Fatalf("kernel release %q: %v", unix.ByteSliceToString(uts.Release[:]), err)
	}
	return ma > major || (ma == major && mi >= minor)
}

// RepoRoot returns the repository root, found from this file's location.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// FixturesEnv names a folder of prebuilt fixtures, laid out as testdata/bin
// (`make fixtures-arm64` builds testdata/bin-arm64 so): where it is set the
// fixtures are taken from there, not compiled. The kernel matrix's arm64
// guests run the test binaries so: they have no compiler, and the host's
// compiler builds for the host's architecture.
const FixturesEnv = "AUTOGLM_TEST_FIXTURES"

// prebuilt returns the path of fixture REL (a path under testdata/bin) in
// FixturesEnv's folder, and whether that folder is set; a fixture missing
// there fails the test.
func prebuilt(t testing.TB, rel string) (string, bool) {
	t.Helper()
	dir := os.Getenv(FixturesEnv)
	if dir == "" {
		return "", false
	}
	path := filepath.Join(dir, rel)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("prebuilt fixture (%s=%s): %v", FixturesEnv, dir, err)
	}
	return path, true
}

// Fixture compiles testdata/NAME.c (with frame pointers, as the tracer needs)
// into testdata/bin once per test binary and returns the binary's path.
func Fixture(t testing.TB, name string, extra ...string) string {
	t.Helper()
	if bin, ok := prebuilt(t, name); ok {
		return bin
	}
	root := RepoRoot()
	src := filepath.Join(root, "testdata", name+".c")
	bin := filepath.Join(root, "testdata", "bin", name)
	if fresh(bin, src) {
		return bin
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-o", bin, src}, extra...)
	if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", name, err, out)
	}
	return bin
}

func fresh(bin, src string) bool {
	b, err1 := os.Stat(bin)
	s, err2 := os.Stat(src)
	return err1 == nil && err2 == nil && b.ModTime().After(s.ModTime())
}

// Start runs a fixture and waits until it prints "ready"; it is killed when
// the test ends.
func Start(t testing.TB, bin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "ready" {
				ready <- true
			}
		}
	}()
	select {
	case <-ready:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s %v never printed ready", bin, args)
	}
	return cmd
}

// ReadyPipe is for a fixture started some other way than Start (through
// launch.Start, to be tracked before its exec): it returns the write end of
// a pipe to give the fixture as its stdout, and a func that reports whether
// the fixture has printed "ready" on it yet, to wait on with Eventually.
// The pipe is closed when the test ends.
func ReadyPipe(t testing.TB) (*os.File, func() bool) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(); _ = r.Close() })
	var ready atomic.Bool
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "ready" {
				ready.Store(true)
			}
		}
	}()
	return w, ready.Load
}

// Eventually checks cond every 50 ms until it holds, and fails the test
// naming what it waited for if it does not within timeout.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
	}
}

// FreeAddr returns a loopback address whose port was free a moment ago, for
// a server the test starts.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
