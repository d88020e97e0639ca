package pyframes

import "testing"

// The line tables come from the process's memory: any bytes decode without
// panicking and give -1 or a line within what the table's deltas can
// reach; and tables written as CPython writes them (one instruction per
// entry, the line deltas of raw) decode back to every instruction's line.
//
//	go test -run '^$' -fuzz FuzzLineTables ./pkg/pyframes
func FuzzLineTables(f *testing.F) {
	f.Add([]byte{0xe8, 0x02, 0xf0, 0x00}, 1, 0)                 // 3.11: no columns, +1; a truncated long form
	f.Add([]byte{0x02, 0x01, 0x04, 0x80, 0x06, 0xfe}, 10, 4)    // 3.10: +1, no line, -2
	f.Add([]byte{0xf0, 0xc3, 0xff, 0xff, 0xff, 0x7f}, 1<<30, 1) // a long varint
	f.Fuzz(func(t *testing.T, raw []byte, first, at int) {
		// 3.10 moves the line by at most 127 per 2 bytes, 3.11 by a
		// varint of up to 6 bits per byte: only bounds of the first.
		if l := lineAt310(raw, first, at); l != -1 && (l-first > 127*len(raw) || first-l > 127*len(raw)) {
			t.Fatalf("lineAt310(%x, %d, %d) = %d", raw, first, at, l)
		}
		_ = lineAt311(raw, first, at)

		first &= 1<<20 - 1
		var t310, t311 []byte
		for _, b := range raw {
			d := int(int8(b))
			if d == -128 {
				d = 0
			}
			t310 = append(t310, 2, byte(int8(d)))
			// Code 13 (no columns), one code unit, a signed varint.
			v := d << 1
			if d < 0 {
				v = -d<<1 | 1
			}
			t311 = append(t311, 0x80|13<<3)
			for ; v >= 64; v >>= 6 {
				t311 = append(t311, byte(64|v&63))
			}
			t311 = append(t311, byte(v))
		}
		line := first
		for i, b := range raw {
			d := int(int8(b))
			if d != -128 {
				line += d
			}
			if got := lineAt310(t310, first, 2*i); got != line {
				t.Fatalf("3.10 table %x at byte %d: line %d, want %d", t310, 2*i, got, line)
			}
			if got := lineAt311(t311, first, i); got != line {
				t.Fatalf("3.11 table %x at unit %d: line %d, want %d", t311, i, got, line)
			}
		}
		if got := lineAt311(t311, first, len(raw)); got != -1 {
			t.Fatalf("3.11 table %x past its end: line %d, want -1", t311, got)
		}
	})
}
