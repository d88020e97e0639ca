package cudatrack

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

func TestLibKind(t *testing.T) {
	for path, want := range map[string]string{
		"/usr/lib/x86_64-linux-gnu/libcudart.so.11.8.89":                             kindRuntime,
		"/venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12": kindRuntime,
		"/venv/lib/python3.11/site-packages/torch/lib/libcudart-9335f6a2.so.12":      kindRuntime,
		"/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03":                            kindDriver,
		"/usr/lib/x86_64-linux-gnu/libcuda.so.1":                                     kindDriver,
		"/usr/lib/x86_64-linux-gnu/libcuda.so":                                       kindDriver,
		"/usr/lib/x86_64-linux-gnu/libcudadebugger.so.1":                             "",
		"/usr/lib/x86_64-linux-gnu/libcudnn.so.8":                                    "",
		"/usr/lib/x86_64-linux-gnu/libcudart_static.a":                               "",
	} {
		if got := libKind(path); got != want {
			t.Errorf("libKind(%s) = %q, want %q", path, got, want)
		}
	}
}

// A fake /proc: CUDA libraries by name and the main executable are
// candidates; deleted files, data mappings and other libraries are not.
func TestCandidatesFakeProc(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "42")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	maps := `55d0c0000000-55d0c0001000 r--p 00000000 08:01 100 /usr/bin/python3.11
55d0c0001000-55d0c0100000 r-xp 00001000 08:01 100 /usr/bin/python3.11
7f0000000000-7f0000010000 r--p 00000000 08:01 200 /venv/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12
7f0000010000-7f0000080000 r-xp 00010000 08:01 200 /venv/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12
7f0000100000-7f0000180000 r-xp 00010000 08:01 201 /venv/site-packages/torch/lib/libcudart-9335f6a2.so.12
7f0000200000-7f0000280000 r-xp 00010000 08:01 300 /usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03
7f0000300000-7f0000380000 r-xp 00010000 08:01 301 /usr/lib/x86_64-linux-gnu/libcuda.so.535.183.01 (deleted)
7f0000400000-7f0000480000 rw-p 00010000 08:01 302 /usr/lib/x86_64-linux-gnu/libcuda.so.1
7f0000500000-7f0000580000 r-xp 00010000 08:01 400 /usr/lib/x86_64-linux-gnu/libcudnn.so.8
7f0000600000-7f0000680000 r-xp 00000000 00:00 0 [vdso]
`
	if err := os.WriteFile(filepath.Join(dir, "maps"), []byte(maps), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/usr/bin/python3.11", filepath.Join(dir, "exe")); err != nil {
		t.Fatal(err)
	}
	got, err := candidates(procFS(t, root), 42)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"/usr/bin/python3.11": kindStaticRuntime,
		"/venv/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12": kindRuntime,
		"/venv/site-packages/torch/lib/libcudart-9335f6a2.so.12":      kindRuntime,
		"/usr/lib/x86_64-linux-gnu/libcuda.so.535.261.03":             kindDriver,
	}
	if len(got) != len(want) {
		t.Errorf("candidates = %+v", got)
	}
	for _, mf := range got {
		if want[mf.path] != mf.kind {
			t.Errorf("%s: kind %q, want %q", mf.path, mf.kind, want[mf.path])
		}
	}
}

// Every hook of the stand-ins is found, under its version node, at a file
// offset where the function's code starts.
func TestInspectStubs(t *testing.T) {
	runtime := testutil.CUDAStubs(t)
	driver := filepath.Join(filepath.Dir(runtime), "libcuda.so.1")
	for _, c := range []struct {
		path, kind, layer string
		n                 int
	}{{runtime, kindRuntime, LayerRuntime, 16}, {driver, kindDriver, LayerDriver, 21}} {
		lib, err := Inspect(c.path, c.path, c.kind)
		if err != nil {
			t.Fatal(err)
		}
		if len(lib.Hooks) != c.n || len(lib.Missing) != 0 {
			t.Fatalf("%s: %d hooks, missing %v; want %d, none", c.path, len(lib.Hooks), lib.Missing, c.n)
		}
		data, err := os.ReadFile(c.path)
		if err != nil {
			t.Fatal(err)
		}
		f, err := elf.Open(c.path)
		if err != nil {
			t.Fatal(err)
		}
		text := f.Section(".text")
		code, err := text.Data()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		syms := symbolValues(t, c.path)
		for _, h := range lib.Hooks {
			a := APIs[h.API]
			if a.Layer != c.layer {
				t.Errorf("%s hooked in a %s library", a.Name, c.kind)
			}
			// The file offset (from the program headers) holds the code that
			// the section headers place at the symbol's address.
			at := syms[a.Name] - text.Addr
			if !bytes.Equal(data[h.Offset:h.Offset+4], code[at:at+4]) {
				t.Errorf("%s at file offset %#x: % x, code at %#x: % x", a.Name, h.Offset, data[h.Offset:h.Offset+4], syms[a.Name], code[at:at+4])
			}
		}
	}
	f, err := elf.Open(runtime)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(syms, func(s elf.Symbol) bool { return s.Name == "cudaMalloc" })
	if i < 0 || syms[i].Version != "libcudart.so.11.0" {
		t.Errorf("the stand-in does not export cudaMalloc@@libcudart.so.11.0: %+v", syms)
	}
}

// An older runtime without the stream-ordered allocator: what it lacks is
// listed, the rest is hooked.
func TestInspectOlderRuntime(t *testing.T) {
	runtime := testutil.CUDAStubs(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "old.map")
	if err := os.WriteFile(script, []byte("libcudart.so.10.0 { global: cudaMalloc; cudaFree; cudaMallocHost; cudaFreeHost; cudaHostAlloc; cudaMallocManaged; cudaMallocPitch; local: *; };\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(dir, "libcudart.so.10.0")
	src := filepath.Join(testutil.RepoRoot(), "testdata", "cudart_stub.c")
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-O1", "-Wl,--version-script="+script, "-o", old, src, filepath.Join(filepath.Dir(runtime), "libcuda.so.1")).CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	lib, err := Inspect(old, old, kindRuntime)
	if err != nil {
		t.Fatal(err)
	}
	// The script exports only allocation functions: the synchronising and
	// launch functions are missing too.
	want := []string{"cudaMallocAsync", "cudaMallocFromPoolAsync", "cudaFreeAsync", "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaLaunchKernel", "cudaGraphLaunch"}
	if !slices.Equal(lib.Missing, want) || len(lib.Hooks) != 7 {
		t.Errorf("missing %v with %d hooks; want %v with 7", lib.Missing, len(lib.Hooks), want)
	}
}

// A runtime linked into the executable is found in .symtab; an executable
// that only refers to the names (weak, undefined) is not a CUDA library.
func TestInspectExecutables(t *testing.T) {
	static := testutil.CUDAStaticWork(t)
	lib, err := Inspect(static, static, kindStaticRuntime)
	if err != nil {
		t.Fatal(err)
	}
	if lib == nil || len(lib.Hooks) != 16 || len(lib.Missing) != 0 {
		t.Fatalf("static runtime: %+v", lib)
	}
	plain := testutil.Fixture(t, "cudawork")
	lib, err = Inspect(plain, plain, kindStaticRuntime)
	if err != nil || lib != nil {
		t.Fatalf("plain executable: %+v, %v", lib, err)
	}
}

// A live process: after its late dlopen, both stand-ins and the executable
// are candidates.
func TestCandidatesLive(t *testing.T) {
	runtime := testutil.CUDAStubs(t)
	bin := testutil.Fixture(t, "cudawork")
	p := testutil.StartProc(t, nil, bin, runtime, "steady", "30")
	p.Wait(t, "loaded", 10*time.Second)
	got, err := candidates(procFS(t, "/proc"), p.Cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, mf := range got {
		kinds[mf.path] = mf.kind
	}
	want := map[string]string{bin: kindStaticRuntime, runtime: kindRuntime, filepath.Join(filepath.Dir(runtime), "libcuda.so.1"): kindDriver}
	if len(kinds) != len(want) {
		t.Errorf("candidates of pid %s = %v", strconv.Itoa(p.Cmd.Process.Pid), kinds)
	}
	for path, k := range want {
		if kinds[path] != k {
			t.Errorf("%s: kind %q, want %q", path, kinds[path], k)
		}
	}
}

func symbolValues(t *testing.T, path string) map[string]uint64 {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, s := range syms {
		out[s.Name] = s.Value
	}
	return out
}

func procFS(t *testing.T, root string) procinfo.FS {
	t.Helper()
	fs, err := procinfo.New(root)
	if err != nil {
		t.Fatal(err)
	}
	return fs
}
