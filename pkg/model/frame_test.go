package model

import (
	"encoding/json"
	"testing"
)

func TestFrameString(t *testing.T) {
	for _, tc := range []struct {
		f    Frame
		want string
	}{
		{Frame{Kind: FrameNative, Function: "cache_tokenizer", Module: "demo", Offset: 0x1a}, "cache_tokenizer+0x1a (demo)"},
		{Frame{Kind: FrameNative, Function: "main", Module: "demo"}, "main (demo)"},
		{Frame{Kind: FrameNative, Function: "c10::cuda::alloc_block", Module: "libc10_cuda.so", Offset: 0x40,
			Symbol: "_ZN3c104cuda11alloc_blockEv"}, "c10::cuda::alloc_block+0x40 (libc10_cuda.so)"},
		{Frame{Kind: FrameNative, Function: "ns::(anonymous namespace)::load", Module: "libfoo.so", Offset: 0x10},
			"ns::(anonymous namespace)::load+0x10 (libfoo.so)"},
		{Frame{Kind: FrameNative, Module: "libcuda.so.1", Offset: 0x4410}, "libcuda.so.1+0x4410"},
		{Frame{Kind: FrameNative, Module: "blob.bin"}, "blob.bin+0x0"},
		{Frame{Kind: FrameNative, Address: 0x7ffd0000}, "0x7ffd0000"},
		{Frame{Kind: FramePython, Function: "cache_tokenizer", File: "/srv/app/leak.py", Line: 16}, "cache_tokenizer (/srv/app/leak.py:16)"},
		{Frame{Kind: FramePython, Function: "<module>", File: "<frozen runpy>"}, "<module> (<frozen runpy>:0)"},
	} {
		if got := tc.f.String(); got != tc.want {
			t.Errorf("%+v: String() = %q, want %q", tc.f, got, tc.want)
		}
		// The text reads back as the frame, less the raw symbol.
		back := tc.f
		back.Symbol = ""
		if got := ParseFrame(tc.want); got != back {
			t.Errorf("ParseFrame(%q) = %+v, want %+v", tc.want, got, back)
		}
	}
}

func TestParseFrameKind(t *testing.T) {
	for text, want := range map[string]string{
		"cache_tokenizer (/x/leak.py:12)":             FramePython,
		"<module> (<frozen runpy>:198)":               FramePython,
		"Loader.load_adapter (/srv/app/serve.py:88)":  FramePython,
		"cache_tokenizer+0x1a (demo)":                 FrameNative,
		"libfoo.so+0x1234":                            FrameNative,
		"0x7ffd0000":                                  FrameNative,
		"main (demo)":                                 FrameNative,
		"_PyEval_EvalFrameDefault+0x4b2 (python3.11)": FrameNative,
	} {
		if got := ParseFrame(text); got.Kind != want {
			t.Errorf("ParseFrame(%q) kind %q, want %q", text, got.Kind, want)
		}
	}
}

func TestFrameJSON(t *testing.T) {
	native := Frame{Kind: FrameNative, Function: "c10::cuda::alloc_block", Module: "libc10_cuda.so", Offset: 0x40, Symbol: "_ZN3c104cuda11alloc_blockEv"}
	py := Frame{Kind: FramePython, Function: "cache_tokenizer", File: "leak.py", Line: 16}
	data, err := json.Marshal([]Frame{native, py, {Kind: FrameNative, Address: 0x10}})
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"function":"c10::cuda::alloc_block","kind":"native","module":"libc10_cuda.so","offset":64,"symbol":"_ZN3c104cuda11alloc_blockEv"},` +
		`{"file":"leak.py","function":"cache_tokenizer","kind":"python","line":16},` +
		`{"address":16,"kind":"native"}]`
	if string(data) != want {
		t.Errorf("JSON\n got %s\nwant %s", data, want)
	}
	// As a plain map read back encodes it.
	var plain any
	if err := json.Unmarshal(data, &plain); err != nil {
		t.Fatal(err)
	}
	if again, err := json.Marshal(plain); err != nil || string(again) != want {
		t.Errorf("read back as maps, the frames encode as %s", again)
	}

	var back []Frame
	if err := json.Unmarshal(data, &back); err != nil || len(back) != 3 || back[0] != native || back[1] != py {
		t.Errorf("read back %+v, %v", back, err)
	}
	// Schema 2 reports wrote frames as strings.
	var old []Frame
	if err := json.Unmarshal([]byte(`["alloc_block+0x40 (libc10_cuda.so)", "cache_tokenizer (leak.py:16)"]`), &old); err != nil {
		t.Fatal(err)
	}
	if len(old) != 2 || old[0] != (Frame{Kind: FrameNative, Function: "alloc_block", Module: "libc10_cuda.so", Offset: 0x40}) || old[1] != py {
		t.Errorf("schema 2 frames read as %+v", old)
	}
	if err := json.Unmarshal([]byte(`[1]`), &old); err == nil {
		t.Error("a number read as a frame")
	}
}
