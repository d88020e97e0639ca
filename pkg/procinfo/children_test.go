package procinfo

import (
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// A shell that forks a sleeper which forks another: both are found, the
// shell itself is not listed, and an unrelated process is not either.
func TestDescendants(t *testing.T) {
	sh := exec.Command("/bin/sh", "-c", "sh -c 'sleep 30; true' & sleep 30; true")
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sh.Process.Kill(); _ = sh.Wait() }()
	fs, err := New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	testutil.Eventually(t, 10*time.Second, "the shell's three descendants", func() bool {
		if got, err = fs.Descendants([]int{sh.Process.Pid}); err != nil {
			t.Fatal(err)
		}
		return len(got) >= 3
	})
	// sh -c '...' & (a subshell running sleep), its sleep, and the outer sleep.
	if len(got) != 3 {
		t.Fatalf("descendants of %d: %v, want 3", sh.Process.Pid, got)
	}
	if slices.Contains(got, sh.Process.Pid) || slices.Contains(got, os.Getpid()) {
		t.Fatalf("descendants %v include the root or its parent", got)
	}
}
