package symbolize

// The file cache is bounded because a daemon sees an open-ended stream of
// libraries. The whole tool must stay under 64 MiB RSS; at 12 bytes a
// function, 16 MiB of indexes hold libtorch_cpu.so (632 k functions) and
// libtorch_cuda.so (235 k) at once with room for hundreds of ordinary
// libraries. Every cached ELF file also keeps a descriptor open, hence the
// bound on files. The least recently used file goes first.
const (
	maxCacheBytes = 16 << 20
	maxCacheFiles = 256
	// entryBytes is charged per file on top of its indexes, for its
	// headers and keys, so that many small files count too.
	entryBytes = 1 << 10
	// maxAliases bounds the keys of one file: each new container's copy of
	// a library adds one. A dropped key costs a reopen and a build-id read.
	maxAliases = 16
)

// cacheEntry is one cached file, reached from s.files by each of its keys.
type cacheEntry struct {
	info *elfInfo // nil: not an ELF file
	code uint64   // the file's id in the kernel's unwind rules (codeID)
	keys []fileKey
	used uint64 // s.tick when last used
	cost int    // bytes charged to s.bytes
	// rules caches unwind rules by virtual address: each is a binary search
	// and a few reads of the file.
	rules map[uint64]Rule
}

// elfFor returns the cache entry of m's file, or nil if it cannot be read or
// is not ELF.
func (s *Symbolizer) elfFor(pid int, m *mapping) *cacheEntry {
	e, ok := s.files[m.key]
	if !ok {
		e = s.load(pid, m)
	}
	if e == nil || e.info == nil {
		return nil
	}
	s.tick++
	e.used = s.tick
	return e
}

func (s *Symbolizer) load(pid int, m *mapping) *cacheEntry {
	f, err := s.open(pid, m)
	if err != nil {
		// Not cached: the file may still be reachable through another process.
		return nil
	}
	var info *elfInfo
	if !s.contain(nil, m.path, func() { info, err = parseELF(f) }) {
		info, err = nil, errParserPanic
	}
	if err != nil {
		f.Close()
		e := &cacheEntry{}
		s.add(m.key, e)
		return e
	}
	if info.build != (buildKey{}) {
		if e, ok := s.builds[info.build]; ok {
			// The same library through another path, container or copy.
			f.Close()
			s.alias(m.key, e)
			return e
		}
	}
	s.refused.Add(uint64(info.tablesRefused))
	e := &cacheEntry{info: info, code: codeID(info.build, m.key)}
	if info.build != (buildKey{}) {
		s.builds[info.build] = e
	}
	s.add(m.key, e)
	return e
}

func (s *Symbolizer) add(key fileKey, e *cacheEntry) {
	s.entries = append(s.entries, e)
	s.alias(key, e)
	s.charge(e)
}

func (s *Symbolizer) alias(key fileKey, e *cacheEntry) {
	if len(e.keys) == maxAliases {
		delete(s.files, e.keys[0])
		e.keys = append(e.keys[:0], e.keys[1:]...)
	}
	e.keys = append(e.keys, key)
	s.files[key] = e
}

// lookup is e.info.lookup, which may index a table, with the index charged.
func (s *Symbolizer) lookup(e *cacheEntry, vaddr uint64) (symbol, bool) {
	sym, ok := e.info.lookup(vaddr)
	if sym.nameRefused {
		// No name: the frame is the module's, at its offset.
		s.refused.Add(1)
		ok = false
	}
	s.charge(e)
	return sym, ok
}

// line is e.info's source line of vaddr, which may read the file's line
// table, with its memory charged.
func (s *Symbolizer) line(e *cacheEntry, vaddr uint64) srcLine {
	first := !e.info.linesRead
	t := e.info.lines()
	if first && e.info.linesRefused {
		s.refused.Add(1)
	}
	if t == nil {
		return srcLine{}
	}
	l := t.line(vaddr)
	s.charge(e)
	return l
}

// charge brings e's cost up to date and evicts other files while over a
// bound. e itself stays even when it alone is over: the caller is using it.
func (s *Symbolizer) charge(e *cacheEntry) {
	cost := entryBytes
	if e.info != nil {
		cost += e.info.indexBytes()
	}
	s.bytes += cost - e.cost
	e.cost = cost
	for s.bytes > s.maxBytes || len(s.entries) > s.maxFiles {
		victim := -1
		for i, c := range s.entries {
			if c != e && (victim < 0 || c.used < s.entries[victim].used) {
				victim = i
			}
		}
		if victim < 0 {
			return
		}
		s.evict(victim)
	}
}

func (s *Symbolizer) evict(i int) {
	e := s.entries[i]
	s.entries[i] = s.entries[len(s.entries)-1]
	s.entries[len(s.entries)-1] = nil
	s.entries = s.entries[:len(s.entries)-1]
	for _, k := range e.keys {
		delete(s.files, k)
	}
	s.bytes -= e.cost
	if e.info != nil {
		if s.builds[e.info.build] == e {
			delete(s.builds, e.info.build)
		}
		e.info.f.Close()
	}
}
