package testutil

import (
	"bufio"
	"bytes"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// EUFrame is one frame of eu-stack's output.
type EUFrame struct {
	PC   uint64
	Name string
}

// EUStack runs eu-stack (elfutils) on pid and returns its main thread's
// frames, innermost first. elfutils unwinds with .eh_frame and .debug_frame:
// it is the oracle the tracer's stacks are held to.
func EUStack(t testing.TB, pid int) []EUFrame {
	t.Helper()
	out, err := exec.Command("eu-stack", "-p", strconv.Itoa(pid)).Output()
	if err != nil {
		t.Fatalf("eu-stack -p %d: %v\n%s", pid, err, out)
	}
	var frames []EUFrame
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 || !strings.HasPrefix(f[0], "#") {
			continue
		}
		pc, err := strconv.ParseUint(strings.TrimPrefix(f[1], "0x"), 16, 64)
		if err != nil {
			t.Fatalf("eu-stack line %q: %v", sc.Text(), err)
		}
		frames = append(frames, EUFrame{pc, strings.Join(f[2:], " ")})
	}
	return frames
}
