package procinfo

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// parseMaps takes any bytes without panicking and returns at most one
// mapping a line; and a line as the kernel formats it (show_map_vma) of
// any fields and any path without a newline reads back as written.
//
//	go test -run '^$' -fuzz FuzzParseMaps ./pkg/procinfo
func FuzzParseMaps(f *testing.F) {
	f.Add([]byte("55d0c0de0000-55d0c0de1000 r-xp 00001000 08:01 1234   /usr/bin/python3.11\n7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]\n"),
		uint64(0x7f0000000000), uint64(0x7f0000001000), uint64(0x2000), uint32(8), uint32(1), uint64(1234), "/usr/lib/libc.so.6 (deleted)")
	f.Add([]byte("0-1 rwxs 0 0:0 0\n\n"), uint64(0), uint64(0), uint64(0), uint32(0), uint32(0), uint64(0), "")
	f.Add([]byte("1-2 r 0 0:0 0"), uint64(1<<63), uint64(1<<64-1), uint64(1<<62), uint32(0xfff), uint32(0xfffff), uint64(1<<64-1), "  lead and trail  ")
	f.Fuzz(func(t *testing.T, raw []byte, start, end, off uint64, major, minor uint32, inode uint64, path string) {
		if maps, err := parseMaps(raw); err == nil && len(maps) > bytes.Count(raw, []byte{'\n'})+1 {
			t.Fatalf("parseMaps(%q): %d mappings", raw, len(maps))
		}

		// The kernel's fields: offset < 2^63 (loff_t), a 12-bit major
		// and 20-bit minor, a path without newlines, its leading spaces
		// taken as padding.
		off &= 1<<63 - 1
		major &= 0xfff
		minor &= 0xfffff
		path = strings.TrimLeft(strings.ReplaceAll(path, "\n", ""), " ")
		line := fmt.Sprintf("%08x-%08x r-xp %08x %02x:%02x %d", start, end, off, major, minor, inode)
		if path != "" {
			line += strings.Repeat(" ", 3) + path
		}
		maps, err := parseMaps([]byte(line + "\n"))
		if err != nil || len(maps) != 1 {
			t.Fatalf("parseMaps(%q) = %v, %v", line, maps, err)
		}
		m := maps[0]
		if uint64(m.StartAddr) != start || uint64(m.EndAddr) != end || uint64(m.Offset) != off ||
			m.Dev != unix.Mkdev(major, minor) || m.Inode != inode || m.Pathname != path ||
			!m.Perms.Read || m.Perms.Write || !m.Perms.Execute || !m.Perms.Private {
			t.Fatalf("parseMaps(%q) = %+v %+v", line, *m, *m.Perms)
		}
	})
}
