package symbolize

import (
	"encoding/binary"
	"hash/fnv"
)

// The kernel's unwind rules (bpf/unwind.h) are the code's: a rule is kept
// once for an instruction of a file, keyed by the file's id and the
// instruction's file offset, and serves every process that maps the file,
// wherever it maps it. Code of no file the symbolizer can read (anonymous
// memory: JIT compilers) has rules of its process's own, by address.

// CodeMapping is one executable mapping of a process, as the kernel's
// unwinder finds rules in it.
type CodeMapping struct {
	Start, End uint64
	// File is the id of the mapped file's code (codeID); 0 where there is
	// no file the symbolizer can read: the process's own code.
	File uint64
	// Bias turns an address into its file offset: address - Bias.
	Bias uint64
}

// CodeMappings reads pid's mappings afresh (keeping them for Frames, as
// Refresh does) and returns its executable ones, in address order. Never
// through the poll's cache: the mappings entered must be those of the
// address space the caller names, read after it (an exec may have come
// since the poll read them).
func (s *Symbolizer) CodeMappings(pid int) ([]CodeMapping, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var maps []mapping
	if s.shared != nil {
		// The poll's reader without its cache: a fresh read, parsed
		// without procfs's allocations.
		pms, err := s.shared.WithPollCache(nil).Maps(pid)
		if err != nil {
			return nil, err
		}
		maps = s.mappings(pid, pms)
	} else {
		var err error
		if maps, err = s.readMaps(pid); err != nil {
			return nil, err
		}
	}
	s.maps[pid] = maps
	var out []CodeMapping
	for i := range maps {
		m := &maps[i]
		if !m.exec {
			continue
		}
		c := CodeMapping{Start: m.start, End: m.end}
		if e := s.codeOf(pid, m); e != nil {
			c.File, c.Bias = e.code, m.start-m.offset
		}
		out = append(out, c)
	}
	return out, nil
}

// codeOf is the cache entry of m's file where its rules are the file's:
// an ELF file that could be read. nil: rules of the process's own.
func (s *Symbolizer) codeOf(pid int, m *mapping) *cacheEntry {
	if m.path == "" {
		return nil
	}
	return s.elfFor(pid, m)
}

// codeID names a file's code for the kernel's rules: its build id (with
// the size, as buildKey does: a stripped copy is laid out otherwise), else
// the file itself. Bit 63 is clear (the kernel's ids of a process's own
// code have it set) and 0 is no file.
func codeID(b buildKey, k fileKey) uint64 {
	h := fnv.New64a()
	if b != (buildKey{}) {
		h.Write([]byte("build\x00" + b.id))
		h.Write(binary.LittleEndian.AppendUint64(nil, uint64(b.size)))
	} else {
		h.Write([]byte("file\x00" + k.path))
		h.Write(binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, k.dev), k.inode))
	}
	return max(h.Sum64()&^(1<<63), 1)
}

// CodeRule is the rule of one lookup address and whose it is: the code of
// File (a CodeMapping.File) at file offset Offset, for every process that
// maps it; or, where File is 0, the process's own at that address.
type CodeRule struct {
	Rule
	File, Offset uint64
}
