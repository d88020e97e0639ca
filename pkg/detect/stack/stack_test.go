package stack

import "testing"

func TestCallSite(t *testing.T) {
	for _, tc := range []struct {
		stack []string
		want  string
	}{
		{[]string{"__open64+0x51 (libc.so.6)", "cache_tokenizer+0x1a (demo)", "main+0x5f (demo)"}, "cache_tokenizer+0x1a (demo)"},
		{[]string{"leak_tick+0x1a (fdwork)", "main+0x40 (fdwork)"}, "leak_tick+0x1a (fdwork)"},
		{[]string{"__open64+0x51 (libc.so.6)", "0x7ffd0000"}, "__open64+0x51 (libc.so.6)"},
	} {
		if got := CallSite(tc.stack); got != tc.want {
			t.Errorf("CallSite(%q) = %q, want %q", tc.stack, got, tc.want)
		}
	}
}

func TestFunction(t *testing.T) {
	for frame, want := range map[string]string{
		"cache_tokenizer+0x1a (demo)":  "cache_tokenizer",
		"main (demo)":                  "main",
		"libfoo.so+0x1234 (libfoo.so)": "libfoo.so",
		"0x7ffd0000":                   "0x7ffd0000",
	} {
		if got := Function(frame); got != want {
			t.Errorf("Function(%q) = %q, want %q", frame, got, want)
		}
	}
}
