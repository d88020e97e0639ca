package symbolize

import "testing"

func TestReadable(t *testing.T) {
	for in, want := range map[string]string{
		"_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator11alloc_blockERNS2_10AllocParamsEb": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block",
		"_ZNSt6vectorIiSaIiEE9push_backERKi":    "std::vector<int, std::allocator<int> >::push_back",
		"_ZN5torch8autograd6engine4execEv.cold": "torch::autograd::engine::exec",
		"cache_tokenizer":                       "cache_tokenizer",
		"_Znot_mangled":                         "_Znot_mangled",
	} {
		if got := readable(in); got != want {
			t.Errorf("readable(%q) = %q, want %q", in, got, want)
		}
	}
}
