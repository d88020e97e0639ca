package model

import (
	"bytes"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

// A report written before evidence was typed (make demo at dab2729) reads
// into the struct of each kind and is written back key for key.
func TestEvidenceReadsOlderReport(t *testing.T) {
	data, err := os.ReadFile("../../testdata/reports/dab2729-demo.json")
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Findings []json.RawMessage `json:"findings"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	if len(raw.Findings) == 0 {
		t.Fatal("the report has no findings")
	}
	for _, r := range raw.Findings {
		var f Finding
		if err := json.Unmarshal(r, &f); err != nil {
			t.Fatal(err)
		}
		if _, ok := f.Evidence.(RawEvidence); ok || f.Evidence == nil || f.Evidence.EvidenceKind() != f.Kind {
			t.Errorf("%s: evidence read as %T", f.Kind, f.Evidence)
			continue
		}
		again, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		if want, got := compact(t, r), compact(t, again); want != got {
			t.Errorf("%s written back differs:\n got %s\nwant %s", f.Kind, got, want)
		}
	}
}

// Evidence this release cannot read is kept as it came: a kind it does not
// know, or a key its kind's struct lacks.
func TestEvidenceUnknownKept(t *testing.T) {
	for _, in := range []string{
		`{"kind":"nccl_straggler","evidence":{"rank":3,"lag_seconds":1.5}}`,
		`{"kind":"fd_leak","evidence":{"open_fds":3,"from_a_newer_release":true}}`,
		`{"kind":"fd_leak","evidence":{"open_fds":"three"}}`,
		// An older release's: keys the struct always writes are missing,
		// here and within a site.
		`{"kind":"fd_leak","evidence":{"top_sites":[{"stack":["__open64+0x51 (libc.so.6)"],"unclosed_fds":3}]}}`,
		`{"kind":"gpu_xid","evidence":{"count":1,"device":0,"first_at":"2025-01-02T03:04:05Z","last_at":"2025-01-02T03:04:05Z","meaning":"","uuid":"GPU-1"}}`,
	} {
		var f Finding
		if err := json.Unmarshal([]byte(in), &f); err != nil {
			t.Fatal(err)
		}
		ev, ok := f.Evidence.(RawEvidence)
		if !ok || ev.EvidenceKind() != f.Kind {
			t.Errorf("%s: evidence read as %T", in, f.Evidence)
			continue
		}
		out, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		var back struct {
			Evidence json.RawMessage `json:"evidence"`
		}
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatal(err)
		}
		var want struct {
			Evidence json.RawMessage `json:"evidence"`
		}
		if err := json.Unmarshal([]byte(in), &want); err != nil {
			t.Fatal(err)
		}
		if compact(t, back.Evidence) != compact(t, want.Evidence) {
			t.Errorf("evidence written back as %s, read %s", back.Evidence, want.Evidence)
		}
	}
}

// A finding without evidence is written with {} and reads back without.
func TestEvidenceNone(t *testing.T) {
	out, err := json.Marshal(Finding{Kind: KindGPUXID})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"evidence":{}`) {
		t.Errorf("written %s, want evidence {}", out)
	}
	for _, in := range []string{`{"kind":"gpu_xid","evidence":{}}`, `{"kind":"gpu_xid","evidence":null}`, `{"kind":"gpu_xid"}`} {
		var f Finding
		if err := json.Unmarshal([]byte(in), &f); err != nil || f.Evidence != nil {
			t.Errorf("%s read as %#v (%v)", in, f.Evidence, err)
		}
	}
}

// Every kind has its evidence struct, and docs/REPORT.md names each of its
// keys, nested ones included (frames have their own section).
func TestEvidenceKeysDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/REPORT.md")
	if err != nil {
		t.Fatal(err)
	}
	structs := map[string]Evidence{}
	for _, ev := range []Evidence{FDLeakEvidence{}, FDExhaustedEvidence{}, SocketLeakEvidence{}, CtxSwitchStormEvidence{},
		GPUAllocBurstEvidence{}, GPUMemoryLeakEvidence{}, GPUAllocFailureEvidence{}, GPUAllocChurnEvidence{},
		GPUXIDEvidence{}, GPUECCEvidence{}, GPUInputBoundEvidence{}, GPUSyncStormEvidence{}, NCCLStragglerEvidence{}, NCCLHangEvidence{}} {
		structs[ev.EvidenceKind()] = ev
	}
	for _, kind := range Kinds {
		ev, ok := structs[kind]
		if _, decoded := evidenceDecoders[kind]; !ok || !decoded {
			t.Errorf("%s: no evidence struct (listed here %v, read %v)", kind, ok, decoded)
			continue
		}
		for _, key := range jsonKeys(reflect.TypeOf(ev)) {
			if !bytes.Contains(doc, []byte("`"+key+"`")) {
				t.Errorf("docs/REPORT.md does not name %s's evidence key %q", kind, key)
			}
		}
	}
}

// jsonKeys lists the JSON keys of a struct type and of the structs within,
// but not within frames.
func jsonKeys(t reflect.Type) []string {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeOf(Frame{}) {
		return nil
	}
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		keys = append(keys, name)
		keys = append(keys, jsonKeys(f.Type)...)
	}
	return keys
}

func compact(t *testing.T, data []byte) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, data); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// A report file is outside input: whatever it holds, reading a finding
// neither panics nor yields evidence that cannot be written back, and what
// is written back reads the same again.
func FuzzFindingJSON(f *testing.F) {
	f.Add([]byte(`{"kind":"fd_leak","evidence":{"open_fds":3,"top_sites":[{"stack":["a+0x1 (b)"],"unclosed_fds":3}]}}`))
	f.Add([]byte(`{"kind":"gpu_xid","evidence":{}}`))
	f.Add([]byte(`{"kind":"gpu_alloc_failure","evidence":{"snapshot":{"stack":null,"devices":[{"mig":1,"processes":[{"pid":7,"self":true,"live_bytes":null}]}],"gap_bytes":-4}}}`))
	f.Add([]byte(`{"kind":"socket_leak","evidence":{"fd_growth":null,"top_pairs":[{}]}}`))
	f.Add([]byte(`{"kind":"nccl","evidence":[1,2]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var fi Finding
		if json.Unmarshal(data, &fi) != nil {
			return
		}
		out, err := json.Marshal(fi)
		if err != nil {
			t.Fatalf("read %q, cannot write it back: %v", data, err)
		}
		var again Finding
		if err := json.Unmarshal(out, &again); err != nil {
			t.Fatalf("wrote %q, cannot read it: %v", out, err)
		}
		if out2, err := json.Marshal(again); err != nil || !bytes.Equal(out, out2) {
			t.Fatalf("written %q, then %q (%v)", out, out2, err)
		}
	})
}
