package unwind

import (
	"bufio"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
)

// RAMask is the bits of a user return address that are the address, for
// bpf/unwind.h's unwind_ra_mask and symbolize.StackCopy: on AArch64 code
// built with -mbranch-protection signs the return addresses it saves, with a
// pointer authentication code in the bits above the virtual address size
// (and the top byte), which must go before an address is looked up. The
// size is the kernel's configuration (Debian: 48 bits; 39 on some), found
// from the highest user mapping, the stack's, which ends at or below
// TASK_SIZE: it is 48 bits too under a 52-bit kernel, which maps nothing
// above 2^48 for a process that does not ask, and whose codes start at bit
// 52 anyway. Elsewhere every bit is the address.
var RAMask = sync.OnceValue(func() uint64 {
	if runtime.GOARCH != "arm64" {
		return ^uint64(0)
	}
	top, err := highestMapping("/proc/self/maps")
	if err != nil {
		// Debian's and most distributions' arm64 kernels (4 KiB pages,
		// four levels).
		return 1<<48 - 1
	}
	return vaMask(top)
})

// vaMask is the mask of the bits of addresses below top, the end of the
// highest mapping.
func vaMask(top uint64) uint64 {
	return 1<<bits.Len64(top-1) - 1
}

// highestMapping returns the end of the highest mapping in a maps file.
func highestMapping(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var top uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		span, _, _ := strings.Cut(sc.Text(), " ")
		_, end, ok := strings.Cut(span, "-")
		if !ok {
			return 0, fmt.Errorf("%s: malformed line %q", path, sc.Text())
		}
		e, err := strconv.ParseUint(end, 16, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		top = max(top, e)
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if top == 0 {
		return 0, fmt.Errorf("%s: no mappings", path)
	}
	return top, nil
}
