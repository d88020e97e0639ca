package cudatrack

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// Library is an ELF file that defines hooked CUDA functions: a libcudart, a
// libcuda, or an executable with the runtime linked in statically.
type Library struct {
	Path    string   // as the process sees it (inside its mount namespace)
	Kind    string   // "runtime", "driver" or "static runtime"
	Hooks   []Hook   // hooked functions it defines
	Missing []string // functions of its layer it lacks (older versions): not hooked
}

// Hook is one function to attach to.
type Hook struct {
	API    int    // index into APIs, the BPF cookie
	Offset uint64 // file offset of its first instruction
}

// Library kinds.
const (
	kindRuntime       = "runtime"
	kindDriver        = "driver"
	kindStaticRuntime = "static runtime"
)

// fileKey identifies a mapped file across processes, so that each is parsed
// once.
type fileKey struct {
	dev, inode uint64
	path       string
}

// mappedFile is a candidate found in /proc/PID/maps.
type mappedFile struct {
	key  fileKey
	path string
	kind string // from the name; kindStaticRuntime for the main executable
}

// libKind classifies a mapped file by its base name: pip wheels ship
// libcudart.so.12 under site-packages/nvidia/cuda_runtime/lib, and some
// frameworks bundle a renamed copy such as libcudart-9335f6a2.so.12.
func libKind(path string) string {
	base := filepath.Base(path)
	switch {
	case strings.HasPrefix(base, "libcudart") && strings.Contains(base, ".so"):
		return kindRuntime
	case base == "libcuda.so" || strings.HasPrefix(base, "libcuda.so."):
		return kindDriver
	}
	return ""
}

// candidates lists the files mapped executable by pid that may hold CUDA
// entry points: CUDA libraries by name, and the main executable (which may
// have the runtime linked in statically).
func candidates(fs procinfo.FS, pid int) ([]mappedFile, error) {
	maps, err := fs.Maps(pid)
	if err != nil {
		return nil, err
	}
	exe, _ := os.Readlink(filepath.Join(fs.Root(), strconv.Itoa(pid), "exe"))
	exe = strings.TrimSuffix(exe, deletedSuffix)
	seen := map[fileKey]bool{}
	var out []mappedFile
	for _, m := range maps {
		if m.Perms == nil || !m.Perms.Execute || m.Inode == 0 || !strings.HasPrefix(m.Pathname, "/") {
			continue
		}
		// A deleted file's path may now name another file (an upgrade).
		if strings.HasSuffix(m.Pathname, deletedSuffix) {
			continue
		}
		kind := libKind(m.Pathname)
		if kind == "" && m.Pathname == exe {
			kind = kindStaticRuntime
		}
		key := fileKey{dev: m.Dev, inode: m.Inode, path: m.Pathname}
		if kind == "" || seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, mappedFile{key: key, path: m.Pathname, kind: kind})
	}
	return out, nil
}

// deletedSuffix is what the kernel appends to a mapped file's path once the
// file has been unlinked or replaced.
const deletedSuffix = " (deleted)"

// Inspect reads the symbol tables of the ELF file at path (opened as given:
// callers pass /proc/PID/root/... for a process's file) and returns the hooks
// it offers. kind says what the file is expected to be; an executable that
// defines no hooked function is not a CUDA library and yields nil.
func Inspect(path, shownPath, kind string) (*Library, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	// Mapped device nodes must not be opened: opening them has side effects.
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()

	syms, err := f.DynamicSymbols()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, err
	}
	// A static runtime rarely exports its functions: look in .symtab too.
	if st, err := f.Symbols(); err == nil {
		syms = append(syms, st...)
	}
	found := map[int]elf.Symbol{}
	for _, s := range syms {
		api, ok := apiIndex[s.Name]
		// Local symbols are internal copies, not the API (hidden by a
		// version script, for instance).
		if !ok || elf.ST_TYPE(s.Info) != elf.STT_FUNC || elf.ST_BIND(s.Info) == elf.STB_LOCAL || s.Section == elf.SHN_UNDEF || s.Value == 0 {
			continue
		}
		// Of several versions of one name, hook the default one (name@@VER),
		// which is what programs linking against the library call.
		if prev, ok := found[api]; ok && !(prev.HasVersion && prev.VersionIndex.IsHidden()) {
			continue
		}
		found[api] = s
	}
	if kind == kindStaticRuntime && len(found) == 0 {
		return nil, nil
	}
	lib := &Library{Path: shownPath, Kind: kind}
	for api, a := range APIs {
		s, ok := found[api]
		if !ok {
			if a.Layer == layerOf(kind) {
				lib.Missing = append(lib.Missing, a.Name)
			}
			continue
		}
		off, ok := fileOffset(f, s.Value)
		if !ok {
			lib.Missing = append(lib.Missing, a.Name)
			continue
		}
		lib.Hooks = append(lib.Hooks, Hook{API: api, Offset: off})
	}
	return lib, nil
}

// layerOf is the layer whose functions a library kind should define.
func layerOf(kind string) string {
	if kind == kindDriver {
		return LayerDriver
	}
	return LayerRuntime
}

// fileOffset turns a symbol's virtual address into the file offset that a
// uprobe is placed at.
func fileOffset(f *elf.File, vaddr uint64) (uint64, bool) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 {
			continue
		}
		if vaddr >= p.Vaddr && vaddr < p.Vaddr+p.Memsz {
			return vaddr - p.Vaddr + p.Off, true
		}
	}
	return 0, false
}

// libDirs are searched when ldconfig is missing: the multiarch directories
// of the agent's architecture (the processes it watches run the same), then
// the common ones. CUDA's arm64 server (SBSA) toolkit keeps its libraries
// under targets/sbsa-linux, where lib64 may not link to.
var libDirs = append(map[string][]string{
	"amd64": {"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"},
	"arm64": {"/usr/lib/aarch64-linux-gnu", "/lib/aarch64-linux-gnu", "/usr/local/cuda/targets/sbsa-linux/lib"},
}[runtime.GOARCH], "/usr/lib64", "/usr/lib", "/usr/local/cuda/lib64", "/usr/local/nvidia/lib64")

// SystemLibraries inspects the CUDA runtime and driver libraries installed in
// the standard places (the ldconfig cache, else the usual directories), for
// `check`: which hooked functions each defines.
func SystemLibraries() ([]*Library, error) {
	var paths []string
	if out, err := exec.Command("ldconfig", "-p").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			_, path, ok := strings.Cut(line, " => ")
			if ok && libKind(path) != "" {
				paths = append(paths, strings.TrimSpace(path))
			}
		}
	} else {
		for _, dir := range libDirs {
			for _, pat := range []string{"libcudart.so*", "libcuda.so*"} {
				m, _ := filepath.Glob(filepath.Join(dir, pat))
				paths = append(paths, m...)
			}
		}
	}
	seen := map[string]bool{}
	var out []*Library
	var errs []error
	for _, p := range paths {
		real, err := filepath.EvalSymlinks(p)
		if err != nil || seen[real] {
			continue
		}
		seen[real] = true
		lib, err := Inspect(real, p, libKind(p))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, lib)
	}
	return out, errors.Join(errs...)
}

// Finder tells whether a process uses CUDA: it maps a CUDA runtime or
// driver library, or its executable has the runtime linked in. Each
// executable is inspected once; the cache is bounded.
type Finder struct {
	fs     procinfo.FS
	static map[fileKey]bool // executable → defines hooked CUDA functions
}

// finderCache bounds the executables a Finder remembers; past it the cache
// starts over (a node runs far fewer distinct executables).
const finderCache = 4096

// NewFinder returns a Finder reading /proc through fs.
func NewFinder(fs procinfo.FS) *Finder { return &Finder{fs: fs, static: map[fileKey]bool{}} }

// UsesCUDA reports whether pid has CUDA mapped now.
func (f *Finder) UsesCUDA(pid int) (bool, error) {
	files, err := candidates(f.fs, pid)
	if err != nil {
		return false, err
	}
	for _, mf := range files {
		if mf.kind != kindStaticRuntime {
			return true, nil
		}
		uses, ok := f.static[mf.key]
		if !ok {
			path := filepath.Join(f.fs.Root(), strconv.Itoa(pid), "root", mf.path)
			lib, err := Inspect(path, mf.path, kindStaticRuntime)
			if err != nil {
				return false, err
			}
			if len(f.static) >= finderCache {
				clear(f.static)
			}
			uses = lib != nil
			f.static[mf.key] = uses
		}
		if uses {
			return true, nil
		}
	}
	return false, nil
}
