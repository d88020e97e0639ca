// Package stack holds what detectors share about symbolized stacks.
package stack

import "strings"

// CallSite names the frame a reader wants: the first one outside the
// innermost frame's module, i.e. the caller of the libc syscall wrapper.
// Frames read "func+0xoff (module)".
func CallSite(frames []string) string {
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

// Function is the function name of a frame "func+0xoff (module)": what an
// alert can name as the site. A frame without a symbol ("module+0xoff",
// "0xaddr") is returned as is.
func Function(frame string) string {
	name, _, _ := strings.Cut(frame, " (")
	if fn, off, ok := strings.Cut(name, "+0x"); ok && fn != "" && off != "" {
		return fn
	}
	return name
}
