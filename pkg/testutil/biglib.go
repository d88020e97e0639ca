package testutil

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// BigLibrarySymbols is how many functions BigLibrary defines, as many as
// libtorch_cuda.so has (libtorch_cpu.so has twice that).
const BigLibrarySymbols = 300_000

// BigLibrary builds, once (again when this file changed),
// testdata/bin/libbig.so: BigLibrarySymbols empty functions plus
// leak_in_big_library, which opens /dev/null and keeps the fd, and
// burst_in_big_library, which takes 100 × 64 MiB through the allocator it
// is given and frees them (testdata/biglib.c calls both), and returns its
// path.
func BigLibrary(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(RepoRoot(), "testdata", "bin")
	lib := filepath.Join(dir, "libbig.so")
	_, self, _, _ := runtime.Caller(0)
	if fresh(lib, self) {
		return lib
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	asm := filepath.Join(t.TempDir(), "big.s")
	f, err := os.Create(asm)
	if err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, ".section .note.GNU-stack,\"\",@progbits\n.text")
	for i := 0; i < BigLibrarySymbols; i++ {
		fmt.Fprintf(w, ".globl big_fn_%d\n.type big_fn_%d,@function\nbig_fn_%d:\n\tret\n.size big_fn_%d,.-big_fn_%d\n", i, i, i, i, i)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	src := filepath.Join(t.TempDir(), "leak.c")
	if err := os.WriteFile(src, []byte(`#include <fcntl.h>
__attribute__((noinline)) int leak_in_big_library(void) { return open("/dev/null", O_RDONLY); }
__attribute__((noinline)) int burst_in_big_library(int (*alloc)(void **, unsigned long), int (*release)(void *))
{
	void *p[100];
	for (int i = 0; i < 100; i++)
		if (alloc(&p[i], 64UL << 20))
			return -1;
	for (int i = 0; i < 100; i++)
		release(p[i]);
	return 0;
}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := lib + ".tmp"
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-O1", "-fno-omit-frame-pointer", "-o", tmp, asm, src).CombinedOutput(); err != nil {
		t.Fatalf("building libbig.so: %v\n%s", err, out)
	}
	if err := os.Rename(tmp, lib); err != nil {
		t.Fatal(err)
	}
	return lib
}
