package pipeline

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// A Python process leaking files from a named function, watched from
// before exec as `run` does: the fd_leak finding's stack has the function,
// file and line, and its summary names it.
func TestPythonLeakNamesFunction(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat(testutil.DebianPython); err != nil {
		testutil.Pythons(t) // fails in CI, skips elsewhere
		t.Skipf("%s missing", testutil.DebianPython)
	}
	script := testutil.PythonScript("leak.py")
	line := testutil.LineOf(t, script, "# leak: open")
	polls := 0
	final, _ := runFromExec(t, DefaultConfig(), []string{testutil.DebianPython, script, "20", "60"}, 3*intervals*time.Second, func(s *model.Snapshot) bool {
		polls++
		return polls > intervals || slices.ContainsFunc(s.Findings, func(f model.Finding) bool { return f.Kind == model.KindFDLeak })
	})
	for _, f := range final.Findings {
		if f.Kind != model.KindFDLeak {
			continue
		}
		want := model.Frame{Kind: model.FramePython, Function: "cache_tokenizer", File: script, Line: line}
		if !slices.Contains(f.Stack, want) {
			t.Errorf("stack has no %q:\n  %s", want, strings.Join(testutil.Texts(f.Stack), "\n  "))
		}
		if site := fmt.Sprintf("at cache_tokenizer (leak.py:%d)", line); !strings.Contains(f.Summary, site) {
			t.Errorf("summary %q does not say %q", f.Summary, site)
		}
		t.Logf("found at interval %d: %s", polls, f.Summary)
		return
	}
	t.Fatalf("no fd leak in %d intervals", polls)
}
