package symbolize

import (
	"errors"
	"log/slog"
	"runtime/debug"
)

// Every file the symbolizer reads belongs to whichever process mapped it,
// and any pod can ship a crafted binary. The parsers check what they read,
// but one panic they did not foresee must cost that file's frames, not the
// node's agent: the readers of a file's contents run under contain, which
// turns a panic into "no information from this file" for as long as the
// file is cached.

// panicHook, when set by a test, runs inside every contained read of a
// file, so that a test can make the reading of a given file panic.
var panicHook func(path string)

// contain runs read, which reads the file of e (nil: the file is being
// opened, path names it). A panic is counted, logged once per file, and
// leaves the file as if it were not ELF; contain then returns false.
func (s *Symbolizer) contain(e *cacheEntry, path string, read func()) (ok bool) {
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		ok = false
		s.panics.Add(1)
		if e != nil && e.info != nil {
			// Dropped rather than kept: its next read would panic again.
			if s.builds[e.info.build] == e {
				delete(s.builds, e.info.build)
			}
			e.info.f.Close()
			e.info, e.rules = nil, nil
		}
		slog.Warn("a file's contents made the symbolizer panic; its frames are left unsymbolized",
			"path", path, "panic", v, "stack", string(debug.Stack()))
	}()
	if panicHook != nil {
		panicHook(path)
	}
	read()
	return true
}

// Panics is how many times reading a file panicked (contain): each such
// file's frames are left without symbols from then on.
func (s *Symbolizer) Panics() uint64 { return s.panics.Load() }

// errParserPanic stands for a panic in parseELF: the file is cached as not
// ELF.
var errParserPanic = errors.New("parsing the ELF headers panicked")

// Refused is how many times a file's contents were left unread, over a
// bound or malformed: debugging information for lines (maxLineBytes, once
// per file: its frames have no lines), a symbol table (maxSymtabBytes,
// once per file: the other table answers) or a symbol's name
// (maxNameBytes, per lookup: module+offset frames), a frame's call-frame information
// (an entry over maxCFIEntry, a program that would loop or remember too
// deep; once per address while its rule is cached: the stack ends there).
// Not losses: what a file holds is its own making.
func (s *Symbolizer) Refused() uint64 { return s.refused.Load() }
