package pyframes

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// interp is the CPython interpreter found in one process.
type interp struct {
	layout   Layout
	runtime  uint64 // address of _PyRuntime
	codeType uint64 // address of PyCode_Type; 0 when unknown
	version  string // "3.11.2", or "3.11" when only the minor is known
	// pthread_self() (PyThreadState.thread_id) is the thread pointer less
	// this: 0 on x86_64, sizeof(struct pthread) of the process's glibc on
	// arm64 (see selfBelowTP).
	selfBelowTP uint32
	// The mapping of the file that holds them, to notice an exec or an
	// unload.
	file  fileKey
	start uint64
}

// fileKey identifies a mapped file.
type fileKey struct{ dev, inode uint64 }

// exeOf is the file pid runs, as the kernel has it: an exec changes it.
func exeOf(procRoot string, pid int) (fileKey, error) {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(procRoot, strconv.Itoa(pid), "exe"), &st); err != nil {
		return fileKey{}, err
	}
	return fileKey{st.Dev, st.Ino}, nil
}

// elfPython is what one ELF file says about the interpreter it holds.
type elfPython struct {
	runtime, codeType uint64 // symbol values; runtime 0: not an interpreter
	version           uint64 // Py_Version (PY_VERSION_HEX), 0 when absent (3.10)
	minor             int    // from the version or the file name; 0 unknown
	// sizeofPthread is glibc's _thread_db_sizeof_pthread (libc.so.6 from
	// 2.34, libpthread.so.0 before; 0: not defined here).
	sizeofPthread uint32
	loads         []elf.ProgHeader
}

// elfCache keeps what each file said, by file, for all processes: a node
// runs many processes of the same interpreter.
var elfCache = struct {
	sync.Mutex
	m map[fileKey]*elfPython
}{m: map[fileKey]*elfPython{}}

const maxELFCache = 256

// minorFromName reads 3.X from python3.X / libpython3.X.so names.
var minorFromName = regexp.MustCompile(`python3\.(\d+)`)

// errNoPython says a process runs no CPython the tool knows.
var errNoPython = errors.New("no CPython interpreter mapped")

// findInterp looks for a CPython interpreter in the mappings of pid: the
// executable or a mapped libpython3.X.so, any file whose name has "python"
// that defines _PyRuntime. procRoot is the proc mount (files are opened
// through /proc/PID/root, so containers work).
func findInterp(procRoot string, pid int, maps []*procfs.ProcMap) (*interp, error) {
	tried := map[fileKey]bool{}
	for _, m := range maps {
		if !strings.HasPrefix(m.Pathname, "/") || !strings.Contains(filepath.Base(m.Pathname), "python") {
			continue
		}
		key := fileKey{m.Dev, m.Inode}
		if tried[key] {
			continue
		}
		tried[key] = true
		ep := elfOf(procRoot, pid, m, key)
		if ep == nil || ep.runtime == 0 {
			continue
		}
		bias, start, ok := biasOf(maps, key, ep.loads)
		if !ok {
			continue
		}
		in := &interp{runtime: ep.runtime + bias, file: key, start: start}
		if ep.codeType != 0 {
			in.codeType = ep.codeType + bias
		}
		if nativeMachine == elf.EM_AARCH64 {
			below, err := selfBelowTP(procRoot, pid, maps, ep)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", m.Pathname, err)
			}
			in.selfBelowTP = below
		}
		if err := in.setLayout(procMem(pid), ep); err != nil {
			return nil, fmt.Errorf("%s: %w", m.Pathname, err)
		}
		return in, nil
	}
	return nil, errNoPython
}

// nativeMachine is the ELF machine of the processes the agent watches: its
// own (the BPF side reads the registers of its own architecture).
var nativeMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[runtime.GOARCH]

// selfBelowTP is how far below an arm64 thread's pointer (TPIDR_EL0)
// pthread_self() lies in pid: glibc puts its struct pthread right below it
// (TLS_DTV_AT_TP), so the distance is sizeof(struct pthread), which changes
// between glibc releases (1856 bytes in 2.36) and which glibc publishes for
// libthread_db as _thread_db_sizeof_pthread. It is read from the glibc the
// process maps (libc.so.6, libpthread.so.0 before 2.34) or from the
// interpreter's own file (a static build). musl publishes no such size: its
// processes get no Python frames on arm64 rather than guessed ones.
func selfBelowTP(procRoot string, pid int, maps []*procfs.ProcMap, interp *elfPython) (uint32, error) {
	if interp.sizeofPthread != 0 {
		return interp.sizeofPthread, nil
	}
	tried := map[fileKey]bool{}
	for _, m := range maps {
		base := filepath.Base(m.Pathname)
		if !strings.HasPrefix(m.Pathname, "/") || !(strings.HasPrefix(base, "libc.so") || strings.HasPrefix(base, "libpthread")) {
			continue
		}
		key := fileKey{m.Dev, m.Inode}
		if tried[key] {
			continue
		}
		tried[key] = true
		if ep := elfOf(procRoot, pid, m, key); ep != nil && ep.sizeofPthread != 0 {
			return ep.sizeofPthread, nil
		}
	}
	return 0, errors.New("no glibc with _thread_db_sizeof_pthread mapped: cannot tell its threads' pthread_self() on arm64")
}

// setLayout picks the layout of the interpreter's version; m is the
// process's memory, where 3.13 publishes its offsets.
func (in *interp) setLayout(m memory, ep *elfPython) error {
	if ep.version != 0 {
		in.version = fmt.Sprintf("%d.%d.%d", ep.version>>24&0xff, ep.version>>16&0xff, ep.version>>8&0xff)
	} else if ep.minor != 0 {
		in.version = "3." + strconv.Itoa(ep.minor)
	}
	switch {
	case ep.minor >= 13:
		raw := make([]byte, debugOffsetsSize)
		if err := m.read(in.runtime, raw); err != nil {
			return fmt.Errorf("reading _PyRuntime.debug_offsets: %w", err)
		}
		l, err := layoutFromDebug(raw)
		if err != nil {
			return err
		}
		in.layout = l
	case ep.minor >= 10:
		in.layout = layouts[ep.minor]
	case ep.minor == 0:
		return fmt.Errorf("cannot tell the Python version")
	default:
		return fmt.Errorf("Python %s is not supported (3.10-3.13)", in.version)
	}
	return nil
}

// biasOf is the load bias of the file key in maps: what to add to its ELF
// addresses. start is its first mapping's address.
func biasOf(maps []*procfs.ProcMap, key fileKey, loads []elf.ProgHeader) (bias, start uint64, ok bool) {
	const page = 0xfff
	for _, m := range maps {
		if (fileKey{m.Dev, m.Inode}) != key {
			continue
		}
		for _, p := range loads {
			if p.Off&^page == uint64(m.Offset) {
				return uint64(m.StartAddr) - p.Vaddr&^page, uint64(m.StartAddr), true
			}
		}
	}
	return 0, 0, false
}

// elfOf parses the file of mapping m once per file (nil when it cannot be
// read or is not ELF).
func elfOf(procRoot string, pid int, m *procfs.ProcMap, key fileKey) *elfPython {
	elfCache.Lock()
	ep, ok := elfCache.m[key]
	elfCache.Unlock()
	if ok {
		return ep
	}
	ep = parsePython(openMapped(procRoot, pid, m))
	elfCache.Lock()
	if len(elfCache.m) >= maxELFCache {
		clear(elfCache.m)
	}
	elfCache.m[key] = ep
	elfCache.Unlock()
	return ep
}

// openMapped opens the file behind m: by its path inside the process's root,
// else (replaced or deleted since) through map_files.
func openMapped(procRoot string, pid int, m *procfs.ProcMap) *os.File {
	path, deleted := strings.CutSuffix(m.Pathname, " (deleted)")
	if !deleted {
		if f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "root", path)); err == nil {
			var st unix.Stat_t
			if unix.Fstat(int(f.Fd()), &st) == nil && st.Ino == m.Inode {
				return f
			}
			f.Close()
		}
	}
	f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "map_files", fmt.Sprintf("%x-%x", m.StartAddr, m.EndAddr)))
	if err != nil {
		return nil
	}
	return f
}

// elfPanics counts the files whose parsing panicked (parsePython), for
// every Tracker: the files are cached for all of them.
var elfPanics atomic.Uint64

// parsePython reads the interpreter's symbols from f (and closes it). The
// file is the process's to craft: a panic reading it is counted and logged
// and makes it no interpreter's, rather than taking the agent down.
func parsePython(f *os.File) (ep *elfPython) {
	if f == nil {
		return nil
	}
	defer f.Close()
	defer func() {
		if v := recover(); v != nil {
			elfPanics.Add(1)
			slog.Warn("reading a mapped file for Python's symbols panicked; it is taken for no interpreter",
				"path", f.Name(), "panic", v)
			ep = nil
		}
	}()
	if parseHook != nil {
		parseHook(f)
	}
	ef, err := elf.NewFile(f)
	if err != nil || ef.Machine != nativeMachine {
		return nil
	}
	ep = &elfPython{}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			ep.loads = append(ep.loads, p.ProgHeader)
		}
	}
	var version, sizeofPthread elf.Symbol
	for _, syms := range [][]elf.Symbol{dynSymbols(ef), symbols(ef)} {
		for _, s := range syms {
			if s.Section == elf.SHN_UNDEF {
				continue
			}
			switch s.Name {
			case "_PyRuntime":
				ep.runtime = s.Value
			case "PyCode_Type":
				ep.codeType = s.Value
			case "Py_Version":
				version = s
			case "_thread_db_sizeof_pthread":
				sizeofPthread = s
			}
		}
		if ep.runtime != 0 || sizeofPthread.Value != 0 {
			break
		}
	}
	if sizeofPthread.Value != 0 {
		ep.sizeofPthread = uint32(readConst(ef, sizeofPthread))
	}
	if ep.runtime == 0 {
		return ep
	}
	if version.Value != 0 {
		ep.version = readConst(ef, version)
	}
	if ep.version>>24 == 3 {
		ep.minor = int(ep.version >> 16 & 0xff)
	} else if m := minorFromName.FindStringSubmatch(filepath.Base(f.Name())); m != nil {
		ep.version = 0
		ep.minor, _ = strconv.Atoi(m[1])
	}
	return ep
}

func dynSymbols(ef *elf.File) []elf.Symbol {
	s, _ := ef.DynamicSymbols()
	return s
}

func symbols(ef *elf.File) []elf.Symbol {
	s, _ := ef.Symbols()
	return s
}

// readConst reads a 4-byte constant symbol from its section in the file.
func readConst(ef *elf.File, s elf.Symbol) uint64 {
	if int(s.Section) >= len(ef.Sections) {
		return 0
	}
	sec := ef.Sections[s.Section]
	if sec.Type == elf.SHT_NOBITS || s.Value < sec.Addr || s.Value+4 > sec.Addr+sec.Size {
		return 0
	}
	var b [4]byte
	if _, err := sec.ReadAt(b[:], int64(s.Value-sec.Addr)); err != nil {
		return 0
	}
	return uint64(binary.LittleEndian.Uint32(b[:]))
}

// memory is a process's memory, which the process controls: everything
// read from it is checked against bounds (the fuzz tests read it from
// arbitrary bytes).
type memory interface {
	// read reads len(buf) bytes at addr; an error unless all of them.
	read(addr uint64, buf []byte) error
}

// procMem is the memory of a live process, by pid.
type procMem int

// read reads len(buf) bytes of the process's memory at addr.
func (pid procMem) read(addr uint64, buf []byte) error {
	if len(buf) == 0 {
		return nil
	}
	local := []unix.Iovec{{Base: &buf[0]}}
	local[0].SetLen(len(buf))
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(buf)}}
	n, err := unix.ProcessVMReadv(int(pid), local, remote, 0)
	if err != nil {
		return fmt.Errorf("reading %d bytes at %#x of pid %d: %w", len(buf), addr, pid, err)
	}
	if n != len(buf) {
		return fmt.Errorf("reading %d bytes at %#x of pid %d: got %d", len(buf), addr, pid, n)
	}
	return nil
}
