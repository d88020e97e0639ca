package fdtrack

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/stack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/pyframes"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// The C structs of bpf/pyframes.h and their Go mirrors agree.
func TestPyLayout(t *testing.T) {
	if err := pyframes.SameLayout(fdPyProc{}, pyframes.Proc{}); err != nil {
		t.Error(err)
	}
	if err := pyframes.SameLayout(fdPyStack{}, pyframes.Stack{}); err != nil {
		t.Error(err)
	}
}

// Files opened from a Python function carry its frames: function, file and
// line of cache_tokenizer and its callers, after the native frames, on
// every interpreter at hand, from the main thread and from a worker thread
// while the main thread keeps the interpreter busy.
func TestPythonFramesAtOpen(t *testing.T) {
	testutil.RequireRoot(t)
	script := testutil.PythonScript("leak.py")
	line := testutil.LineOf(t, script, "# leak: open")
	want := model.Frame{Kind: model.FramePython, Function: "cache_tokenizer", File: script, Line: line}
	for _, py := range testutil.Pythons(t) {
		version := testutil.PythonVersion(t, py)
		for _, mode := range []string{"main", "thread"} {
			t.Run(version+"/"+filepath.Base(py)+"/"+mode, func(t *testing.T) {
				c, err := NewConcern(Config{ProcRoot: "/proc"}, symbolize.New("/proc"), 64)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = c.Close() })
				args := []string{script, "50", "30"}
				if mode == "thread" {
					args = append(args, "thread")
				}
				cmd := testutil.Start(t, py, args...)
				pr := &model.Process{PID: cmd.Process.Pid}
				if err := c.Track(pr.PID); err != nil {
					t.Fatal(err)
				}
				if got := c.stacks.PyVersion(pr.PID); !strings.HasPrefix(version, got) || got == "" {
					t.Fatalf("found Python %q, want %s", got, version)
				}
				defer func() {
					if t.Failed() {
						for _, s := range pr.FD.Sites {
							t.Logf("%d fds at\n  %s", len(s.FDs), strings.Join(testutil.Texts(s.Stack), "\n  "))
						}
					}
				}()
				// The script leaks 50 fds a second at cache_tokenizer.
				testutil.Eventually(t, 20*time.Second, fmt.Sprintf("20 fds opened at %s", want), func() bool {
					if _, err := c.Fill(time.Now(), []*model.Process{pr}); err != nil {
						t.Fatal(err)
					}
					n := 0
					for _, s := range pr.FD.Sites {
						if slices.Contains(s.Stack, want) {
							n += len(s.FDs)
						}
					}
					return n >= 20
				})
				leaked := 0
				for _, s := range pr.FD.Sites {
					i := slices.Index(s.Stack, want)
					if i < 0 {
						continue
					}
					leaked += len(s.FDs)
					if i+1 >= len(s.Stack) || s.Stack[i+1].Function != "serve" || s.Stack[i+1].File != script {
						t.Errorf("%s is not called from serve (%s:...): %q", want, script, s.Stack)
					}
					if i == 0 || s.Stack[0].Module != "libc.so.6" {
						t.Errorf("native frames are not innermost: %q", s.Stack)
					}
					if got, want := stack.CallSite(s.Stack), fmt.Sprintf("cache_tokenizer (leak.py:%d)", line); got != want {
						t.Errorf("call site %q, want %q", got, want)
					}
				}
				if leaked < 20 {
					t.Fatalf("%d fds opened at %s, want >= 20", leaked, want)
				}
				lost, err := c.Lost()
				if err != nil {
					t.Fatal(err)
				}
				for k, v := range lost {
					if strings.HasPrefix(k, "stacks_py_") && v != 0 {
						t.Errorf("%s = %d", k, v)
					}
				}
			})
		}
	}
}
