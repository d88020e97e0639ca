package model

import (
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"
)

// Frame kinds.
const (
	FrameNative = "native"
	FramePython = "python"
)

// Frame is one frame of a symbolized user stack. A native frame resolved
// to a symbol has Function, Module and Offset (from the function's start);
// one in a mapped file without a symbol for it has Module and Offset (the
// ELF virtual address, or the file offset when the file cannot be read);
// one outside any mapped file has only Address. A native frame also has
// File and Line where its file has line tables (DWARF: Go binaries, C
// built with -g). A Python frame has Function, File and Line.
//
// The fields are in the order of their JSON names: findings' evidence
// holds stacks too, and was written from maps, which encode their keys
// sorted; a report written now reads as one written then.
type Frame struct {
	Address uint64 `json:"address,omitempty"` // in the process, where nothing else is known
	// BuildID is the mapped file's GNU build-id in hex and Path the file as
	// the process names it (inside its mount namespace): what a profile's
	// mapping carries, for pprof to find the file or its debug info.
	BuildID  string `json:"build_id,omitempty"`
	File     string `json:"file,omitempty"`     // source file
	Function string `json:"function,omitempty"` // demangled, without parameters
	Kind     string `json:"kind"`               // FrameNative or FramePython
	Line     int    `json:"line,omitempty"`     // source line; 0 when unknown
	Module   string `json:"module,omitempty"`   // base name of the mapped file
	Offset   uint64 `json:"offset,omitempty"`
	Path     string `json:"path,omitempty"`
	// Symbol is the ELF symbol as the file spells it (C++ and Rust names
	// mangled), kept only where it differs from Function.
	Symbol string `json:"symbol,omitempty"`
}

// String is how a frame reads in summaries, the terminal and the HTML
// page: "func+0xoff (module)", "func (module)" at the function's start,
// "module+0xoff" without a symbol, "0xaddr" outside any mapped file, and
// "func (file:line)" for Python and for a native frame with a line, its
// file's base name: the module and offset are in the frame's other fields.
func (f Frame) String() string {
	switch {
	case f.Kind == FramePython:
		return fmt.Sprintf("%s (%s:%d)", f.Function, f.File, f.Line)
	case f.Function != "" && f.Line > 0:
		return fmt.Sprintf("%s (%s:%d)", f.Function, path.Base(f.File), f.Line)
	case f.Function != "" && f.Offset != 0:
		return fmt.Sprintf("%s+%#x (%s)", f.Function, f.Offset, f.Module)
	case f.Function != "":
		return fmt.Sprintf("%s (%s)", f.Function, f.Module)
	case f.Module != "":
		return fmt.Sprintf("%s+%#x", f.Module, f.Offset)
	}
	return fmt.Sprintf("%#x", f.Address)
}

// UnmarshalJSON reads a frame object, or a frame as reports before schema 3
// wrote it, a string (ParseFrame).
func (f *Frame) UnmarshalJSON(data []byte) error {
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		*f = ParseFrame(s)
		return nil
	}
	// A type without the method, so that the object is decoded as usual.
	type plain Frame
	return json.Unmarshal(data, (*plain)(f))
}

// ParseFrame reads a frame back from its String. A C++ name's raw symbol
// is not in the text, a name ending in what reads as an offset or a
// location (no symbol does) is taken for one, and a native frame with a
// line reads as a Python one (its module is not in the text).
func ParseFrame(s string) Frame {
	if addr, ok := parseHex(s); ok {
		return Frame{Kind: FrameNative, Address: addr}
	}
	// The location is the last parenthesis: a demangled C++ name may hold
	// others, e.g. "(anonymous namespace)::load (libfoo.so)".
	i := strings.LastIndex(s, " (")
	if i <= 0 || !strings.HasSuffix(s, ")") {
		module, off, ok := cutOffset(s)
		if !ok {
			return Frame{Kind: FrameNative, Function: s}
		}
		return Frame{Kind: FrameNative, Module: module, Offset: off}
	}
	name, loc := s[:i], s[i+2:len(s)-1]
	if fn, off, ok := cutOffset(name); ok {
		return Frame{Kind: FrameNative, Function: fn, Module: loc, Offset: off}
	}
	if j := strings.LastIndexByte(loc, ':'); j > 0 {
		if line, err := strconv.Atoi(loc[j+1:]); err == nil && line >= 0 {
			return Frame{Kind: FramePython, Function: name, File: loc[:j], Line: line}
		}
	}
	return Frame{Kind: FrameNative, Function: name, Module: loc}
}

// cutOffset splits "name+0xoff".
func cutOffset(s string) (name string, off uint64, ok bool) {
	i := strings.LastIndex(s, "+0x")
	if i <= 0 {
		return "", 0, false
	}
	off, ok = parseHex(s[i+1:])
	return s[:i], off, ok
}

// parseHex reads "0x..." as String writes it.
func parseHex(s string) (uint64, bool) {
	digits, ok := strings.CutPrefix(s, "0x")
	if !ok || digits == "" {
		return 0, false
	}
	v, err := strconv.ParseUint(digits, 16, 64)
	return v, err == nil
}
