package testutil

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// DebianPython is the interpreter the Python frame tests must pass with
// (scripts/install-deps.sh test installs it).
const DebianPython = "/usr/bin/python3.11"

// Pythons returns the CPython interpreters to test Python frames with:
// Debian's python3.11 (libpython linked into the executable; required in
// CI) and, where they are installed, pyenv's builds of 3.10-3.13 (each with
// a shared libpython3.X.so).
func Pythons(t testing.TB) []string {
	t.Helper()
	var out []string
	if _, err := os.Stat(DebianPython); err == nil {
		out = append(out, DebianPython)
	} else if os.Getenv("CI") != "" {
		t.Fatalf("%s missing: scripts/install-deps.sh test installs it", DebianPython)
	}
	home, _ := os.UserHomeDir()
	for _, v := range []string{"3.10", "3.11", "3.12", "3.13"} {
		matches, _ := filepath.Glob(filepath.Join(home, ".pyenv", "versions", v+".*", "bin", "python"+v))
		if len(matches) > 0 {
			out = append(out, matches[len(matches)-1])
		}
	}
	if len(out) == 0 {
		t.Skipf("no CPython 3.10-3.13 (install %s)", DebianPython)
	}
	return out
}

// PythonVersion is "3.X.Y" of the interpreter py.
func PythonVersion(t testing.TB, py string) string {
	t.Helper()
	out, err := exec.Command(py, "-c", "import platform; print(platform.python_version())").Output()
	if err != nil {
		t.Fatalf("%s: %v", py, err)
	}
	return strings.TrimSpace(string(out))
}

// PythonScript is the path of testdata/python/NAME.
func PythonScript(name string) string {
	return filepath.Join(RepoRoot(), "testdata", "python", name)
}

// LineOf returns the number (from 1) of the first line of file holding
// marker.
func LineOf(t testing.TB, file, marker string) int {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		if strings.Contains(sc.Text(), marker) {
			return n
		}
	}
	t.Fatalf("%s has no line with %q", file, marker)
	return 0
}
