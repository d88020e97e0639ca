package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// With FixturesEnv set, the fixtures are the folder's, none compiled: the
// arm64 guests have no compiler.
func TestPrebuiltFixtures(t *testing.T) {
	dir := t.TempDir()
	for _, rel := range []string{"fdwork", "cuda/libcudart.so.11.0", "cuda/unwindchain_cc", "cuda/cudawork_static", "nccl/libnccl.so.2"} {
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(FixturesEnv, dir)
	for _, c := range []struct{ got, want string }{
		{Fixture(t, "fdwork"), "fdwork"},
		{CUDAStubs(t), "cuda/libcudart.so.11.0"},
		{CUDAChain(t, "c++"), "cuda/unwindchain_cc"},
		{CUDAStaticWork(t), "cuda/cudawork_static"},
		{NCCLStub(t), "nccl/libnccl.so.2"},
	} {
		if c.got != filepath.Join(dir, c.want) {
			t.Errorf("got %s, want %s in %s", c.got, c.want, dir)
		}
	}
}
