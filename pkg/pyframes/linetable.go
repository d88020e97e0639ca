package pyframes

// Line numbers from a code object's co_linetable, as PyCode_Addr2Line
// computes them. Both return -1 where the table says the instruction has no
// line, or does not cover it.

// lineAt310 decodes the 3.10 table (Objects/lnotab_notes.txt): pairs of an
// unsigned byte-offset delta and a signed line delta, -128 meaning "no
// line", starting at firstLine. offset is in bytes (2 per instruction).
func lineAt310(table []byte, firstLine, offset int) int {
	line, end := firstLine, 0
	for i := 0; i+1 < len(table); i += 2 {
		start := end
		end += int(table[i])
		ldelta := int(int8(table[i+1]))
		cur := -1
		if ldelta != -128 {
			line += ldelta
			cur = line
		}
		if start <= offset && offset < end {
			return cur
		}
	}
	return -1
}

// lineAt311 decodes the location table of 3.11 and later
// (Objects/locations.md): entries of a first byte 1CCCCLLL (code C, length
// L+1 code units) and what the code says follows. unit is the instruction's
// index in code units.
func lineAt311(table []byte, firstLine, unit int) int {
	line, addr := firstLine, 0
	i := 0
	next := func() (byte, bool) {
		if i >= len(table) {
			return 0, false
		}
		b := table[i]
		i++
		return b, true
	}
	varint := func() int {
		b, ok := next()
		if !ok {
			return 0
		}
		v, shift := int(b&63), 0
		for b&64 != 0 {
			if b, ok = next(); !ok {
				break
			}
			shift += 6
			v |= int(b&63) << shift
		}
		return v
	}
	svarint := func() int {
		v := varint()
		if v&1 != 0 {
			return -(v >> 1)
		}
		return v >> 1
	}
	for {
		first, ok := next()
		if !ok {
			return -1
		}
		code := int(first>>3) & 15
		length := int(first&7) + 1
		cur := line
		switch {
		case code == 15: // no location
			cur = -1
		case code == 14: // long form: line delta, end line, columns
			line += svarint()
			cur = line
			varint()
			varint()
			varint()
		case code == 13: // no columns
			line += svarint()
			cur = line
		case code >= 10: // one line: delta code-10, two column bytes
			line += code - 10
			cur = line
			next()
			next()
		default: // short form: same line, one column byte
			next()
		}
		if unit >= addr && unit < addr+length {
			return cur
		}
		addr += length
	}
}
