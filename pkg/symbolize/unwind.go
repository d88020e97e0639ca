package symbolize

import "encoding/binary"

// Code is not mapped in the lowest 64 KiB (loaders map far above
// vm.mmap_min_addr) nor above the 47-bit x86-64 user address space (only an
// explicit hint maps higher). Many stack words are small integers or text
// outside that range; rejecting them before the lookup keeps them from
// spending the one re-read of the maps per call.
const (
	minCodeAddr = 0x10000
	maxCodeAddr = 1 << 47
)

// maxCallLen is the longest call instruction that decodeCall recognizes,
// not counting a prefix, which does not move where the call ends.
const maxCallLen = 7

// Unwind merges a frame-pointer stack (fp[0] is the instruction pointer) with a
// scan of the raw user stack words at the stack pointer. It returns the addresses to symbolize,
// innermost first: fp[0]; then every scan word that is a plausible return address,
// in stack order, stopping at the first one equal to fp[1] (when fp[1] is itself
// plausible the frame-pointer chain is intact from there); then the plausible
// frames of fp[1:]. Implausible fp frames (garbage) are dropped.
//
// A plausible return address lies in an executable segment of a mapped ELF
// file, right after a call instruction. Code without frame pointers (such as
// glibc's syscall wrappers, which use rbp as a general register) breaks the
// frame-pointer chain; its caller's return address is still on the stack.
func (s *Symbolizer) Unwind(pid int, fp, scan []uint64) []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	rs := &returnSites{pm: s.procMaps(pid)}
	return mergeStacks(fp, scan, rs.plausible)
}

// mergeStacks is Unwind's merge rule, with the test for a plausible return
// address left to isRet.
func mergeStacks(fp, scan []uint64, isRet func(uint64) bool) []uint64 {
	var out, callers []uint64
	if len(fp) > 0 {
		out = append(out, fp[0])
		callers = fp[1:]
	}
	// A garbage fp[1] says nothing about where the chain's frames are on the
	// stack, so the whole scan is kept.
	intact := len(callers) > 0 && isRet(callers[0])
	for _, w := range scan {
		if intact && w == callers[0] {
			break
		}
		if isRet(w) {
			out = append(out, w)
		}
	}
	for _, a := range callers {
		if isRet(a) {
			out = append(out, a)
		}
	}
	return out
}

// returnSites tells return addresses of one process during one Unwind call.
type returnSites struct {
	pm *procMaps
}

func (rs *returnSites) plausible(addr uint64) bool {
	if addr < minCodeAddr || addr >= maxCodeAddr {
		return false
	}
	m := rs.pm.find(addr)
	if m == nil || m.path == "" {
		return false
	}
	e := rs.pm.s.elfFor(rs.pm.pid, m)
	if e == nil {
		return false
	}
	info := e.info
	off := addr - m.start + m.offset
	l, ok := info.loadAt(off)
	if !ok || !l.exec {
		return false
	}
	// The call must lie in the same segment; bytes before it in the file
	// belong to another segment or to the headers. A file shared by
	// build-id has the same bytes.
	n := min(maxCallLen, off-l.off)
	code := make([]byte, n)
	if _, err := info.f.ReadAt(code, int64(off-n)); err != nil {
		return false
	}
	indirect, direct, rel := decodeCall(code)
	// A direct call stays within its module (calls to other modules go
	// through the PLT), so a target outside its code exposes a mere E8 byte.
	return indirect || direct && info.inCode(off-l.off+l.vaddr+uint64(int64(rel)))
}

// decodeCall decodes code, the bytes that end at a candidate return address,
// as an x86-64 call instruction ending there: indirect for a call through a
// register or memory (FF /2), direct for a call rel32 (E8) whose target is
// rel bytes from the return address. Both can hold for the same bytes.
func decodeCall(code []byte) (indirect, direct bool, rel int32) {
	n := len(code)
	if n >= 5 && code[n-5] == 0xe8 {
		direct, rel = true, int32(binary.LittleEndian.Uint32(code[n-4:]))
	}
	for i := 2; i <= min(n, maxCallLen); i++ {
		if code[n-i] == 0xff && callFFLen(code[n-i+1:]) == i {
			indirect = true
		}
	}
	return indirect, direct, rel
}

// callFFLen returns the length, from the FF opcode on, of the call FF /2
// whose ModRM byte starts b, or 0 when b does not start one. b may end before
// the instruction does.
func callFFLen(b []byte) int {
	modrm := b[0]
	if (modrm>>3)&7 != 2 {
		return 0
	}
	mod, rm := modrm>>6, modrm&7
	if rm == 4 && mod != 3 && len(b) < 2 {
		// A SIB byte follows, so the instruction ends past b.
		return 0
	}
	switch {
	case mod == 3: // call *%reg
		return 2
	case mod == 0 && rm == 5: // call *disp32(%rip)
		return 6
	case mod == 0 && rm == 4 && b[1]&7 == 5: // SIB without base: disp32
		return 7
	case mod == 0 && rm == 4:
		return 3
	case mod == 0:
		return 2
	case mod == 1 && rm == 4:
		return 4
	case mod == 1:
		return 3
	case mod == 2 && rm == 4:
		return 7
	default: // mod == 2: disp32
		return 6
	}
}
