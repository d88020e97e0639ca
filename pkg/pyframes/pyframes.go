// Package pyframes adds the Python frames of the calling thread to the stacks
// the concerns capture (CPython 3.10-3.13 on x86_64 and arm64): the user-space half of
// bpf/pyframes.h.
//
// For each tracked process it finds the interpreter (the ELF symbol
// _PyRuntime of the executable or of a mapped libpython3.X.so, through
// /proc/PID/root so containers work) and pushes its address and the layout
// of its version into the object's py_procs map: from a table per minor
// version for 3.10-3.12, from _PyRuntime.debug_offsets for 3.13. The BPF
// side records (code object, instruction) pairs per event; Frames resolves
// them into function, file and line by reading the process's memory (code
// objects are cached per process) and Merge places them among the native
// frames.
package pyframes

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// Maps are one BPF object's copies of the maps bpf/pyframes.h defines.
type Maps struct {
	Procs, Stacks, Errors *ebpf.Map
}

// Tracker keeps the interpreter of each tracked process known to one BPF
// object and resolves that object's Python stacks. Safe for concurrent use.
type Tracker struct {
	maps Maps
	fs   procinfo.FS

	mu    sync.Mutex
	procs map[int]*proc

	// panics counts the walks of a process's frames that panicked
	// (Frames): its memory is the process's to craft.
	panics atomic.Uint64
	// refused counts the code objects not read for being over a bound
	// (a name, file name or line table too long): not losses, the
	// process's own making.
	refused atomic.Uint64
}

type proc struct {
	in    *interp          // nil: no interpreter found (yet)
	err   string           // why not, as last logged
	codes map[uint64]*code // by code object address
	// panicked: a walk of its frames panicked, and was logged.
	panicked bool

	// With no interpreter mapped, the mappings are read again only when
	// the executable changed (an exec) or after skip more polls, a wait
	// that doubles up to maxSkip (a libpython loaded late): reading maps
	// at every poll for each process that runs no Python was a cost per
	// process and poll that did not scale with the node (issue 20).
	exe        fileKey
	skip, wait int
	tracked    time.Time // when Track looked
}

// maxSkip bounds the polls between two looks at a process that maps no
// interpreter, for one that loads libpython late.
const maxSkip = 32

// bpfBuf is PY_BUF: every read and field of the BPF side lies below it.
const bpfBuf = 256

// maxCodes bounds the code objects cached per process.
const maxCodes = 4096

// New returns a tracker filling m. fs reads /proc (its maps cache, if any,
// is shared with the concern).
func New(m Maps, fs procinfo.FS) *Tracker {
	return &Tracker{maps: m, fs: fs, procs: map[int]*proc{}}
}

// Track starts following pid: if it runs CPython, its events carry Python
// frames from now on. A process that does not (yet: `run` tracks it before
// exec) is looked at again by Refresh.
func (t *Tracker) Track(pid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs[pid] == nil {
		t.procs[pid] = &proc{}
	}
	p := t.procs[pid]
	p.tracked = time.Now()
	_ = t.detect(pid, p) // not found: Refresh looks again
}

// Refresh looks again at a tracked process once per poll, the poll that
// began at poll: for an interpreter when none was found (exec, a libpython
// loaded late), or whether the one found is still mapped (an exec replaces
// it). A process Track looked at during this poll is left as it is: the
// daemon tracks each process that starts, and most end within a poll.
func (t *Tracker) Refresh(pid int, poll time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.procs[pid]
	if p == nil || p.tracked.After(poll) {
		return
	}
	if p.in == nil && p.skip > 0 {
		if exe, err := exeOf(t.fs.Root(), pid); err == nil && exe == p.exe {
			p.skip--
			return
		}
	}
	if p.in != nil {
		maps, err := t.fs.Maps(pid)
		if err != nil {
			return // exited: keep what is known to resolve its stacks
		}
		for _, m := range maps {
			if uint64(m.StartAddr) == p.in.start && (fileKey{m.Dev, m.Inode}) == p.in.file {
				return
			}
		}
		_ = t.maps.Procs.Delete(uint32(pid))
		p.in, p.codes = nil, nil
	}
	if err := t.detect(pid, p); errors.Is(err, errNoPython) {
		p.wait = min(max(2*p.wait, 1), maxSkip)
		p.skip = p.wait
		p.exe, _ = exeOf(t.fs.Root(), pid)
	} else {
		p.wait, p.skip = 0, 0
	}
}

// Untrack forgets pid.
func (t *Tracker) Untrack(pid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	// Only an interpreter found has an entry: most processes have none,
	// and a delete is a syscall.
	if p := t.procs[pid]; p != nil && p.in != nil {
		_ = t.maps.Procs.Delete(uint32(pid))
	}
	delete(t.procs, pid)
}

// Version is the Python version found in pid ("3.11.2"), or "".
func (t *Tracker) Version(pid int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.procs[pid]; p != nil && p.in != nil {
		return p.in.version
	}
	return ""
}

// detect finds the interpreter of pid and tells the kernel, with t.mu held.
func (t *Tracker) detect(pid int, p *proc) error {
	maps, err := t.fs.Maps(pid)
	if err != nil {
		return err
	}
	in, err := findInterp(t.fs.Root(), pid, maps)
	if err == nil {
		err = in.check(procMem(pid))
	}
	if err != nil {
		if !errors.Is(err, errNoPython) && err.Error() != p.err {
			slog.Debug("no Python frames", "pid", pid, "err", err)
		}
		p.err = err.Error()
		return err
	}
	proc := in.layout.proc(in.runtime, in.selfBelowTP)
	if proc.TstateSize >= bpfBuf || proc.FrameSize >= bpfBuf {
		slog.Debug("no Python frames", "pid", pid, "err", "layout beyond the BPF side's buffer")
		return errors.New("layout beyond the BPF side's buffer")
	}
	if err := t.maps.Procs.Update(uint32(pid), &proc, ebpf.UpdateAny); err != nil {
		slog.Warn("no Python frames", "pid", pid, "err", err)
		return err
	}
	slog.Debug("Python frames", "pid", pid, "python", in.version)
	p.in, p.err, p.codes = in, "", map[uint64]*code{}
	return nil
}

// errNotReady: the interpreter is mapped but not initialized yet.
var errNotReady = errors.New("interpreter not initialized yet")

// check reads the interpreter's first thread through the layout: its
// interp must point back. A layout that does not fit (an unexpected build)
// is refused rather than walked.
func (in *interp) check(m memory) error {
	l := in.layout
	head, err := readU64(m, in.runtime+uint64(l.InterpHead))
	if err != nil {
		return err
	}
	if head == 0 {
		return errNotReady
	}
	ts, err := readU64(m, head+uint64(l.InterpThreads))
	if err != nil {
		return err
	}
	if ts == 0 {
		return errNotReady
	}
	back, err := readU64(m, ts+uint64(l.TstateInterp))
	if err != nil {
		return err
	}
	if back != head {
		return fmt.Errorf("Python %s: thread state does not point to its interpreter: unexpected layout", in.version)
	}
	return nil
}

func readU64(m memory, addr uint64) (uint64, error) {
	var b [8]byte
	if err := m.read(addr, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// Frame is one Python frame: Function is co_qualname (3.11+) or co_name
// (3.10), File co_filename, Line 0 when the line table has none.
type Frame struct {
	model.Frame
	// EvalEnd marks the outermost frame of one call of the evaluation
	// loop: the frames up to it replace one _PyEval_EvalFrameDefault frame.
	EvalEnd bool
}

// Frames resolves Python stack id of pid (0: none), innermost first. Frames
// that cannot be read (the process exited before its code objects were
// cached, a code object freed since) are left out.
func (t *Tracker) Frames(pid int, id uint32) []Frame {
	if id == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.procs[pid]
	if p == nil || p.in == nil {
		return nil
	}
	return t.contained(pid, p, id)
}

// contained walks stack id of p, whose memory and code objects the process
// controls: a panic reading them costs this stack's Python frames, is
// counted and logged once per process, and leaves the agent running. The
// code objects cached are dropped, in case one of them caused it.
func (t *Tracker) contained(pid int, p *proc, id uint32) (out []Frame) {
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		out = nil
		t.panics.Add(1)
		p.codes = nil
		if !p.panicked {
			p.panicked = true
			slog.Warn("reading a process's Python frames panicked; its Python frames are left out",
				"pid", pid, "panic", v)
		}
	}()
	if panicHook != nil {
		panicHook(pid)
	}
	return t.walk(pid, p, id)
}

// panicHook, when set by a test, runs in every walk of a process's frames;
// parseHook in every parsing of a mapped file.
var (
	panicHook func(pid int)
	parseHook func(f *os.File)
)

// walk resolves the frames of stack id of p.
func (t *Tracker) walk(pid int, p *proc, id uint32) []Frame {
	var st Stack
	if err := t.maps.Stacks.Lookup(id, &st); err != nil {
		return nil
	}
	return t.frames(procMem(pid), p, &st)
}

// frames resolves the frames of st, a stack of p, reading m: at most
// MaxFrames, each at most one code object's header, two strings of at most
// maxString characters and a line table of at most maxTable bytes.
func (t *Tracker) frames(m memory, p *proc, st *Stack) []Frame {
	l := p.in.layout
	var out []Frame
	for i := 0; i < int(min(st.N, MaxFrames)); i++ {
		instr := st.Instr[i]
		addr, owner, entry := instr&(1<<48-1), byte(instr>>48), byte(instr>>56)
		if l.FrameOwner != none && owner == frameOwnedByCStack {
			// A 3.12+ shim: the frame before it was its call's first.
			if n := len(out); n > 0 {
				out[n-1].EvalEnd = true
			}
			continue
		}
		f, ok := t.frame(m, p, st.Code[i], addr)
		if !ok {
			continue
		}
		f.EvalEnd = l.Minor == 10 || (l.FrameEntry != none && entry != 0)
		out = append(out, f)
	}
	return out
}

// frameOwnedByCStack is FRAME_OWNED_BY_CSTACK (3.12+).
const frameOwnedByCStack = 3

// frame resolves one (code object, instruction) pair.
func (t *Tracker) frame(m memory, p *proc, codeAddr, instr uint64) (Frame, bool) {
	c, ok := t.code(m, p, codeAddr)
	if !ok {
		return Frame{}, false
	}
	l := p.in.layout
	line := c.first
	if l.Minor == 10 {
		if lasti := int32(uint32(instr)); lasti >= 0 {
			line = lineAt310(c.table, c.first, 2*int(lasti))
		}
	} else if start := codeAddr + l.CodeAdaptive; instr >= start && instr-start < 1<<30 {
		line = lineAt311(c.table, c.first, int((instr-start)/2))
	}
	return Frame{Frame: model.Frame{Kind: model.FramePython, Function: c.name, File: c.file, Line: max(line, 0)}}, true
}

// code is what a code object says, cached with the fields that identify it.
type code struct {
	id         [4]uint64 // filename, name, linetable, firstlineno as read
	name, file string
	first      int
	table      []byte
}

// code reads the code object at addr, through the cache. The object's
// header is read each time (one small read) and compared with the cached
// one, so a freed and reused address does not answer with stale names;
// once the process is gone, the cached one answers.
func (t *Tracker) code(m memory, p *proc, addr uint64) (*code, bool) {
	l := p.in.layout
	nameOff := l.CodeQualname
	if nameOff == 0 {
		nameOff = l.CodeName
	}
	hdr := make([]byte, max(l.ObType, l.CodeFilename, nameOff, l.CodeLinetable, l.CodeFirstLine)+8)
	if addr == 0 {
		return nil, false
	}
	if err := m.read(addr, hdr); err != nil {
		// Gone (the process exited): what was read while it lived.
		c := p.codes[addr]
		return c, c != nil
	}
	u64 := func(off uint64) uint64 { return binary.LittleEndian.Uint64(hdr[off:]) }
	if p.in.codeType != 0 && u64(l.ObType) != p.in.codeType {
		return nil, false // not a code object (a stale or torn frame)
	}
	first := int(int32(binary.LittleEndian.Uint32(hdr[l.CodeFirstLine:])))
	id := [4]uint64{u64(l.CodeFilename), u64(nameOff), u64(l.CodeLinetable), uint64(first)}
	if c := p.codes[addr]; c != nil && c.id == id {
		return c, true
	}
	file, err1 := readUnicode(m, l, id[0])
	name, err2 := readUnicode(m, l, id[1])
	table, err3 := readBytes(m, l, id[2])
	if err := errors.Join(err1, err2, err3); err != nil {
		if errors.Is(err, errOverBound) {
			t.refused.Add(1)
		}
		return nil, false
	}
	c := &code{id: id, name: name, file: file, first: first, table: table}
	if len(p.codes) >= maxCodes {
		clear(p.codes)
	}
	if p.codes == nil {
		p.codes = map[uint64]*code{}
	}
	p.codes[addr] = c
	return c, true
}

// Longest string (in characters) and line table read: a code object
// whose name, file name or line table is longer is refused (counted, its
// frame left out). Real names and file names run to dozens of
// characters, line tables to a few bytes per line of the function.
const (
	maxString = 4096
	maxTable  = 1 << 20
)

// errOverBound: an object is longer than what is read of one.
var errOverBound = errors.New("over the bound of what is read")

// readUnicode reads a compact str object (every name and file name is one).
func readUnicode(m memory, l Layout, addr uint64) (string, error) {
	if addr == 0 {
		return "", errors.New("NULL string")
	}
	hdr := make([]byte, l.CompactSize)
	if err := m.read(addr, hdr); err != nil {
		return "", err
	}
	n := binary.LittleEndian.Uint64(hdr[l.UnicodeLength:])
	state := binary.LittleEndian.Uint32(hdr[l.UnicodeState:])
	kind, compact, ascii := state>>2&7, state>>5&1 == 1, state>>6&1 == 1
	if !compact {
		return "", fmt.Errorf("unsupported str object at %#x", addr)
	}
	if n > maxString {
		return "", fmt.Errorf("str of %d characters at %#x: %w", n, addr, errOverBound)
	}
	if ascii {
		b := make([]byte, n)
		err := m.read(addr+l.ASCIISize, b)
		return string(b), err
	}
	if kind != 1 && kind != 2 && kind != 4 {
		return "", fmt.Errorf("str of kind %d at %#x", kind, addr)
	}
	b := make([]byte, n*uint64(kind))
	if err := m.read(addr+l.CompactSize, b); err != nil {
		return "", err
	}
	r := make([]rune, n)
	for i := range r {
		switch kind {
		case 1:
			r[i] = rune(b[i])
		case 2:
			r[i] = rune(binary.LittleEndian.Uint16(b[2*i:]))
		case 4:
			r[i] = rune(binary.LittleEndian.Uint32(b[4*i:]))
		}
	}
	return string(r), nil // a lone surrogate becomes U+FFFD
}

// readBytes reads a bytes object.
func readBytes(m memory, l Layout, addr uint64) ([]byte, error) {
	if addr == 0 {
		return nil, errors.New("NULL bytes")
	}
	n, err := readU64(m, addr+l.BytesSize)
	if err != nil {
		return nil, err
	}
	if n > maxTable {
		return nil, fmt.Errorf("bytes of %d at %#x: %w", n, addr, errOverBound)
	}
	b := make([]byte, n)
	return b, m.read(addr+l.BytesData, b)
}

// errNames names the py_errors counters (enum py_err).
var errNames = []string{"py_read_user", "py_collision", "py_store"}

// Lost returns the BPF side's counters, named prefix + "_" + reason, and
// the walks and file parsings that panicked (prefix + "_py_panics").
func (t *Tracker) Lost(prefix string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(errNames))
	for k, name := range errNames {
		var per []uint64
		if err := t.maps.Errors.Lookup(uint32(k), &per); err != nil {
			return nil, fmt.Errorf("reading Python frame counters: %w", err)
		}
		var sum uint64
		for _, v := range per {
			sum += v
		}
		out[prefix+"_"+name] = sum
	}
	out[prefix+"_py_panics"] = t.panics.Load() + elfPanics.Load()
	return out, nil
}

// Refused is how many code objects were not read for being over a bound
// (maxString, maxTable): their frames are left out. Not among Lost: a
// process can make them, and nothing the tool could keep was dropped.
func (t *Tracker) Refused() uint64 { return t.refused.Load() }
