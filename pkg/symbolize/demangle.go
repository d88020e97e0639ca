package symbolize

import (
	"strings"
	"unicode/utf8"

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
	// error: a frame must keep a function name. A length that ends inside
	// a multi-byte character ("_Z6A0000ù") cuts it in two: the name stays
	// valid UTF-8 (JSON, HTML, labels) as it came.
	if err != nil || out == "" || (!utf8.ValidString(out) && utf8.ValidString(name)) {
		return name
	}
	return out
}
