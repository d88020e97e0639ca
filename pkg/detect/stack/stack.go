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
