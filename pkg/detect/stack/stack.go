// Package stack holds what detectors share about symbolized stacks.
package stack

import (
	"path"
	"strconv"
	"strings"
)

// CallSite names the frame a reader wants. With Python frames in the stack
// (pkg/pyframes: "func (file:LINE)"), it is the innermost frame of the
// user's code (see UserCode), else the innermost Python frame, shortened
// to "func (file.py:LINE)" (see ShortFile). Without any, it is the first
// native frame outside the innermost frame's module, i.e. the caller of the
// libc syscall wrapper. Native frames read "func+0xoff (module)".
func CallSite(frames []string) string {
	if len(frames) == 0 {
		return ""
	}
	if site, ok := PythonSite(frames); ok {
		return site
	}
	module := func(f string) string {
		if i := strings.LastIndex(f, " ("); i >= 0 {
			return f[i:]
		}
		return ""
	}
	inner := module(frames[0])
	for _, f := range frames[1:] {
		if m := module(f); m != "" && m != inner {
			return f
		}
	}
	return frames[0]
}

// PythonSite is the Python frame CallSite names, shortened; ok is false
// when frames has no Python frame.
func PythonSite(frames []string) (site string, ok bool) {
	var lib string
	for _, f := range frames {
		fn, file, line, ok := Python(f)
		if !ok {
			continue
		}
		short := fn + " (" + ShortFile(file) + ":" + strconv.Itoa(line) + ")"
		if UserCode(file) {
			return short, true
		}
		if lib == "" {
			lib = short
		}
	}
	return lib, lib != ""
}

// Python splits a Python frame "func (file:LINE)" into its parts; ok is
// false for a native frame ("func+0xoff (module)", "module+0xoff
// (module)", "0xaddr").
func Python(frame string) (fn, file string, line int, ok bool) {
	i := strings.LastIndex(frame, " (")
	if i <= 0 || !strings.HasSuffix(frame, ")") {
		return "", "", 0, false
	}
	fn, loc := frame[:i], frame[i+2:len(frame)-1]
	j := strings.LastIndexByte(loc, ':')
	if j <= 0 || strings.Contains(fn, "+0x") {
		return "", "", 0, false
	}
	line, err := strconv.Atoi(loc[j+1:])
	if err != nil || line < 0 {
		return "", "", 0, false
	}
	return fn, loc[:j], line, true
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

// Function is the function name of a frame "func+0xoff (module)" or a
// Python frame "func (file:LINE)": what an alert can name as the site. A
// frame without a symbol ("module+0xoff", "0xaddr") is returned as is.
func Function(frame string) string {
	name := frame
	// The module is the last parenthesis: a demangled C++ name may hold
	// others, e.g. "(anonymous namespace)::load (libfoo.so)".
	if i := strings.LastIndex(frame, " ("); i >= 0 && strings.HasSuffix(frame, ")") {
		name = frame[:i]
	}
	if fn, off, ok := strings.Cut(name, "+0x"); ok && fn != "" && off != "" {
		return fn
	}
	return name
}
