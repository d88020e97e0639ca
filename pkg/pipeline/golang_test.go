package pipeline

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// A Go program leaking files from main.cacheShard, watched from before
// exec: the fd_leak finding names cacheShard with the line of its
// os.Open, not the Go runtime's syscall wrapper its stack starts in, and
// the stack's frames carry lines from the executable's DWARF.
func TestGoLeakNamesFunction(t *testing.T) {
	testutil.RequireRoot(t)
	bin := testutil.GoProgram(t, "goleak")
	src := filepath.Join(testutil.RepoRoot(), "testdata", "goleak", "main.go")
	line := testutil.LineOf(t, src, "// leak: open")
	polls := 0
	final, _ := runFromExec(t, DefaultConfig(), []string{bin, "20", "60"}, 3*intervals*time.Second, func(s *model.Snapshot) bool {
		polls++
		return polls > intervals || slices.ContainsFunc(s.Findings, func(f model.Finding) bool { return f.Kind == model.KindFDLeak })
	})
	for _, f := range final.Findings {
		if f.Kind != model.KindFDLeak {
			continue
		}
		i := slices.IndexFunc(f.Stack, func(fr model.Frame) bool { return fr.Function == "main.cacheShard" })
		if i < 0 || f.Stack[i].File != src || f.Stack[i].Line != line {
			t.Errorf("stack has no main.cacheShard at %s:%d:\n  %s", src, line, strings.Join(testutil.Texts(f.Stack), "\n  "))
		}
		if site := fmt.Sprintf("at main.cacheShard (main.go:%d)", line); !strings.Contains(f.Summary, site) {
			t.Errorf("summary %q does not say %q", f.Summary, site)
		}
		t.Logf("found at interval %d: %s\n  %s", polls, f.Summary, strings.Join(testutil.Texts(f.Stack), "\n  "))
		return
	}
	t.Fatalf("no fd leak in %d intervals", polls)
}
