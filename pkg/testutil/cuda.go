package testutil

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// CUDAStubs builds the CUDA stand-in libraries (testdata/cuda_stub.c as
// libcuda.so.1, testdata/cudart_stub.c as libcudart.so.11.0 with the real
// version node) into testdata/bin/cuda once and returns the runtime's path.
// They keep frame pointers, as the real libraries do not need to.
func CUDAStubs(t testing.TB) string {
	t.Helper()
	if runtime, ok := prebuilt(t, filepath.Join("cuda", "libcudart.so.11.0")); ok {
		return runtime
	}
	root := RepoRoot()
	src := func(name string) string { return filepath.Join(root, "testdata", name) }
	dir := filepath.Join(root, "testdata", "bin", "cuda")
	driver := filepath.Join(dir, "libcuda.so.1")
	runtime := filepath.Join(dir, "libcudart.so.11.0")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	flags := []string{"-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", "-Wall"}
	if !fresh(driver, src("cuda_stub.c")) {
		build(t, append(flags, "-Wl,-soname,libcuda.so.1", "-o", driver, src("cuda_stub.c")))
	}
	if !fresh(runtime, src("cudart_stub.c")) || !fresh(runtime, src("cudart_stub.map")) || !fresh(runtime, driver) {
		// Linked against the driver stand-in by soname, found next to it.
		build(t, append(flags, "-Wl,-soname,libcudart.so.11.0", "-Wl,--version-script="+src("cudart_stub.map"),
			"-o", runtime, src("cudart_stub.c"), driver, "-Wl,-rpath,$ORIGIN"))
	}
	return runtime
}

func build(t testing.TB, args []string) {
	t.Helper()
	buildWith(t, "gcc", args)
}

func buildWith(t testing.TB, compiler string, args []string) {
	t.Helper()
	if out, err := exec.Command(compiler, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", compiler, strings.Join(args, " "), err, out)
	}
}

// CUDAChain builds testdata/unwindchain.c (lang "c") or unwindchain.cc
// ("c++") as distributions build code, -O2 -fomit-frame-pointer, linked
// against the runtime stand-in, and returns the executable's path.
func CUDAChain(t testing.TB, lang string) string {
	t.Helper()
	return cudaChain(t, lang, "", nil)
}

// CUDAChainPAC is CUDAChain built to sign its return addresses (pointer
// authentication, -mbranch-protection=standard, as Debian builds its arm64
// packages): arm64 only.
func CUDAChainPAC(t testing.TB, lang string) string {
	t.Helper()
	if goruntime.GOARCH != "arm64" {
		t.Fatalf("pointer authentication is arm64's, not %s's", goruntime.GOARCH)
	}
	return cudaChain(t, lang, "_pac", []string{"-mbranch-protection=standard"})
}

func cudaChain(t testing.TB, lang, suffix string, flags []string) string {
	t.Helper()
	runtime := CUDAStubs(t)
	dir := filepath.Dir(runtime)
	name, compiler := "unwindchain.c", "gcc"
	if lang == "c++" {
		name, compiler = "unwindchain.cc", "g++"
	}
	base := strings.ReplaceAll(name, ".", "_") + suffix
	if bin, ok := prebuilt(t, filepath.Join("cuda", base)); ok {
		return bin
	}
	src := filepath.Join(RepoRoot(), "testdata", name)
	bin := filepath.Join(dir, base)
	if fresh(bin, src) && fresh(bin, runtime) {
		return bin
	}
	// $ORIGIN: the runtime beside it wherever the directory is (a guest
	// of the kernel matrix may have it elsewhere).
	args := append([]string{"-O2", "-g", "-fomit-frame-pointer", "-Wall"}, flags...)
	buildWith(t, compiler, append(args, "-o", bin, src, runtime, "-Wl,-rpath,$ORIGIN"))
	return bin
}

// Proc is a running fixture whose stdout lines a test waits on.
type Proc struct {
	Cmd   *exec.Cmd
	lines chan string
}

// StartProc runs a fixture with extra environment variables (KEY=VALUE) and
// waits until it prints "ready"; it is killed when the test ends.
func StartProc(t testing.TB, env []string, bin string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	p := &Proc{Cmd: cmd, lines: make(chan string, 64)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- strings.TrimSpace(sc.Text())
		}
	}()
	p.Wait(t, "ready", 20*time.Second)
	return p
}

// Signal sends SIGUSR1, the fixtures' "go on".
func (p *Proc) Signal(t testing.TB) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
}

// Wait returns the next line starting with prefix, skipping others; it fails
// the test if none comes within timeout or the fixture exits first.
func (p *Proc) Wait(t testing.TB, prefix string, timeout time.Duration) string {
	t.Helper()
	l, ok := p.TryWait(t, prefix, timeout)
	if !ok {
		t.Fatalf("%s did not print %q within %s", p.Cmd.Path, prefix, timeout)
	}
	return l
}

// TryWait is Wait that reports a timeout instead of failing; the fixture
// exiting first still fails the test.
func (p *Proc) TryWait(t testing.TB, prefix string, timeout time.Duration) (string, bool) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("%s exited before printing %q", p.Cmd.Path, prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return l, true
			}
		case <-deadline:
			return "", false
		}
	}
}

// CUDAStaticWork builds testdata/cudawork.c with the runtime stand-in linked
// in (a statically linked CUDA runtime, in .symtab only) and the driver
// stand-in as a shared library, and returns the executable's path. Run it
// with "-" as the library.
func CUDAStaticWork(t testing.TB) string {
	t.Helper()
	if bin, ok := prebuilt(t, filepath.Join("cuda", "cudawork_static")); ok {
		return bin
	}
	runtime := CUDAStubs(t)
	dir := filepath.Dir(runtime)
	src := filepath.Join(RepoRoot(), "testdata")
	bin := filepath.Join(dir, "cudawork_static")
	if fresh(bin, filepath.Join(src, "cudawork.c")) && fresh(bin, filepath.Join(src, "cudart_stub.c")) && fresh(bin, filepath.Join(dir, "libcuda.so.1")) {
		return bin
	}
	build(t, []string{"-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-pthread", "-o", bin,
		filepath.Join(src, "cudawork.c"), filepath.Join(src, "cudart_stub.c"), filepath.Join(dir, "libcuda.so.1"), "-Wl,-rpath," + dir})
	return bin
}
