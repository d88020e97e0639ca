package symbolize

import (
	"strings"

	"github.com/ianlancetaylor/demangle"
)

// readable turns a C++ (Itanium ABI) or Rust symbol into the name a person
// writes, without the parameter list: PyTorch's allocator frames read
// c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block
// instead of _ZN3c104cuda20CUDACachingAllocator6Native22DeviceCaching....
// Anything else, or a name the demangler cannot read, is returned as is.
func readable(name string) string {
	if !strings.HasPrefix(name, "_Z") && !strings.HasPrefix(name, "_R") {
		return name
	}
	out, err := demangle.ToString(name, demangle.NoParams, demangle.NoClones)
	// Some malformed Rust names ("_RC0") demangle to nothing without an
	// error: a frame must keep a function name.
	if err != nil || out == "" {
		return name
	}
	return out
}
