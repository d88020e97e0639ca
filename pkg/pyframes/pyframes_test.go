package pyframes

import (
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// dumpCode prints, for every code object of the files given and of a few
// standard library modules, its first line, its co_linetable and the lines
// co_lines() gives for each range of byte offsets.
const dumpCode = `
import json, sys, types, os, json.decoder, threading, dataclasses
def walk(co):
    yield co
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            yield from walk(c)
out = []
for path in sys.argv[1:] + [os.__file__, json.decoder.__file__, threading.__file__, dataclasses.__file__]:
    with open(path) as f:
        top = compile(f.read(), path, "exec")
    for co in walk(top):
        out.append({"name": co.co_name, "first": co.co_firstlineno, "table": co.co_linetable.hex(),
                    "lines": [[s, e, -1 if l is None else l] for s, e, l in co.co_lines()]})
json.dump(out, sys.stdout)
`

// The line tables of 3.10 and of 3.11+ decode to the lines the interpreter
// itself gives, for every instruction of thousands of code objects.
func TestLineTables(t *testing.T) {
	for _, py := range testutil.Pythons(t) {
		version := testutil.PythonVersion(t, py)
		t.Run(version+"/"+filepath.Base(py), func(t *testing.T) {
			out, err := exec.Command(py, "-c", dumpCode, testutil.PythonScript("leak.py"), testutil.PythonScript("gpu.py")).Output()
			if err != nil {
				t.Fatalf("%s: %v", py, err)
			}
			var codes []struct {
				Name  string
				First int
				Table string
				Lines [][3]int
			}
			if err := json.Unmarshal(out, &codes); err != nil {
				t.Fatal(err)
			}
			checked, bad := 0, 0
			for _, c := range codes {
				table, err := hex.DecodeString(c.Table)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range c.Lines {
					for off := r[0]; off < r[1]; off += 2 {
						var got int
						if strings.HasPrefix(version, "3.10.") {
							got = lineAt310(table, c.First, off)
						} else {
							got = lineAt311(table, c.First, off/2)
						}
						checked++
						if got != r[2] {
							if bad++; bad <= 10 {
								t.Errorf("%s at byte %d: line %d, want %d", c.Name, off, got, r[2])
							}
						}
					}
				}
			}
			if checked < 10000 {
				t.Errorf("only %d instructions checked", checked)
			}
			t.Logf("%d code objects, %d instructions", len(codes), checked)
		})
	}
}

// Each interpreter is found, with its version, whether libpython is linked
// into the executable (Debian) or a shared library (pyenv), and the layout
// checks out against its live thread state.
func TestFindInterp(t *testing.T) {
	testutil.RequireRoot(t)
	fs, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, py := range testutil.Pythons(t) {
		version := testutil.PythonVersion(t, py)
		t.Run(version+"/"+filepath.Base(py), func(t *testing.T) {
			cmd := testutil.Start(t, py, "-c", "import time; print('ready', flush=True); time.sleep(60)")
			pid := cmd.Process.Pid
			maps, err := fs.Maps(pid)
			if err != nil {
				t.Fatal(err)
			}
			in, err := findInterp("/proc", pid, maps)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(version, in.version) || in.version == "" {
				t.Errorf("version %q, want %s", in.version, version)
			}
			if in.codeType == 0 {
				t.Error("PyCode_Type not found")
			}
			if err := in.check(procMem(pid)); err != nil {
				t.Error(err)
			}
			// How far pthread_self() lies below the thread pointer: glibc's
			// sizeof(struct pthread), from the libc the process maps, on
			// arm64; the fs base itself (0) on x86_64.
			below, err := selfBelowTP("/proc", pid, maps, &elfPython{})
			if err != nil || below == 0 {
				t.Errorf("sizeof(struct pthread) %d, %v", below, err)
			}
			if want := map[bool]uint32{true: below}[nativeMachine == elf.EM_AARCH64]; in.selfBelowTP != want {
				t.Errorf("selfBelowTP %d, want %d", in.selfBelowTP, want)
			}
		})
	}
	// Not Python: nothing found, no error beyond that.
	cmd := testutil.Start(t, "/bin/sh", "-c", "echo ready; exec sleep 60")
	maps, err := fs.Maps(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := findInterp("/proc", cmd.Process.Pid, maps); err != errNoPython {
		t.Errorf("sh: %v, want errNoPython", err)
	}
}

func TestMerge(t *testing.T) {
	pyFrame := func(fn string, line int, end bool) Frame {
		return Frame{Frame: model.Frame{Kind: model.FramePython, Function: fn, File: "a.py", Line: line}, EvalEnd: end}
	}
	py := []Frame{pyFrame("inner", 3, false), pyFrame("outer", 9, true), pyFrame("<module>", 12, true)}
	frames := func(texts []string) []model.Frame {
		out := make([]model.Frame, len(texts))
		for i, s := range texts {
			out[i] = model.ParseFrame(s)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		native []string
		want   []string
	}{
		{"each eval frame replaced by its group, the interpreter's frames between groups left out",
			[]string{"__open64+0x51 (libc.so.6)", "_io_open+0x65 (libpython3.12.so)", "_PyEval_EvalFrameDefault+0x10 (libpython3.12.so)",
				"_PyEval_Vector+0x5 (libpython3.12.so)", "ffi_call+0x8f (libffi.so.8)", "_PyEval_EvalFrameDefault.cold+0x2 (libpython3.12.so)",
				"Py_RunMain+0x9 (libpython3.12.so)"},
			[]string{"__open64+0x51 (libc.so.6)", "_io_open+0x65 (libpython3.12.so)", "inner (a.py:3)", "outer (a.py:9)",
				"ffi_call+0x8f (libffi.so.8)", "<module> (a.py:12)", "Py_RunMain+0x9 (libpython3.12.so)"}},
		{"no eval frame: after the native frames",
			[]string{"__open64+0x51 (libc.so.6)", "_io_FileIO___init__+0x1a (python3.11)"},
			[]string{"__open64+0x51 (libc.so.6)", "_io_FileIO___init__+0x1a (python3.11)", "inner (a.py:3)", "outer (a.py:9)", "<module> (a.py:12)"}},
		{"fewer eval frames than groups: the rest after",
			[]string{"__open64+0x51 (libc.so.6)", "_PyEval_EvalFrameDefault+0x10 (python3)"},
			[]string{"__open64+0x51 (libc.so.6)", "inner (a.py:3)", "outer (a.py:9)", "<module> (a.py:12)"}},
	} {
		if got := Merge(frames(tc.native), py); !slices.Equal(got, frames(tc.want)) {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
	native := frames([]string{"a+0x1 (b)"})
	if got := Merge(native, nil); !slices.Equal(got, native) {
		t.Errorf("no Python frames: %q", got)
	}
}

func TestLayoutFromDebug(t *testing.T) {
	var d debugOffsets
	copy(d.Cookie[:], debugCookie)
	d.Version = 0x030d00f0
	d.Thread.ThreadID = 152
	d.Unicode.ASCIIObjectSize, d.Unicode.Length, d.Unicode.State = 40, 16, 32
	raw := make([]byte, debugOffsetsSize)
	if _, err := encode(raw, &d); err != nil {
		t.Fatal(err)
	}
	l, err := layoutFromDebug(raw)
	if err != nil || l.Minor != 13 || l.TstateThreadID != 152 {
		t.Fatalf("layout %+v, %v", l, err)
	}
	d.Version = 0x030e00f0
	_, _ = encode(raw, &d)
	if _, err := layoutFromDebug(raw); err == nil {
		t.Error("3.14's offsets accepted")
	}
	d.Version, d.FreeThreaded = 0x030d00f0, 1
	_, _ = encode(raw, &d)
	if _, err := layoutFromDebug(raw); err == nil {
		t.Error("a free-threaded build accepted")
	}
	// Crafted offsets (FuzzPyMemory's first find: a code object's
	// header of 1.7 TB, which the agent allocated before reading).
	d.FreeThreaded, d.Code.Filename = 0, 1<<40
	_, _ = encode(raw, &d)
	if _, err := layoutFromDebug(raw); err == nil {
		t.Error("a code object field 1 TiB in accepted")
	}
	d.Code.Filename, d.Unicode.State = 112, 40
	_, _ = encode(raw, &d)
	if _, err := layoutFromDebug(raw); err == nil {
		t.Error("a str's state past its header accepted")
	}
}

func encode(raw []byte, d *debugOffsets) (int, error) {
	return binary.Encode(raw, binary.LittleEndian, d)
}

// A process without Python is looked at again after a growing number of
// polls, and at once after it execs: a shell that execs Python later gets
// its frames at the next poll, not after the wait.
func TestRefreshAfterExec(t *testing.T) {
	testutil.RequireRoot(t)
	fs, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	procs, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: uint32(binary.Size(Proc{})), MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer procs.Close()
	tr := New(Maps{Procs: procs}, fs)
	py := testutil.Pythons(t)[0]
	dir := t.TempDir()
	gate := filepath.Join(dir, "go")
	cmd := testutil.Start(t, "/bin/sh", "-c", `echo ready; while [ ! -e "$0" ]; do sleep 0.01; done; exec "$1" -c "import time; time.sleep(60)"`, gate, py)
	pid := cmd.Process.Pid
	tr.Track(pid)
	// Polls without Python until the wait is the longest, just begun.
	for i := 0; tr.procs[pid].skip != maxSkip; i++ {
		if i == 100 {
			t.Fatalf("after %d polls without Python, a wait of %d polls", i, tr.procs[pid].wait)
		}
		tr.Refresh(pid, time.Now())
	}
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the shell to exec Python", func() bool {
		now, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		return now != exe
	})
	// One refresh a poll until the interpreter is initialized: a few
	// polls ("not initialized yet" is looked at every poll), far fewer
	// than the wait.
	for i := 0; tr.Version(pid) == ""; i++ {
		if i == maxSkip/2 {
			t.Fatalf("Python not found after %d polls of the exec", i)
		}
		// Measurement window: a poll interval; what is checked is how
		// many polls it takes, 50 ms apart.
		time.Sleep(50 * time.Millisecond)
		tr.Refresh(pid, time.Now())
	}
}
