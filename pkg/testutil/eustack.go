package testutil

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"runtime"
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

// MatchEUStack holds pcs, a stack the tracer unwound in the live process
// pid, to eu-stack's frames eu, frame for frame. Two differences are
// allowed on aarch64, each checked against the instructions of the process:
//   - In a syscall, the tracer's first pc is the one after SVC; eu-stack's
//     is the SVC itself: arm64 rewinds the pc of an interrupted syscall, to
//     restart it, before the ptrace stop eu-stack reads it in.
//   - elfutils (0.188, Debian bookworm's) takes main's caller from the
//     frame record x29 points to, which main built without frame pointers
//     leaves as glibc's __libc_start_call_main made it, so it skips that
//     frame. Ours there passes only as a return address: the instruction
//     before it is a call (BL, BLR, or BLRAA and kin).
func MatchEUStack(t testing.TB, pid int, pcs []uint64, eu []EUFrame) {
	t.Helper()
	arm64 := runtime.GOARCH == "arm64"
	i, j, skipped := 0, 0, false
	for i < len(pcs) && j < len(eu) {
		switch {
		case pcs[i] == eu[j].PC:
			i, j = i+1, j+1
		case arm64 && i == 0 && j == 0 && pcs[0] == eu[0].PC+4 && insnAt(t, pid, eu[0].PC) == 0xd4000001: // SVC #0
			i, j = i+1, j+1
		case arm64 && !skipped && j > 0 && eu[j-1].Name == "main" && isCall(insnAt(t, pid, pcs[i]-4)):
			t.Logf("frame %d %#x: a return address eu-stack skipped after main", i, pcs[i])
			i, skipped = i+1, true
		default:
			t.Fatalf("frame %d = %#x, eu-stack's frame %d %#x (%s): stack %#x, eu-stack %v", i, pcs[i], j, eu[j].PC, eu[j].Name, pcs, eu)
		}
	}
	if i != len(pcs) || j != len(eu) {
		t.Fatalf("stack has %d frames %#x, eu-stack %d: %v", len(pcs), pcs, len(eu), eu)
	}
}

// insnAt returns the AArch64 instruction at pc in process pid.
func insnAt(t testing.TB, pid int, pc uint64) uint32 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [4]byte
	if _, err := f.ReadAt(b[:], int64(pc)); err != nil {
		t.Fatalf("reading the instruction at %#x: %v", pc, err)
	}
	return binary.LittleEndian.Uint32(b[:])
}

// isCall says whether an AArch64 instruction is a branch with link.
func isCall(insn uint32) bool {
	return insn&0xfc000000 == 0x94000000 || // BL
		insn&0xfffffc1f == 0xd63f0000 || // BLR
		insn&0xfefff800 == 0xd63f0800 // BLRAA, BLRAAZ, BLRAB, BLRABZ
}
