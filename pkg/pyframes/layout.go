package pyframes

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"reflect"
	"strings"
)

// none is the offset of a field a version lacks (PY_NONE in bpf/pyframes.h).
const none = 0xffff

// Layout is where the fields the tool reads lie in one CPython minor
// version's structures (release builds, x86_64 and arm64: both LP64, and no
// field the tool reads follows one whose size differs between them, such as
// a pthread mutex), in bytes.
type Layout struct {
	Minor int // 3.Minor

	// Interpreter and thread state, read by the BPF side.
	InterpHead     uint16 // _PyRuntime.interpreters.head
	InterpNext     uint16 // PyInterpreterState.next
	InterpThreads  uint16 // PyInterpreterState.threads.head (3.10 tstate_head)
	TstateNext     uint16 // PyThreadState.next
	TstateInterp   uint16 // PyThreadState.interp: checks the layout
	TstateThreadID uint16 // PyThreadState.thread_id (pthread_self())
	TstateFrame    uint16 // 3.10 frame, 3.11-3.12 cframe, 3.13 current_frame
	CFrameFrame    uint16 // 3.11-3.12 _PyCFrame.current_frame; none
	FrameCode      uint16 // f_code, 3.13 f_executable
	FramePrevious  uint16 // previous, 3.10 f_back
	FrameInstr     uint16 // prev_instr, 3.13 instr_ptr, 3.10 f_lasti (int)
	FrameOwner     uint16 // owner (char); none on 3.10
	FrameEntry     uint16 // 3.11 is_entry (bool); none elsewhere

	// Code objects and the objects they point to, read by user space.
	CodeFilename  uint64
	CodeName      uint64
	CodeQualname  uint64 // 3.11+; 0 on 3.10 (co_name is used)
	CodeFirstLine uint64 // int
	CodeLinetable uint64
	CodeAdaptive  uint64 // 3.11+: first code unit of the bytecode
	ObType        uint64 // PyObject.ob_type
	BytesSize     uint64 // PyVarObject.ob_size of bytes
	BytesData     uint64 // PyBytesObject.ob_sval
	UnicodeLength uint64 // PyASCIIObject.length
	UnicodeState  uint64 // PyASCIIObject.state
	ASCIISize     uint64 // sizeof(PyASCIIObject): data of compact ASCII strings
	CompactSize   uint64 // sizeof(PyCompactUnicodeObject): data of other compact strings
}

// Fixed layouts of 3.10-3.12 as the release builds' headers give them
// (offsetof with the internal headers of 3.10.13, 3.11.2 (Debian 12),
// 3.11.7 and 3.12.1, as py-spy ships bindings per version). 3.13 and later
// publish their own offsets in _PyRuntime.debug_offsets.
var layouts = map[int]Layout{
	10: {
		Minor:      10,
		InterpHead: 32, InterpNext: 0, InterpThreads: 8,
		TstateNext: 8, TstateInterp: 16, TstateThreadID: 176, TstateFrame: 24, CFrameFrame: none,
		FrameCode: 32, FramePrevious: 24, FrameInstr: 96, FrameOwner: none, FrameEntry: none,
		CodeFilename: 104, CodeName: 112, CodeFirstLine: 40, CodeLinetable: 120,
		ObType: 8, BytesSize: 16, BytesData: 32,
		UnicodeLength: 16, UnicodeState: 32, ASCIISize: 48, CompactSize: 72,
	},
	11: {
		Minor:      11,
		InterpHead: 40, InterpNext: 0, InterpThreads: 16,
		TstateNext: 8, TstateInterp: 16, TstateThreadID: 152, TstateFrame: 56, CFrameFrame: 8,
		FrameCode: 32, FramePrevious: 48, FrameInstr: 56, FrameOwner: 69, FrameEntry: 68,
		CodeFilename: 112, CodeName: 120, CodeQualname: 128, CodeFirstLine: 72, CodeLinetable: 136, CodeAdaptive: 184,
		ObType: 8, BytesSize: 16, BytesData: 32,
		UnicodeLength: 16, UnicodeState: 32, ASCIISize: 48, CompactSize: 72,
	},
	12: {
		Minor:      12,
		InterpHead: 40, InterpNext: 0, InterpThreads: 72,
		TstateNext: 8, TstateInterp: 16, TstateThreadID: 136, TstateFrame: 56, CFrameFrame: 0,
		FrameCode: 0, FramePrevious: 8, FrameInstr: 56, FrameOwner: 70, FrameEntry: none,
		CodeFilename: 112, CodeName: 120, CodeQualname: 128, CodeFirstLine: 68, CodeLinetable: 136, CodeAdaptive: 192,
		ObType: 8, BytesSize: 16, BytesData: 32,
		UnicodeLength: 16, UnicodeState: 32, ASCIISize: 40, CompactSize: 56,
	},
}

// debugCookie starts _PyRuntime (its debug_offsets) from 3.13 on.
var debugCookie = []byte("xdebugpy")

// debugOffsets is the start of _Py_DebugOffsets as 3.13 lays it out: every
// field a uint64.
type debugOffsets struct {
	Cookie       [8]byte
	Version      uint64 // PY_VERSION_HEX
	FreeThreaded uint64
	Runtime      struct{ Size, Finalizing, InterpretersHead uint64 }
	Interp       struct {
		Size, ID, Next, ThreadsHead, GC, ImportsModules, Sysdict, Builtins, CevalGIL uint64
		GILRuntimeState, GILEnabled, GILLocked, GILHolder                            uint64
	}
	Thread struct {
		Size, Prev, Next, Interp, CurrentFrame, ThreadID, NativeThreadID, DatastackChunk, Status uint64
	}
	Frame struct{ Size, Previous, Executable, InstrPtr, Localsplus, Owner uint64 }
	Code  struct {
		Size, Filename, Name, Qualname, Linetable, Firstlineno, Argcount, Localsplusnames, Localspluskinds, CodeAdaptive uint64
	}
	PyObject struct{ Size, ObType uint64 }
	Type     struct{ Size, TpName, TpRepr, TpFlags uint64 }
	Tuple    struct{ Size, ObItem, ObSize uint64 }
	List     struct{ Size, ObItem, ObSize uint64 }
	Dict     struct{ Size, MaKeys, MaValues uint64 }
	Float    struct{ Size, ObFval uint64 }
	Long     struct{ Size, LvTag, ObDigit uint64 }
	Bytes    struct{ Size, ObSize, ObSval uint64 }
	Unicode  struct{ Size, State, Length, ASCIIObjectSize uint64 }
}

// debugOffsetsSize is how much of _PyRuntime a 3.13 layout is read from.
var debugOffsetsSize = binary.Size(debugOffsets{})

// layoutFromDebug builds the layout of 3.13 from the offsets the runtime
// publishes. Later versions changed the structure and are refused, as are
// free-threaded builds (other object layouts).
func layoutFromDebug(raw []byte) (Layout, error) {
	var d debugOffsets
	if _, err := binary.Decode(raw, binary.LittleEndian, &d); err != nil {
		return Layout{}, err
	}
	if !bytes.Equal(d.Cookie[:], debugCookie) {
		return Layout{}, fmt.Errorf("no debug offsets in _PyRuntime")
	}
	major, minor := int(d.Version>>24&0xff), int(d.Version>>16&0xff)
	if major != 3 || minor != 13 {
		return Layout{}, fmt.Errorf("Python %d.%d is not supported (3.10-3.13)", major, minor)
	}
	if d.FreeThreaded != 0 {
		return Layout{}, fmt.Errorf("free-threaded Python 3.%d is not supported", minor)
	}
	// The offsets are the process's to craft: user space allocates the
	// headers they span (a code object's, a str's) before reading them, so
	// each is bounded as the BPF side's are, and a str's fields must lie in
	// its header. Real ones are below 256.
	offsets := []uint64{d.Runtime.InterpretersHead, d.Interp.Next, d.Interp.ThreadsHead, d.Thread.Next, d.Thread.Interp, d.Thread.ThreadID,
		d.Thread.CurrentFrame, d.Frame.Executable, d.Frame.Previous, d.Frame.InstrPtr, d.Frame.Owner,
		d.Code.Filename, d.Code.Name, d.Code.Qualname, d.Code.Linetable, d.Code.Firstlineno, d.Code.CodeAdaptive,
		d.PyObject.ObType, d.Bytes.ObSize, d.Bytes.ObSval, d.Unicode.Length, d.Unicode.State, d.Unicode.ASCIIObjectSize}
	for _, v := range offsets {
		if v >= none {
			return Layout{}, fmt.Errorf("implausible debug offset %d", v)
		}
	}
	if d.Unicode.Length+8 > d.Unicode.ASCIIObjectSize || d.Unicode.State+4 > d.Unicode.ASCIIObjectSize {
		return Layout{}, fmt.Errorf("implausible str layout: length at %d, state at %d of %d bytes", d.Unicode.Length, d.Unicode.State, d.Unicode.ASCIIObjectSize)
	}
	return Layout{
		Minor:      minor,
		InterpHead: uint16(d.Runtime.InterpretersHead), InterpNext: uint16(d.Interp.Next), InterpThreads: uint16(d.Interp.ThreadsHead),
		TstateNext: uint16(d.Thread.Next), TstateInterp: uint16(d.Thread.Interp), TstateThreadID: uint16(d.Thread.ThreadID), TstateFrame: uint16(d.Thread.CurrentFrame),
		CFrameFrame: none,
		FrameCode:   uint16(d.Frame.Executable), FramePrevious: uint16(d.Frame.Previous), FrameInstr: uint16(d.Frame.InstrPtr),
		FrameOwner: uint16(d.Frame.Owner), FrameEntry: none,
		CodeFilename: d.Code.Filename, CodeName: d.Code.Name, CodeQualname: d.Code.Qualname, CodeFirstLine: d.Code.Firstlineno,
		CodeLinetable: d.Code.Linetable, CodeAdaptive: d.Code.CodeAdaptive,
		ObType:    d.PyObject.ObType,
		BytesSize: d.Bytes.ObSize, BytesData: d.Bytes.ObSval,
		UnicodeLength: d.Unicode.Length, UnicodeState: d.Unicode.State, ASCIISize: d.Unicode.ASCIIObjectSize,
		// PyCompactUnicodeObject adds utf8_length and utf8 (3.12+).
		CompactSize: d.Unicode.ASCIIObjectSize + 16,
	}, nil
}

// proc is the BPF side's view of the layout at runtime address rt, in a
// process whose pthread_self() is its thread pointer less selfBelowTP.
func (l Layout) proc(rt uint64, selfBelowTP uint32) Proc {
	p := Proc{
		Runtime:     rt,
		SelfBelowTp: selfBelowTP,
		InterpHead:  l.InterpHead, InterpNext: l.InterpNext, InterpThreads: l.InterpThreads,
		TstateNext: l.TstateNext, TstateThreadID: l.TstateThreadID, TstateFrame: l.TstateFrame,
		CframeFrame: l.CFrameFrame,
		FrameCode:   l.FrameCode, FramePrevious: l.FramePrevious, FrameInstr: l.FrameInstr,
		FrameOwner: l.FrameOwner, FrameEntry: l.FrameEntry,
	}
	p.TstateSize = max(p.TstateNext, p.TstateThreadID, p.TstateFrame) + 8
	// A missing field is read at offset 0 and ignored (see Stack).
	if p.FrameOwner == none {
		p.FrameOwner = 0
	}
	if p.FrameEntry == none {
		p.FrameEntry = 0
	}
	p.FrameSize = max(p.FrameCode, p.FramePrevious, p.FrameInstr, p.FrameOwner, p.FrameEntry) + 8
	return p
}

// Proc mirrors struct py_proc of bpf/pyframes.h: one process's entry in the
// py_procs map.
type Proc struct {
	Runtime        uint64
	InterpHead     uint16
	InterpNext     uint16
	InterpThreads  uint16
	TstateNext     uint16
	TstateThreadID uint16
	TstateFrame    uint16
	TstateSize     uint16
	CframeFrame    uint16
	FrameCode      uint16
	FramePrevious  uint16
	FrameInstr     uint16
	FrameOwner     uint16
	FrameEntry     uint16
	FrameSize      uint16
	SelfBelowTp    uint32
}

// MaxFrames is PY_MAX_FRAMES: the innermost frames recorded per stack.
const MaxFrames = 24

// Stack mirrors struct py_stack of bpf/pyframes.h.
type Stack struct {
	Code      [MaxFrames]uint64
	Instr     [MaxFrames]uint64
	N         uint32
	Truncated uint32
}

// SameLayout reports how the bpf2go type generated for struct py_proc or
// py_stack (gen) differs from this package's mirror of it (mine): fields of
// the same names (ignoring case and underscores), offsets and sizes. The
// concerns' tests call it, so that the C structs and their mirrors cannot
// drift apart.
func SameLayout(gen, mine any) error {
	fields := func(v any) []reflect.StructField {
		var out []reflect.StructField
		for _, f := range reflect.VisibleFields(reflect.TypeOf(v)) {
			if f.IsExported() {
				out = append(out, f)
			}
		}
		return out
	}
	g, m := fields(gen), fields(mine)
	if len(g) != len(m) {
		return fmt.Errorf("%T has %d fields, %T %d", gen, len(g), mine, len(m))
	}
	for i := range g {
		if !strings.EqualFold(g[i].Name, m[i].Name) || g[i].Offset != m[i].Offset || g[i].Type.Size() != m[i].Type.Size() {
			return fmt.Errorf("%T.%s (offset %d, %d bytes) vs %T.%s (offset %d, %d bytes)",
				gen, g[i].Name, g[i].Offset, g[i].Type.Size(), mine, m[i].Name, m[i].Offset, m[i].Type.Size())
		}
	}
	if reflect.TypeOf(gen).Size() != reflect.TypeOf(mine).Size() {
		return fmt.Errorf("%T is %d bytes, %T %d", gen, reflect.TypeOf(gen).Size(), mine, reflect.TypeOf(mine).Size())
	}
	return nil
}
