package symbolize

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/pyframes"
	"github.com/open-autoglm/autoglm-ebpf/pkg/report"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// frameTexts symbolizes addrs of pid and writes the frames as text.
func frameTexts(s *Symbolizer, pid int, addrs []uint64) []string {
	return testutil.Texts(s.Frames(pid, addrs))
}

// The frames of a stack through a C++ library (mangled symbols) and a
// Python interpreter, with Python frames merged in, as the JSON report
// writes them.
func TestReportFrames(t *testing.T) {
	const (
		mangled = "_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator11alloc_blockERNS2_10AllocParamsEb"
		pid     = 500
	)
	lib := func(names ...string) genELF {
		var syms []genSym
		for i, name := range names {
			syms = append(syms, genSym{name: name, value: 0x1000 + uint64(i)*0x100, size: 0x100, typ: elf.STT_FUNC, shndx: genTextShndx(0)})
		}
		return genELF{class: elf.ELFCLASS64, texts: []genText{{addr: 0x1000, size: 0x1000}}, symtab: slices.Values(syms)}
	}
	root := t.TempDir()
	c10 := mapLib(t, root, pid, "/opt/torch/lib/libc10_cuda.so", 1, 0x7f0000000000, lib("cudaMalloc", mangled))
	python := mapLib(t, root, pid, "/usr/bin/python3.12", 2, 0x7f1000000000, lib("_PyEval_EvalFrameDefault", "Py_RunMain"))

	native := New(root).Frames(pid, []uint64{
		c10.addr(0, 0x1040),    // cudaMalloc+0x40
		c10.addr(0, 0x1140),    // the C++ function +0x40
		c10.addr(0, 0x1f00),    // no symbol
		python.addr(0, 0x1010), // replaced by the Python frames
		python.addr(0, 0x1100), // Py_RunMain at its start
		0x10,                   // not mapped
	})
	py := []pyframes.Frame{{Frame: model.Frame{Kind: model.FramePython, Function: "Loader.load", File: "/srv/app/serve.py", Line: 88}, EvalEnd: true}}
	stack := pyframes.Merge(native, py)

	wantText := []string{"cudaMalloc+0x40 (libc10_cuda.so)",
		"c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block+0x40 (libc10_cuda.so)",
		"libc10_cuda.so+0x1f00", "Loader.load (/srv/app/serve.py:88)", "Py_RunMain (python3.12)", "0x10"}
	if got := testutil.Texts(stack); !slices.Equal(got, wantText) {
		t.Errorf("stack\n %q\nwant\n %q", got, wantText)
	}

	path := filepath.Join(t.TempDir(), "report.json")
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	f := model.Finding{Kind: model.KindGPUMemoryLeak, PID: pid, FirstSeen: t0, LastSeen: t0, Active: true, Stack: stack}
	if err := report.New("v-test", report.Outputs{JSON: path}).Close(&model.Snapshot{Time: t0, Start: t0, Findings: []model.Finding{f}}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		SchemaVersion int `json:"schema_version"`
		Findings      []struct {
			Stack json.RawMessage `json:"stack"`
		} `json:"findings"`
	}
	if err := json.Unmarshal(data, &r); err != nil || len(r.Findings) != 1 {
		t.Fatalf("report %s: %v", data, err)
	}
	var got bytes.Buffer
	if err := json.Compact(&got, r.Findings[0].Stack); err != nil {
		t.Fatal(err)
	}
	// The mapped files' paths as the process names them (its root's);
	// these fake libraries have no build-id.
	want := `[{"function":"cudaMalloc","kind":"native","module":"libc10_cuda.so","offset":64,"path":"/opt/torch/lib/libc10_cuda.so"},` +
		`{"function":"c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block","kind":"native","module":"libc10_cuda.so","offset":64,"path":"/opt/torch/lib/libc10_cuda.so","symbol":"` + mangled + `"},` +
		`{"kind":"native","module":"libc10_cuda.so","offset":7936,"path":"/opt/torch/lib/libc10_cuda.so"},` +
		`{"file":"/srv/app/serve.py","function":"Loader.load","kind":"python","line":88},` +
		`{"function":"Py_RunMain","kind":"native","module":"python3.12","path":"/usr/bin/python3.12"},` +
		`{"address":16,"kind":"native"}]`
	if r.SchemaVersion != 3 || got.String() != want {
		t.Errorf("schema %d, stack\n %s\nwant\n %s", r.SchemaVersion, got.String(), want)
	}
}
