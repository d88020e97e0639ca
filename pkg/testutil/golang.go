package testutil

import (
	"os/exec"
	"path/filepath"
	"testing"
)

// GoProgram builds testdata/NAME/main.go, a Go program, with the Go
// toolchain's defaults (a static executable with DWARF) and returns its
// path.
func GoProgram(t testing.TB, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	cmd := exec.Command("go", "build", "-o", bin, filepath.Join(RepoRoot(), "testdata", name, "main.go"))
	cmd.Dir = RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", name, err, out)
	}
	return bin
}
