package symbolize

import (
	"bytes"
	"debug/elf"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// fuzzSeedELF compiles testdata/target.c (-O2, -g: symbols, .eh_frame_hdr
// and DWARF lines in about 17 KiB) for the seed corpus, and returns it with
// the address of leakyfn; nil without gcc.
func fuzzSeedELF(f *testing.F) ([]byte, uint64) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return nil, 0
	}
	out := filepath.Join(f.TempDir(), "target")
	if b, err := exec.Command(gcc, "-O2", "-g", "-fPIE", "-pie", "-Wl,--build-id=sha1", "-o", out, "testdata/target.c").CombinedOutput(); err != nil {
		f.Fatalf("gcc: %v\n%s", err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		f.Fatal(err)
	}
	ef, err := elf.Open(out)
	if err != nil {
		f.Fatal(err)
	}
	defer ef.Close()
	syms, _ := ef.Symbols()
	for _, s := range syms {
		if s.Name == "leakyfn" {
			return b, s.Value
		}
	}
	f.Fatal("no leakyfn in target")
	return nil, 0
}

// FuzzELF reads any file as a mapped library is read: headers, build-id
// note, symbol tables, .eh_frame_hdr and .eh_frame rules, DWARF lines. It
// must not panic (contain is the last resort, not the plan), and what it
// keeps is bounded by the file: an index entry per symbol table entry at
// most, rules of the known kinds only.
//
//	go test -run '^$' -fuzz FuzzELF ./pkg/symbolize
func FuzzELF(f *testing.F) {
	if seed, fn := fuzzSeedELF(f); seed != nil {
		// Truncated too: the tables then point past the end of the file.
		f.Add(seed, fn+4)
		f.Add(seed[:len(seed)/2], fn+4)
	}
	// A library as Debian builds and strips it (libc6's libdl.so.2, 14
	// KiB: build-id, .eh_frame_hdr, .dynsym only), at one of its functions.
	if lib, err := os.ReadFile("/lib/x86_64-linux-gnu/libdl.so.2"); err == nil {
		if ef, err := elf.NewFile(bytes.NewReader(lib)); err == nil {
			syms, _ := ef.DynamicSymbols()
			if i := slices.IndexFunc(syms, func(s elf.Symbol) bool { return elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 }); i >= 0 {
				f.Add(lib, syms[i].Value+4)
			}
		}
	}
	f.Add([]byte("\x7fELF\x02\x01\x01"), uint64(0))
	f.Fuzz(func(t *testing.T, data []byte, vaddr uint64) {
		// In memory: a file written and truncated per input is slow, and
		// where opening one is interrupted by the runtime's preemption
		// signals, the retries can stall a fuzzing worker.
		fd, err := unix.MemfdCreate("elf", unix.MFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		file := os.NewFile(uintptr(fd), "elf")
		if _, err := file.Write(data); err != nil {
			t.Fatal(err)
		}
		info, err := parseELF(file)
		if err != nil {
			file.Close()
			return
		}
		defer file.Close()
		if len(info.build.id) > len(data) || info.buildID != hex.EncodeToString([]byte(info.build.id)) {
			t.Fatalf("build id %q (hex %q) from a %d-byte file", info.build.id, info.buildID, len(data))
		}
		for _, at := range []uint64{vaddr, vaddr + 1, info.eh.hdrAddr} {
			if sym, ok := info.lookup(at); ok {
				if sym.start > at || len(sym.name) > len(data) || strings.IndexByte(sym.name, 0) >= 0 {
					t.Fatalf("lookup(%#x) = %+v", at, sym)
				}
				_ = readable(sym.name)
			}
			if r, found, err := info.rule(at); err == nil && found {
				if r.CFA > CFARBP || r.RBP > RBPUndefined {
					t.Fatalf("rule(%#x) = %+v: no such kind", at, r)
				}
			}
			if tab := info.lines(); tab != nil {
				if l := tab.line(at); l.line < 0 || len(l.file) > len(data) {
					t.Fatalf("line(%#x) = %+v", at, l)
				}
			}
		}
		// An entry of 12 or 16 bytes per symbol of 16 or 24 bytes.
		if n := info.indexBytes(); info.lineTab == nil && n > len(data) {
			t.Fatalf("indexes of %d bytes from a %d-byte file", n, len(data))
		}
	})
}

// FuzzReadable demangles any symbol name without panicking, and leaves
// what is not a mangled name as it is.
//
//	go test -run '^$' -fuzz FuzzReadable ./pkg/symbolize
func FuzzReadable(f *testing.F) {
	for _, s := range []string{
		"_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator11alloc_blockERNS2_10AllocParamsEb",
		"_ZNSt6vectorIiSaIiEE9push_backERKi", "_RNvCs1234_7mycrate3foo", "_ZZ4mainE1x", "malloc", "_Z", "_R",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		out := readable(name)
		if !strings.HasPrefix(name, "_Z") && !strings.HasPrefix(name, "_R") && out != name {
			t.Fatalf("readable(%q) = %q, want it unchanged", name, out)
		}
		if name != "" && out == "" {
			t.Fatalf("readable(%q) is empty", name)
		}
		if utf8.ValidString(name) && !utf8.ValidString(out) {
			t.Fatalf("readable(%q) = %q: not UTF-8", name, out)
		}
	})
}
