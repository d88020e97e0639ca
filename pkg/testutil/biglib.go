package testutil

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// BigLibrarySymbols is how many functions BigLibrary defines, as many as
// libtorch_cuda.so has (libtorch_cpu.so has twice that).
const BigLibrarySymbols = 300_000

// BigLibrary builds, once, testdata/bin/libbig.so: BigLibrarySymbols empty
// functions plus leak_in_big_library, which opens /dev/null and keeps the
// fd (testdata/biglib.c calls it), and returns its path.
func BigLibrary(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(RepoRoot(), "testdata", "bin")
	lib := filepath.Join(dir, "libbig.so")
	if _, err := os.Stat(lib); err == nil {
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
