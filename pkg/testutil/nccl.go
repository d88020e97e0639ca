package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// NCCLStub builds the NCCL stand-in (testdata/nccl_stub.c as libnccl.so.2,
// as the Makefile does) into testdata/bin/nccl once and returns its path.
func NCCLStub(t testing.TB) string {
	t.Helper()
	if lib, ok := prebuilt(t, filepath.Join("nccl", "libnccl.so.2")); ok {
		return lib
	}
	root := RepoRoot()
	src := filepath.Join(root, "testdata", "nccl_stub.c")
	dir := filepath.Join(root, "testdata", "bin", "nccl")
	lib := filepath.Join(dir, "libnccl.so.2")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if !fresh(lib, src) {
		build(t, []string{"-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wl,-soname,libnccl.so.2", "-o", lib, src})
	}
	return lib
}
