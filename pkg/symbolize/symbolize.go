// Package symbolize turns user-space instruction addresses of a live process
// into frames (model.Frame) such as malloc+0x1a in libc.so.6. It reads
// /proc/PID/maps and the mapped ELF files themselves, through /proc/PID/root,
// so that processes in other mount namespaces (containers) work too.
package symbolize

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/prometheus/procfs"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// deletedSuffix is what the kernel appends to a mapped file's path once the
// file has been unlinked or replaced, e.g. by a package upgrade.
const deletedSuffix = " (deleted)"

// Symbolizer resolves addresses of many processes. It caches each process's
// mappings (until Forget) and, within bounds (see maxCacheBytes), each mapped
// file's symbol index, which is shared by all processes mapping the same file
// or a file with the same build-id. It is safe for concurrent use.
type Symbolizer struct {
	procRoot string

	// mu guards the caches; it is held for a whole Frames or Unwind call so
	// that a file is parsed once even when several callers need it at the
	// same time.
	mu      sync.Mutex
	maps    map[int][]mapping
	files   map[fileKey]*cacheEntry
	builds  map[buildKey]*cacheEntry
	entries []*cacheEntry // each cached file once
	bytes   int           // charged by entries
	tick    uint64        // counts uses, to find the least recently used

	maxBytes, maxFiles int

	// panics counts files whose reading panicked (contain).
	panics atomic.Uint64
	// refused counts what files held over a bound and was left unread
	// (Refused).
	refused atomic.Uint64

	// shared reads mappings through the poll's cache for Refresh (see
	// ShareMaps); nil: Refresh reads the file itself.
	shared *procinfo.FS
}

// mapping is one line of /proc/PID/maps.
type mapping struct {
	start, end uint64
	offset     uint64 // file offset mapped at start
	path       string // path inside the process's root; empty for anon and pseudo mappings
	deleted    bool
	exec       bool
	key        fileKey
}

// fileKey identifies a mapped file across processes, so that a library mapped
// by a hundred processes is opened once. Copies of it (other containers'
// layers) have other keys and meet by build-id.
type fileKey struct {
	dev, inode uint64
	path       string // used only when the maps line has no inode
}

// New returns a symbolizer reading /proc under procRoot (normally "/proc").
func New(procRoot string) *Symbolizer {
	return &Symbolizer{
		procRoot: procRoot,
		maps:     make(map[int][]mapping),
		files:    make(map[fileKey]*cacheEntry),
		builds:   make(map[buildKey]*cacheEntry),
		maxBytes: maxCacheBytes,
		maxFiles: maxCacheFiles,
	}
}

// Frames symbolizes addrs (innermost first) of process pid. Never fails: an
// address without a symbol keeps its module (base name of the mapped file)
// and its ELF-relative address as Offset, or only its Address when not in
// any file mapping (model.Frame).
func (s *Symbolizer) Frames(pid int, addrs []uint64) []model.Frame {
	s.mu.Lock()
	defer s.mu.Unlock()

	pm := s.procMaps(pid)
	out := make([]model.Frame, len(addrs))
	for i, addr := range addrs {
		out[i] = s.frame(pid, pm.find(addr), addr, i > 0)
	}
	return out
}

// procMaps finds the mappings of one process's addresses during one call,
// with s.mu held.
type procMaps struct {
	s         *Symbolizer
	pid       int
	maps      []mapping
	mayReload bool
}

func (s *Symbolizer) procMaps(pid int) *procMaps {
	maps, cached := s.maps[pid]
	if !cached {
		maps = s.loadMaps(pid)
	}
	// A miss in cached maps may be a library dlopen'ed after they were read;
	// re-reading once per call bounds the cost of truly unmapped addresses.
	return &procMaps{s: s, pid: pid, maps: maps, mayReload: cached}
}

func (pm *procMaps) find(addr uint64) *mapping {
	m := findMapping(pm.maps, addr)
	if m == nil && pm.mayReload {
		pm.mayReload = false
		pm.maps = pm.s.loadMaps(pm.pid)
		m = findMapping(pm.maps, addr)
	}
	return m
}

// ShareMaps makes Refresh read mappings through fs, whose cache the views
// of one poll share (procinfo.PollCache): a process tracked this poll has
// them read once, not once per reader. Reads on a miss (an address in a
// library loaded since) still go to the file. It returns s.
func (s *Symbolizer) ShareMaps(fs procinfo.FS) *Symbolizer {
	s.shared = &fs
	return s
}

// Refresh re-reads and caches the mappings of pid now, e.g. right after it
// loaded a library, so that its addresses can be symbolized after it exits.
func (s *Symbolizer) Refresh(pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shared == nil {
		s.loadMaps(pid)
		return
	}
	if pms, err := s.shared.Maps(pid); err == nil {
		s.maps[pid] = s.mappings(pid, pms)
	}
}

// Forget drops the cached maps of pid (call when the process exits).
func (s *Symbolizer) Forget(pid int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.maps, pid)
}

// loadMaps reads and caches the mappings of pid. When they cannot be read
// (typically because the process has exited) it keeps what was cached, since
// stacks of a process often arrive after its exit.
func (s *Symbolizer) loadMaps(pid int) []mapping {
	maps, err := s.readMaps(pid)
	if err != nil {
		return s.maps[pid]
	}
	s.maps[pid] = maps
	return maps
}

func (s *Symbolizer) readMaps(pid int) ([]mapping, error) {
	fs, err := procfs.NewFS(s.procRoot)
	if err != nil {
		return nil, err
	}
	p, err := fs.Proc(pid)
	if err != nil {
		return nil, err
	}
	pms, err := p.ProcMaps()
	if err != nil {
		return nil, err
	}
	return s.mappings(pid, pms), nil
}

// mappings converts the lines of /proc/PID/maps.
func (s *Symbolizer) mappings(pid int, pms []*procfs.ProcMap) []mapping {
	maps := make([]mapping, 0, len(pms))
	for _, pm := range pms {
		m := mapping{start: uint64(pm.StartAddr), end: uint64(pm.EndAddr), offset: uint64(pm.Offset),
			exec: pm.Perms != nil && pm.Perms.Execute}
		// Anonymous and pseudo mappings ([vdso], [stack], ...) are kept so
		// that addresses in them count as mapped and do not force a re-read.
		if strings.HasPrefix(pm.Pathname, "/") {
			m.path, m.deleted = strings.CutSuffix(pm.Pathname, deletedSuffix)
			m.key = fileKey{dev: pm.Dev, inode: pm.Inode}
			if pm.Inode == 0 {
				m.key = fileKey{path: s.rootPath(pid, m.path)}
			}
		}
		maps = append(maps, m)
	}
	// The kernel lists mappings in address order; sorting guards the binary search.
	slices.SortFunc(maps, func(a, b mapping) int { return cmp.Compare(a.start, b.start) })
	return maps
}

func findMapping(maps []mapping, addr uint64) *mapping {
	i, found := slices.BinarySearchFunc(maps, addr, func(m mapping, a uint64) int {
		switch {
		case m.end <= a:
			return -1
		case m.start > a:
			return 1
		}
		return 0
	})
	if !found {
		return nil
	}
	return &maps[i]
}

// frame symbolizes addr; caller says it is a return address, whose call
// instruction is the one before it.
func (s *Symbolizer) frame(pid int, m *mapping, addr uint64, caller bool) model.Frame {
	if m == nil || m.path == "" {
		return model.Frame{Kind: model.FrameNative, Address: addr}
	}
	// Without the ELF headers the file offset is the best stable offset.
	f := model.Frame{Kind: model.FrameNative, Module: filepath.Base(m.path), Path: m.path, Offset: addr - m.start + m.offset}
	e := s.elfFor(pid, m)
	if e == nil {
		return f
	}
	plain := f
	if !s.contain(e, m.path, func() { s.symbolic(e, &f, caller) }) {
		return plain
	}
	return f
}

// symbolic fills in what f's file says of f: its build id, the function,
// the source line. f.Offset is the file offset on entry.
func (s *Symbolizer) symbolic(e *cacheEntry, f *model.Frame, caller bool) {
	f.BuildID = e.info.buildID
	vaddr, ok := e.info.vaddr(f.Offset)
	if !ok {
		return
	}
	f.Offset = vaddr
	sym, ok := s.lookup(e, vaddr)
	if !ok {
		return
	}
	f.Function, f.Offset = readable(sym.name), vaddr-sym.start
	if f.Function != sym.name {
		f.Symbol = sym.name
	}
	at := vaddr
	if caller && vaddr > sym.start {
		at--
	}
	if l := s.line(e, at); l.line > 0 {
		f.File, f.Line = l.file, l.line
	}
}

// open opens the file behind m, preferring the path inside the process's
// root (works across mount namespaces without privileges beyond ptrace read
// access) and falling back to map_files (needs CAP_SYS_ADMIN or
// CAP_CHECKPOINT_RESTORE, but still reaches deleted or replaced files).
func (s *Symbolizer) open(pid int, m *mapping) (*os.File, error) {
	// A deleted path may now name a different file, e.g. the upgraded library.
	if !m.deleted {
		if f, err := openRegular(s.rootPath(pid, m.path)); err == nil {
			return f, nil
		}
	}
	name := strconv.FormatUint(m.start, 16) + "-" + strconv.FormatUint(m.end, 16)
	if f, err := openRegular(filepath.Join(s.procRoot, strconv.Itoa(pid), "map_files", name)); err == nil {
		return f, nil
	}
	// The process is gone (its root and map_files with it): the same path in
	// our own mount namespace will do if it is the very same file.
	return openSame(m)
}

// openSame opens m's path as we see it if its device and inode are the ones
// the process had mapped.
func openSame(m *mapping) (*os.File, error) {
	if m.key.inode == 0 || m.deleted {
		return nil, os.ErrNotExist
	}
	f, err := openRegular(m.path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Dev == m.key.dev && sys.Ino == m.key.inode {
			return f, nil
		}
	}
	f.Close()
	return nil, os.ErrNotExist
}

func (s *Symbolizer) rootPath(pid int, path string) string {
	return filepath.Join(s.procRoot, strconv.Itoa(pid), "root", path)
}

// openRegular opens path only if it is a regular file: mapped device nodes
// (GPU drivers map /dev/nvidia*) must not be opened, as opening them has side
// effects.
func openRegular(path string) (*os.File, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	return os.Open(path)
}
