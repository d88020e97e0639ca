// Package buildinfo reads what the Go toolchain stamped into the binary:
// the VCS revision it was built from.
package buildinfo

import "runtime/debug"

// Revision returns the VCS revision of info ("" when the build recorded
// none) and whether the tree had uncommitted changes.
func Revision(info *debug.BuildInfo, ok bool) (rev string, dirty bool) {
	if !ok {
		return "", false
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	return rev, dirty
}
