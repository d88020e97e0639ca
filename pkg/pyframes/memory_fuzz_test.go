package pyframes

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

var update = flag.Bool("update", false, "rewrite testdata/fuzz/FuzzPyMemory's snapshots from the live interpreters")

// snapshot is a process's memory as a fuzz input holds it: regions one
// after another, each its address (8 bytes), its length (2 bytes) and its
// bytes; the last one ends with the input. Any bytes are a snapshot. A read
// outside one region fails, as process_vm_readv fails on unmapped memory.
type snapshot struct {
	regions []region
	// What was read, for the bounds a walk must keep.
	reads, bytes, largest int
}

type region struct {
	addr uint64
	b    []byte
}

func parseSnapshot(data []byte) *snapshot {
	s := &snapshot{}
	for len(data) >= 10 {
		addr, n := binary.LittleEndian.Uint64(data), int(binary.LittleEndian.Uint16(data[8:]))
		data = data[10:]
		n = min(n, len(data))
		s.regions = append(s.regions, region{addr, data[:n]})
		data = data[n:]
	}
	return s
}

func (s *snapshot) encode() []byte {
	var out []byte
	for _, r := range s.regions {
		out = binary.LittleEndian.AppendUint64(out, r.addr)
		out = binary.LittleEndian.AppendUint16(out, uint16(len(r.b)))
		out = append(out, r.b...)
	}
	return out
}

func (s *snapshot) read(addr uint64, buf []byte) error {
	s.reads++
	s.bytes += len(buf)
	s.largest = max(s.largest, len(buf))
	for _, r := range s.regions {
		if addr >= r.addr && addr-r.addr <= uint64(len(r.b)) && uint64(len(buf)) <= uint64(len(r.b))-(addr-r.addr) {
			copy(buf, r.b[addr-r.addr:])
			return nil
		}
	}
	return fmt.Errorf("%d bytes at %#x: not in the snapshot", len(buf), addr)
}

// recorder reads a live process's memory and keeps what it read.
type recorder struct {
	mem  memory
	snap snapshot
}

func (r *recorder) read(addr uint64, buf []byte) error {
	if err := r.mem.read(addr, buf); err != nil {
		return err
	}
	if len(buf) > 0 && !slices.ContainsFunc(r.snap.regions, func(g region) bool { return g.addr == addr && len(g.b) == len(buf) }) {
		r.snap.regions = append(r.snap.regions, region{addr, slices.Clone(buf)})
	}
	return nil
}

// pyStack is the script's own view of its stack: for each frame, innermost
// first, its code object's address, f_lasti (bytes), the function name
// the tool shows, its file and line.
const pyStack = `
import json, sys, time
def capture():
    out, f = [], sys._getframe(1)
    while f:
        co = f.f_code
        out.append({"code": id(co), "lasti": f.f_lasti, "function": getattr(co, "co_qualname", co.co_name),
                    "file": co.co_filename, "line": f.f_lineno})
        f = f.f_back
    with open(sys.argv[1], "w") as w:
        json.dump(out, w)
    print("ready", flush=True)
    time.sleep(60)
def 𐀀():
    capture()
def 处理():
    𐀀()
def naïve():
    处理()
class Worker:
    def step(self):
        naïve()
Worker().step()
`

// The frames read from a live interpreter's memory (3.10-3.13: Latin-1,
// UCS-2 and UCS-4 names, a method's qualified name) are those it gives of
// itself, and read again from a snapshot of what was read, the same. With
// -update the snapshots are written as FuzzPyMemory's seeds.
func TestFramesFromMemory(t *testing.T) {
	testutil.RequireRoot(t)
	fs, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, py := range testutil.Pythons(t) {
		version := testutil.PythonVersion(t, py)
		t.Run(version+"/"+filepath.Base(py), func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "stack.json")
			cmd := testutil.Start(t, py, "-c", pyStack, out)
			pid := cmd.Process.Pid
			raw, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var own []struct {
				Code, Lasti    uint64
				Function, File string
				Line           int
			}
			if err := json.Unmarshal(raw, &own); err != nil {
				t.Fatal(err)
			}
			maps, err := fs.Maps(pid)
			if err != nil {
				t.Fatal(err)
			}
			in, err := findInterp("/proc", pid, maps)
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{mem: procMem(pid)}
			// Again through the recorder: 3.13's offsets are read here.
			if err := in.setLayout(rec, &elfPython{minor: in.layout.Minor}); err != nil {
				t.Fatal(err)
			}
			if err := in.check(rec); err != nil {
				t.Fatal(err)
			}
			var st Stack
			var want []model.Frame
			for i, f := range own {
				// What the BPF side records: 3.10's f_lasti in code
				// units, later versions' instruction pointer.
				st.Code[i] = f.Code
				if in.layout.Minor == 10 {
					st.Instr[i] = f.Lasti / 2
				} else {
					st.Instr[i] = f.Code + in.layout.CodeAdaptive + f.Lasti
				}
				want = append(want, model.Frame{Kind: model.FramePython, Function: f.Function, File: f.File, Line: f.Line})
			}
			st.N = uint32(len(own))
			tr, p := newTestTracker()
			if got := frameList(tr, p, in, rec, &st); !slices.Equal(got, want) {
				t.Fatalf("frames from memory:\n got %q\nwant %q", got, want)
			}
			snap := rec.snap.encode()
			tr, p = newTestTracker()
			if got := frameList(tr, p, in, parseSnapshot(snap), &st); !slices.Equal(got, want) {
				t.Fatalf("frames from the snapshot of %d bytes:\n got %q\nwant %q", len(snap), got, want)
			}
			if *update {
				writeSeed(t, "python"+version, in, snap, &st)
			}
		})
	}
}

func newTestTracker() (*Tracker, *proc) { return &Tracker{}, &proc{} }

func frameList(tr *Tracker, p *proc, in *interp, m memory, st *Stack) []model.Frame {
	p.in = in
	var out []model.Frame
	for _, f := range tr.frames(m, p, st) {
		out = append(out, f.Frame)
	}
	return out
}

// writeSeed writes a snapshot as a FuzzPyMemory input: its arguments in
// Go's corpus file format.
func writeSeed(t *testing.T, name string, in *interp, snap []byte, st *Stack) {
	path := filepath.Join("testdata", "fuzz", "FuzzPyMemory", name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	text := fmt.Sprintf("go test fuzz v1\nuint8(%d)\nuint64(%d)\nuint64(%d)\n[]byte(%q)\n[]byte(%q)\n",
		in.layout.Minor, in.runtime, in.codeType, snap, encodeStack(st))
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// encodeStack and decodeStack write a Stack as a fuzz input has it: (code,
// instr) pairs of 8 bytes each, innermost first. Any bytes are a stack,
// N their pairs, even beyond MaxFrames.
func encodeStack(st *Stack) []byte {
	var out []byte
	for i := range min(st.N, MaxFrames) {
		out = binary.LittleEndian.AppendUint64(out, st.Code[i])
		out = binary.LittleEndian.AppendUint64(out, st.Instr[i])
	}
	return out
}

func decodeStack(b []byte) *Stack {
	st := &Stack{N: uint32(len(b) / 16)}
	for i := range min(int(st.N), MaxFrames) {
		st.Code[i] = binary.LittleEndian.Uint64(b[16*i:])
		st.Instr[i] = binary.LittleEndian.Uint64(b[16*i+8:])
	}
	return st
}

// FuzzPyMemory reads a Python stack as Frames does, from any memory the
// process could present: an interpreter (3.13's offsets read from it) with
// pointers anywhere, cycles, huge lengths. It must not panic (contained is
// the last resort, not the plan), and what it reads is bounded whatever the
// memory says: at most MaxFrames frames, each a code object's header, two
// strings of maxString characters and a line table of maxTable bytes.
//
//	go test -run '^$' -fuzz FuzzPyMemory ./pkg/pyframes
func FuzzPyMemory(f *testing.F) {
	// The committed seeds are snapshots of live interpreters
	// (TestFramesFromMemory -update); these, the smallest cases.
	f.Add(uint8(11), uint64(0x1000), uint64(0), []byte{}, []byte{})
	var d debugOffsets
	copy(d.Cookie[:], debugCookie)
	d.Version = 0x030d00f0
	d.Unicode.ASCIIObjectSize, d.Unicode.Length, d.Unicode.State = 40, 16, 32
	raw := make([]byte, debugOffsetsSize)
	if _, err := binary.Encode(raw, binary.LittleEndian, &d); err != nil {
		f.Fatal(err)
	}
	rt := (&snapshot{regions: []region{{0x1000, raw}}}).encode()
	f.Add(uint8(13), uint64(0x1000), uint64(0), rt, slices.Repeat([]byte{0x00, 0x10, 0, 0, 0, 0, 0, 0}, 2*MaxFrames+2))
	f.Fuzz(func(t *testing.T, minor uint8, runtime, codeType uint64, mem, stack []byte) {
		snap := parseSnapshot(mem)
		in := &interp{runtime: runtime, codeType: codeType}
		switch v := 10 + int(minor%4); v {
		case 13:
			if err := in.setLayout(snap, &elfPython{minor: v}); err != nil {
				return
			}
		default:
			in.layout = layouts[v]
		}
		// Frames are read only once check has passed; read them
		// whatever it says, for the code objects' sake.
		_ = in.check(snap)
		st := decodeStack(stack)
		tr, p := newTestTracker()
		first := frameList(tr, p, in, snap, st)
		if len(first) > MaxFrames {
			t.Fatalf("%d frames", len(first))
		}
		for _, fr := range first {
			if utf8.RuneCountInString(fr.Function) > maxString || utf8.RuneCountInString(fr.File) > maxString || fr.Line < 0 {
				t.Fatalf("frame %+v", fr)
			}
		}
		// Each frame: a code object's header, two strings' headers and
		// characters, a line table's size and bytes; and check's reads.
		if snap.reads > 3+1+6*MaxFrames || snap.largest > max(maxTable, 4*maxString) {
			t.Fatalf("%d reads, the largest %d bytes", snap.reads, snap.largest)
		}
		// The same memory, through the cache: the same frames.
		if again := frameList(tr, p, in, snap, st); !slices.EqualFunc(again, first, func(a, b model.Frame) bool { return a == b }) {
			t.Fatalf("read again, frames %q; first %q", again, first)
		}
	})
}

// A code object whose name or line table is over the bound is refused
// and counted; its frame is left out and the next one still read.
func TestCodeOverBoundRefused(t *testing.T) {
	l := layouts[11]
	const codeAddr, strAddr, longAddr, tableAddr, hugeAddr = 0x10000, 0x20000, 0x30000, 0x40000, 0x50000
	str := func(n int) []byte {
		b := make([]byte, max(l.CompactSize, l.ASCIISize+uint64(n)))
		binary.LittleEndian.PutUint64(b[l.UnicodeLength:], uint64(n))
		binary.LittleEndian.PutUint32(b[l.UnicodeState:], 1<<5|1<<6|1<<2) // compact ASCII
		copy(b[l.ASCIISize:], strings.Repeat("f", n))
		return b
	}
	bytesObj := func(n uint64) []byte {
		b := make([]byte, l.BytesData+1)
		binary.LittleEndian.PutUint64(b[l.BytesSize:], n)
		return b
	}
	code := func(name, table uint64) []byte {
		b := make([]byte, l.CodeAdaptive)
		binary.LittleEndian.PutUint64(b[l.CodeFilename:], strAddr)
		binary.LittleEndian.PutUint64(b[l.CodeQualname:], name)
		binary.LittleEndian.PutUint64(b[l.CodeLinetable:], table)
		binary.LittleEndian.PutUint32(b[l.CodeFirstLine:], 7)
		return b
	}
	snap := &snapshot{regions: []region{
		{codeAddr, code(strAddr, tableAddr)},
		{codeAddr + 0x100, code(longAddr, tableAddr)},
		{codeAddr + 0x200, code(strAddr, hugeAddr)},
		{strAddr, str(1)},
		{longAddr, str(maxString + 1)},
		{tableAddr, bytesObj(0)},
		{hugeAddr, bytesObj(maxTable + 1)},
	}}
	st := &Stack{N: 3, Code: [MaxFrames]uint64{codeAddr + 0x100, codeAddr + 0x200, codeAddr}}
	tr, p := newTestTracker()
	got := frameList(tr, p, &interp{layout: l}, snap, st)
	want := []model.Frame{{Kind: model.FramePython, Function: "f", File: "f", Line: 7}}
	if !slices.Equal(got, want) || tr.Refused() != 2 {
		t.Errorf("frames %q, %d refused; want %q, 2", got, tr.Refused(), want)
	}
	if _, err := readBytes(snap, l, hugeAddr); !errors.Is(err, errOverBound) {
		t.Errorf("a table of %d bytes: %v", maxTable+1, err)
	}
}
