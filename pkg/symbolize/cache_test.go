package symbolize

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
)

// smallLib has n functions prefix0, prefix1, ... of 16 bytes from 0x1000;
// only the even ones are exported (in .dynsym), and .symtab, which has them
// all, is left out when stripped.
func smallLib(buildID string, prefix string, n int, stripped bool) genELF {
	syms := func(all bool) func(func(genSym) bool) {
		return func(yield func(genSym) bool) {
			for i := range n {
				if (all || i%2 == 0) && !yield(genSym{name: fmt.Sprintf("%s%d", prefix, i), value: 0x1000 + uint64(i)*16, size: 16, typ: elf.STT_FUNC, shndx: genTextShndx(0)}) {
					return
				}
			}
		}
	}
	g := genELF{class: elf.ELFCLASS64, texts: []genText{{addr: 0x1000, size: uint64(n) * 16}}, dynsym: syms(false)}
	if buildID != "" {
		g.buildID = []byte(buildID)
	}
	if !stripped {
		g.symtab = syms(true)
	}
	return g
}

// entryOf returns the cache entry that addr of pid resolves through.
func entryOf(t *testing.T, s *Symbolizer, pid int, addr uint64) *cacheEntry {
	t.Helper()
	m := findMapping(s.maps[pid], addr)
	if m == nil {
		t.Fatalf("pid %d: %#x not mapped", pid, addr)
	}
	return s.files[m.key]
}

// checkCache checks the cache's bookkeeping against its bounds.
func checkCache(t *testing.T, s *Symbolizer) {
	t.Helper()
	total := 0
	for _, e := range s.entries {
		total += e.cost
		if len(e.keys) > maxAliases {
			t.Errorf("entry has %d keys, want at most %d", len(e.keys), maxAliases)
		}
		for _, k := range e.keys {
			if s.files[k] != e {
				t.Errorf("key %v does not lead to its entry", k)
			}
		}
	}
	if total != s.bytes {
		t.Errorf("entries cost %d bytes, cache counts %d", total, s.bytes)
	}
	for k, e := range s.files {
		if !slices.Contains(s.entries, e) {
			t.Errorf("key %v leads to an evicted entry", k)
		}
	}
	for b, e := range s.builds {
		if !slices.Contains(s.entries, e) || e.info.build != b {
			t.Errorf("build-id %q leads to an evicted or other entry", b.id)
		}
	}
	if len(s.entries) > 1 && (s.bytes > s.maxBytes || len(s.entries) > s.maxFiles) {
		t.Errorf("cache holds %d files, %d bytes; bounds %d files, %d bytes", len(s.entries), s.bytes, s.maxFiles, s.maxBytes)
	}
}

func TestCacheSharedBuildID(t *testing.T) {
	root := t.TempDir()
	// The same library in two containers: other paths, other inodes.
	a := mapLib(t, root, 300, "/opt/a/libx.so", 1, 0x7f0000000000, smallLib("x-build", "x", 100, false))
	b := mapLib(t, root, 301, "/opt/b/libx.so", 2, 0x7f1000000000, smallLib("x-build", "x", 100, false))
	// Its stripped copy keeps the build-id.
	c := mapLib(t, root, 302, "/opt/c/libx.so", 3, 0x7f2000000000, smallLib("x-build", "x", 100, true))
	// Without a build-id, copies are told apart by inode only.
	d := mapLib(t, root, 303, "/opt/d/liby.so", 4, 0x7f3000000000, smallLib("", "y", 100, false))
	e := mapLib(t, root, 304, "/opt/e/liby.so", 5, 0x7f4000000000, smallLib("", "y", 100, false))

	s := New(root)
	cases := []struct {
		pid  int
		addr uint64
		want string
	}{
		{300, a.addr(0, 0x1034), "x3+0x4 (libx.so)"},
		{301, b.addr(0, 0x1034), "x3+0x4 (libx.so)"},
		{302, c.addr(0, 0x1034), "libx.so+0x1034"},
		{302, c.addr(0, 0x1044), "x4+0x4 (libx.so)"},
		{303, d.addr(0, 0x1034), "y3+0x4 (liby.so)"},
		{304, e.addr(0, 0x1034), "y3+0x4 (liby.so)"},
	}
	for _, c := range cases {
		if got := frameTexts(s, c.pid, []uint64{c.addr})[0]; got != c.want {
			t.Errorf("pid %d: frame of %#x = %q, want %q", c.pid, c.addr, got, c.want)
		}
	}
	shared := entryOf(t, s, 300, a.start)
	if entryOf(t, s, 301, b.start) != shared {
		t.Error("copies with one build-id are cached twice")
	}
	if entryOf(t, s, 302, c.start) == shared {
		t.Error("stripped copy shares the unstripped one's entry")
	}
	if entryOf(t, s, 303, d.start) == entryOf(t, s, 304, e.start) {
		t.Error("files without build-id share an entry")
	}
	if len(s.entries) != 4 {
		t.Errorf("cache holds %d files, want 4", len(s.entries))
	}
	if shared.info.tables[1].index != nil {
		t.Error(".dynsym indexed although .symtab answered")
	}
	checkCache(t, s)

	t.Run("many copies", func(t *testing.T) {
		var libs []fakeLib
		for i := range 2 * maxAliases {
			libs = append(libs, mapLib(t, root, 305, fmt.Sprintf("/opt/%d/libx.so", i), 100+i, 0x7f0000000000+uint64(i)<<32, smallLib("x-build", "x", 100, false)))
		}
		for round := range 2 {
			for i, l := range libs {
				if got := frameTexts(s, 305, []uint64{l.addr(0, 0x1034)})[0]; got != "x3+0x4 (libx.so)" {
					t.Fatalf("round %d, copy %d: frame = %q", round, i, got)
				}
			}
		}
		if entryOf(t, s, 305, libs[len(libs)-1].start) != shared {
			t.Error("copy not shared")
		}
		checkCache(t, s)
	})
}

func TestCacheEviction(t *testing.T) {
	root := t.TempDir()
	const pid, nlibs, nfuncs = 400, 4, 2000
	var libs []fakeLib
	for i := range nlibs {
		path := fmt.Sprintf("/usr/lib/lib%d.so", i)
		libs = append(libs, mapLib(t, root, pid, path, 10+i, 0x7f0000000000+uint64(i)<<32, smallLib(path, fmt.Sprintf("l%d_", i), nfuncs, false)))
	}
	for _, c := range []struct {
		name               string
		maxBytes, maxFiles int
	}{
		{"tiny byte cap", 1, maxCacheFiles},
		{"two files", maxCacheBytes, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := New(root)
			s.maxBytes, s.maxFiles = c.maxBytes, c.maxFiles
			var seen []*cacheEntry
			for round := range 3 {
				for i, l := range libs {
					fn := (round*nlibs + i) * 97 % nfuncs
					addrs := []uint64{l.addr(0, 0x1000+uint64(fn)*16+5), l.addr(0, 0x1000+uint64(nfuncs)*16)}
					want := []string{fmt.Sprintf("l%d_%d+0x5 (lib%d.so)", i, fn, i), fmt.Sprintf("lib%d.so+%#x", i, 0x1000+nfuncs*16)}
					if got := frameTexts(s, pid, addrs); !slices.Equal(got, want) {
						t.Fatalf("round %d: frames = %q, want %q", round, got, want)
					}
					if e := entryOf(t, s, pid, l.start); !slices.Contains(seen, e) {
						seen = append(seen, e)
					}
					checkCache(t, s)
				}
			}
			if len(seen) <= nlibs {
				t.Fatalf("%d files cached over the rounds; nothing was evicted", len(seen))
			}
			for _, e := range seen {
				if slices.Contains(s.entries, e) {
					continue
				}
				if _, err := e.info.f.ReadAt(make([]byte, 1), 0); !errors.Is(err, os.ErrClosed) {
					t.Errorf("%s: evicted file not closed: read error %v", e.info.f.Name(), err)
				}
			}
		})
	}
}

func BenchmarkSymbolize300k(b *testing.B) {
	root := b.TempDir()
	lib := mapLib(b, root, 100, "/usr/lib/libbig.so", 77, 0x7f0000000000, bigLib())
	var addrs []uint64
	for _, v := range bigAddrs() {
		addrs = append(addrs, lib.addr(0, v))
	}
	b.Run("index", func(b *testing.B) {
		// Each iteration opens the file, reads its headers, indexes
		// .symtab and names one function.
		var s *Symbolizer
		one := []uint64{lib.addr(0, bigText+1000*funcStride+3)}
		for b.Loop() {
			s = New(root)
			s.Frames(100, one)
		}
		b.ReportMetric(float64(s.bytes)/(1<<20), "MiB-cached")
	})
	b.Run("lookup", func(b *testing.B) {
		s := New(root)
		s.Frames(100, addrs)
		i := 0
		for b.Loop() {
			s.Frames(100, addrs[i:i+1])
			i = (i + 1) % len(addrs)
		}
	})
}

// TestBuildID checks the build-id read from program headers against the
// .note.gnu.build-id section, in files whose note segments also hold
// 8-byte-aligned property notes.
func TestBuildID(t *testing.T) {
	var paths []string
	for _, p := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"} {
		if _, err := os.Stat(p); err == nil {
			paths = append(paths, p)
		}
	}
	paths = append(paths, buildTarget(t, "target", "-fPIE", "-pie", "-Wl,--build-id=sha1"))
	for _, p := range paths {
		ef, err := elf.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		sec := ef.Section(".note.gnu.build-id")
		if sec == nil {
			ef.Close()
			t.Fatalf("%s: no .note.gnu.build-id", p)
		}
		note, err := sec.Data()
		ef.Close()
		if err != nil || len(note) < 16 {
			t.Fatalf("%s: build-id note: %v", p, err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		info, err := parseELF(f)
		if err != nil {
			t.Fatal(err)
		}
		if want := string(note[16:]); info.build.id != want {
			t.Errorf("%s: build-id %x, want %x", p, info.build.id, want)
		}
		f.Close()
	}
}
