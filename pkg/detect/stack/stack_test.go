package stack

import (
	"testing"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// frames parses frames as String writes them.
func frames(texts []string) []model.Frame {
	out := make([]model.Frame, len(texts))
	for i, s := range texts {
		out[i] = model.ParseFrame(s)
	}
	return out
}

func TestCallSite(t *testing.T) {
	for _, tc := range []struct {
		stack []string
		want  string
	}{
		{[]string{"__open64+0x51 (libc.so.6)", "cache_tokenizer+0x1a (demo)", "main+0x5f (demo)"}, "cache_tokenizer+0x1a (demo)"},
		{[]string{"leak_tick+0x1a (fdwork)", "main+0x40 (fdwork)"}, "leak_tick+0x1a (fdwork)"},
		// A whole stack from the executable's code down to _start.
		{[]string{"load_checkpoint+0x1f (cudawork)", "main+0x697 (cudawork)", "libc.so.6+0x2724a",
			"__libc_start_main+0x85 (libc.so.6)", "_start+0x21 (cudawork)"}, "load_checkpoint+0x1f (cudawork)"},
		{[]string{"c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc+0x2a1 (libc10_cuda.so)",
			"c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate+0x1bd (libc10_cuda.so)",
			"at::detail::empty_generic+0x68 (libtorch_cpu.so)"}, "at::detail::empty_generic+0x68 (libtorch_cpu.so)"},
		{[]string{"__open64+0x51 (libc.so.6)", "0x7ffd0000"}, "__open64+0x51 (libc.so.6)"},
	} {
		if got := CallSite(frames(tc.stack)); got != tc.want {
			t.Errorf("CallSite(%q) = %q, want %q", tc.stack, got, tc.want)
		}
	}
}

func TestFunction(t *testing.T) {
	for frame, want := range map[string]string{
		"cache_tokenizer+0x1a (demo)":     "cache_tokenizer",
		"main (demo)":                     "main",
		"libfoo.so+0x1234":                "libfoo.so",
		"0x7ffd0000":                      "0x7ffd0000",
		"cache_tokenizer (/x/leak.py:12)": "cache_tokenizer",
		"ns::(anonymous namespace)::load+0x10 (libfoo.so)": "ns::(anonymous namespace)::load",
	} {
		if got := Function(model.ParseFrame(frame)); got != want {
			t.Errorf("Function(%q) = %q, want %q", frame, got, want)
		}
	}
}

func TestCallSitePython(t *testing.T) {
	for _, tc := range []struct {
		stack []string
		want  string
	}{
		// The user's innermost frame, behind the interpreter's and the
		// standard library's.
		{[]string{"__open64+0x51 (libc.so.6)", "_io_FileIO___init__+0x1a2 (python3.11)",
			"open (/usr/lib/python3.11/pathlib.py:1044)", "cache_tokenizer (/srv/app/leak.py:12)", "main (/srv/app/leak.py:30)"},
			"cache_tokenizer (leak.py:12)"},
		{[]string{"cudaMalloc+0x10 (libcudart.so.11.0)", "ffi_call+0x8f (libffi.so.8)",
			"load (/venv/lib/python3.12/site-packages/torch/serialization.py:1025)", "<module> (serve.py:88)"},
			"<module> (serve.py:88)"},
		// Only library frames: the innermost, with its package path.
		{[]string{"__open64+0x51 (libc.so.6)", "get (/usr/lib/python3/dist-packages/requests/api.py:73)",
			"_bootstrap (<frozen importlib._bootstrap>:1)"},
			"get (requests/api.py:73)"},
		// Qualified names keep their dots.
		{[]string{"Loader.load_adapter (/srv/app/serve.py:88)"}, "Loader.load_adapter (serve.py:88)"},
	} {
		if got := CallSite(frames(tc.stack)); got != tc.want {
			t.Errorf("CallSite(%q) = %q, want %q", tc.stack, got, tc.want)
		}
	}
}

func TestUserCode(t *testing.T) {
	for file, want := range map[string]bool{
		"/srv/app/serve.py":                                 true,
		"serve.py":                                          true,
		"/home/u/lib/python3.11-notes/x.py":                 true,
		"/usr/lib/python3.11/pathlib.py":                    false,
		"/usr/lib/python3/dist-packages/requests/api.py":    false,
		"/venv/lib/python3.12/site-packages/torch/nn.py":    false,
		"/root/.pyenv/versions/3.13.0/lib/python3.13/os.py": false,
		"<frozen importlib._bootstrap>":                     false,
		"<string>":                                          false,
	} {
		if got := UserCode(file); got != want {
			t.Errorf("UserCode(%q) = %v, want %v", file, got, want)
		}
	}
}

// native is a native frame; with a file, it has line 10.
func native(fn, module, file string) model.Frame {
	f := model.Frame{Kind: model.FrameNative, Function: fn, Module: module, File: file, Offset: 0x10}
	if file != "" {
		f.Line = 10
	}
	return f
}

func TestCallFrameNativeLines(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stack []model.Frame
		want  string
	}{
		{"static C: libc's wrapper has no line", []model.Frame{
			native("__open64", "app", ""), native("fopen", "app", ""),
			native("burst_step", "app", "/src/app.c"), native("main", "app", "/src/app.c")},
			"burst_step (app.c:10)"},
		{"Go: runtime and standard library passed over", []model.Frame{
			native("internal/runtime/syscall/linux.Syscall6", "srv", "/usr/lib/go/src/internal/runtime/syscall/linux/asm_linux_amd64.s"),
			native("syscall.Syscall6", "srv", "/usr/lib/go/src/syscall/syscall_linux.go"),
			native("os.OpenFile", "srv", "/usr/lib/go/src/os/file.go"),
			native("github.com/acme/cache.(*Shard).Load", "srv", "/build/cache/shard.go"),
			native("main.main", "srv", "/build/main.go")},
			"github.com/acme/cache.(*Shard).Load (shard.go:10)"},
		{"Go main", []model.Frame{
			native("syscall.Syscall6", "srv", "/usr/lib/go/src/syscall/syscall_linux.go"),
			native("main.cacheShard", "srv", "/build/main.go")},
			"main.cacheShard (main.go:10)"},
		{"C++ standard library, in its library and inlined", []model.Frame{
			native("__open64", "libc.so.6", ""),
			native("std::__basic_file<char>::open", "libstdc++.so.6", ""),
			native("std::basic_ifstream<char, std::char_traits<char> >::basic_ifstream", "app", "/usr/include/c++/12/fstream"),
			native("load_vocab", "app", "/src/app.cc")},
			"load_vocab (app.cc:10)"},
		{"a library without lines between: named as before", []model.Frame{
			native("__open64", "libc.so.6", ""), native("plugin_open", "libplug.so", ""),
			native("main", "app", "/src/app.c")},
			"plugin_open+0x10 (libplug.so)"},
		{"only system frames with lines: named as before", []model.Frame{
			native("syscall.Syscall6", "srv", "/usr/lib/go/src/syscall/syscall_linux.go"),
			native("runtime.main", "srv", "/usr/lib/go/src/runtime/proc.go")},
			"syscall.Syscall6 (syscall_linux.go:10)"},
	} {
		if got := CallSite(tc.stack); got != tc.want {
			t.Errorf("%s: CallSite = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestGoStd(t *testing.T) {
	for fn, want := range map[string]bool{
		"os.(*File).Close":                                  true,
		"internal/runtime/syscall/linux.Syscall6":           true,
		"runtime.goexit.abi0":                               true,
		"vendor/golang.org/x/net/http2.(*Framer).ReadFrame": true,
		"main.cacheShard":                                   false,
		"main.main.func1":                                   false,
		"github.com/acme/cache.(*Shard).Load":               false,
		"golang.org/x/sys/unix.Open":                        false,
	} {
		if got := goStd(fn); got != want {
			t.Errorf("goStd(%q) = %v, want %v", fn, got, want)
		}
	}
}
