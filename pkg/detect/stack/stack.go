// Package stack holds what detectors share about symbolized stacks.
package stack

import (
	"path"
	"strconv"
	"strings"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// CallSite names the frame a reader wants, as a summary writes it
// (CallFrame); "" for an empty stack.
func CallSite(frames []model.Frame) string {
	f, ok := CallFrame(frames)
	if !ok {
		return ""
	}
	return f.String()
}

// CallFrame is the frame a reader wants; false for an empty stack. With
// Python frames in the stack (pkg/pyframes), it is the innermost frame of
// the user's code (see UserCode), else the innermost Python frame, its
// file shortened (ShortFile), so that it reads "func (file.py:LINE)".
// Without any, it is the innermost native frame of the user's code
// (nativeUser), else the first native frame with a symbol outside the
// innermost frame's module when that module is a shared library, i.e. the
// caller of the libc syscall wrapper, else the innermost frame: a stack
// that starts in the executable (a CUDA call's caller) names that caller,
// not the C library's start-up code further out.
func CallFrame(frames []model.Frame) (model.Frame, bool) {
	if len(frames) == 0 {
		return model.Frame{}, false
	}
	if site, ok := PythonSite(frames); ok {
		return site, true
	}
	if f, ok := nativeUser(frames); ok {
		return f, true
	}
	// A frame without a symbol names no function to blame: it is passed
	// over, whatever its module.
	module := func(f model.Frame) string {
		if f.Function == "" {
			return ""
		}
		return f.Module
	}
	inner := module(frames[0])
	if !strings.Contains(inner, ".so") {
		return frames[0], true
	}
	for _, f := range frames[1:] {
		if m := module(f); m != "" && m != inner {
			return f, true
		}
	}
	return frames[0], true
}

// nativeUser is the innermost frame of the user's own code in a stack
// whose frames have source lines (model.Frame), as Python's site passes
// over the interpreter and its libraries. Passed over: frames without a
// symbol; the innermost frame's shared library (the libc wrapper, the CUDA
// runtime called); the Go runtime and standard library (goStd); the C++
// standard library; and, in a module with lines, frames without one: code
// linked in without debugging information, such as libc's wrappers in a
// static executable. ok is false when no frame has a line or none is left.
func nativeUser(frames []model.Frame) (model.Frame, bool) {
	// Modules with lines, and those of them in Go (whose runtime's
	// assembly files are .s).
	lined, golang := map[string]bool{}, map[string]bool{}
	for _, f := range frames {
		if f.Kind == model.FrameNative && f.Line > 0 {
			lined[f.Module] = true
			golang[f.Module] = golang[f.Module] || strings.HasSuffix(f.File, ".go")
		}
	}
	if len(lined) == 0 {
		return model.Frame{}, false
	}
	inner := ""
	if strings.Contains(frames[0].Module, ".so") {
		inner = frames[0].Module
	}
	for _, f := range frames {
		switch {
		case f.Kind != model.FrameNative || f.Function == "" || f.Module == inner:
		case f.Line == 0 && lined[f.Module]:
		case golang[f.Module] && goStd(f.Function):
		case cxxStd(f):
		default:
			if f.Line == 0 {
				return model.Frame{}, false
			}
			return f, true
		}
	}
	return model.Frame{}, false
}

// goStd tells whether a Go function ("os.(*File).Close",
// "internal/runtime/syscall/linux.Syscall6", "main.cacheShard",
// "github.com/x/y.Load") is in the Go runtime or standard library: its
// package path's first element has no dot and is not main.
func goStd(fn string) bool {
	pkg := fn
	if i := strings.LastIndexByte(pkg, '/'); i >= 0 {
		first, _, _ := strings.Cut(pkg, "/")
		return !strings.Contains(first, ".")
	}
	pkg, _, _ = strings.Cut(pkg, ".")
	return pkg != "main" && pkg != ""
}

// cxxStd tells whether a native frame is in the C++ standard library: its
// libraries, or its templates instantiated in the user's code.
func cxxStd(f model.Frame) bool {
	for _, p := range []string{"std::", "__gnu_cxx::", "__cxxabiv1::"} {
		if strings.HasPrefix(f.Function, p) {
			return true
		}
	}
	return strings.HasPrefix(f.Module, "libstdc++.so") || strings.HasPrefix(f.Module, "libc++.so")
}

// PythonSite is the Python frame CallFrame names, its file shortened; ok
// is false when frames has no Python frame.
func PythonSite(frames []model.Frame) (site model.Frame, ok bool) {
	for _, f := range frames {
		if f.Kind != model.FramePython {
			continue
		}
		short := f
		short.File = ShortFile(f.File)
		if UserCode(f.File) {
			return short, true
		}
		if !ok {
			site, ok = short, true
		}
	}
	return site, ok
}

// UserCode tells whether a Python file is the user's own code: not in an
// installed package (a path component site-packages or dist-packages), not
// in the standard library (under a lib/python3.X or lib/python3 directory,
// lib64 too), and not a pseudo-file ("<frozen importlib._bootstrap>",
// "<string>").
func UserCode(file string) bool {
	if file == "" || strings.HasPrefix(file, "<") {
		return false
	}
	parts := strings.Split(file, "/")
	for i, p := range parts {
		switch {
		case p == "site-packages" || p == "dist-packages":
			return false
		case i > 0 && (parts[i-1] == "lib" || parts[i-1] == "lib64") && isPythonDir(p) && i < len(parts)-1:
			return false
		}
	}
	return true
}

// isPythonDir matches python3 and python3.X.
func isPythonDir(p string) bool {
	rest, ok := strings.CutPrefix(p, "python3")
	if !ok {
		return false
	}
	if rest == "" {
		return true
	}
	_, err := strconv.Atoi(strings.TrimPrefix(rest, "."))
	return strings.HasPrefix(rest, ".") && err == nil
}

// ShortFile is how a summary names a Python file: the path inside its
// package for installed packages and the standard library
// ("torch/serialization.py", "json/decoder.py"), the base name for the
// user's code ("serve.py").
func ShortFile(file string) string {
	parts := strings.Split(file, "/")
	for i := len(parts) - 2; i >= 0; i-- {
		p := parts[i]
		if p == "site-packages" || p == "dist-packages" || (i > 0 && (parts[i-1] == "lib" || parts[i-1] == "lib64") && isPythonDir(p)) {
			return strings.Join(parts[i+1:], "/")
		}
	}
	return path.Base(file)
}

// Function is what an alert can name as the site of frame f: its function,
// else its module, else its address.
func Function(f model.Frame) string {
	switch {
	case f.Function != "":
		return f.Function
	case f.Module != "":
		return f.Module
	}
	return f.String()
}

// Key identifies a stack as a reader tells stacks apart, by the text of its
// frames, for grouping by stack.
func Key(frames []model.Frame) string {
	var b strings.Builder
	for i, f := range frames {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(f.String())
	}
	return b.String()
}
