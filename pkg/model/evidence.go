package model

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Evidence is the numbers behind a finding's verdict: the struct of its
// kind (FDLeakEvidence for fd_leak, ...), or RawEvidence.
//
// The fields of each struct are in the order of their JSON names, as
// Frame's: evidence was written from maps, which encode their keys sorted,
// and a report written now reads key for key as one written then. A key
// that is null when it does not apply is a pointer; one left out then is
// a pointer or a slice with omitempty. docs/REPORT.md says what each
// means (a test checks it lists these keys).
type Evidence interface {
	// EvidenceKind is the kind of finding the evidence is about.
	EvidenceKind() string
}

// RawEvidence is evidence kept as it was read, written back as it came:
// that of a kind this release does not know (a report from a newer one),
// or of a shape it does not (from an older one).
type RawEvidence struct {
	Kind string
	JSON json.RawMessage
}

func (e RawEvidence) EvidenceKind() string { return e.Kind }

// MarshalJSON writes the evidence as it was read.
func (e RawEvidence) MarshalJSON() ([]byte, error) { return e.JSON.MarshalJSON() }

// evidenceDecoders read the evidence of each kind; each view's file
// registers those of its kinds.
var evidenceDecoders = map[string]func([]byte) (Evidence, error){}

// registerEvidence has the evidence of T's kind read into T, and shown
// as T's card says.
func registerEvidence[T TypedEvidence]() {
	var ev T
	evidenceDecoders[ev.EvidenceKind()] = decodeEvidence[T]
}

// decodeEvidence reads evidence of type T. A key T lacks is an error: the
// evidence is then not T's, and would lose it; so is a key T always writes
// that the evidence lacks (one from an older release): T would show it as
// a zero it never had.
func decodeEvidence[T Evidence](data []byte) (Evidence, error) {
	var ev T
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ev); err != nil {
		return nil, err
	}
	again, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	if key := invented(data, again); key != "" {
		return nil, fmt.Errorf("evidence lacks %q", key)
	}
	return ev, nil
}

// invented returns a key written has and read lacks, looking into objects
// and lists alike but not into stacks (frames read from text are objects
// written); "" for none.
func invented(read, written json.RawMessage) string {
	w := bytes.TrimSpace(written)
	if len(w) == 0 {
		return ""
	}
	switch w[0] {
	case '{':
		var wm, rm map[string]json.RawMessage
		if json.Unmarshal(w, &wm) != nil {
			return ""
		}
		_ = json.Unmarshal(read, &rm) // not an object: every key is missing
		for k, v := range wm {
			rv, ok := rm[k]
			if !ok {
				return k
			}
			if k == "stack" {
				continue
			}
			if key := invented(rv, v); key != "" {
				return k + "." + key
			}
		}
	case '[':
		var wl, rl []json.RawMessage
		if json.Unmarshal(w, &wl) != nil {
			return ""
		}
		_ = json.Unmarshal(read, &rl)
		for i, v := range wl {
			if i < len(rl) {
				if key := invented(rl[i], v); key != "" {
					return key
				}
			}
		}
	}
	return ""
}

// readEvidence reads the evidence of a finding of kind: nil for none (null,
// or the {} a finding without evidence is written with), RawEvidence for
// what this release cannot read.
func readEvidence(kind string, data json.RawMessage) Evidence {
	var c bytes.Buffer
	if len(data) == 0 || json.Compact(&c, data) == nil && (c.String() == "null" || c.String() == "{}") {
		return nil
	}
	if decode, ok := evidenceDecoders[kind]; ok {
		if ev, err := decode(data); err == nil {
			return ev
		}
	}
	return RawEvidence{Kind: kind, JSON: data}
}

// MarshalJSON writes a finding without evidence with "evidence": {}, so
// that consumers need no null check (docs/REPORT.md).
func (f Finding) MarshalJSON() ([]byte, error) {
	type plain Finding // without the method
	if f.Evidence == nil {
		f.Evidence = RawEvidence{Kind: f.Kind, JSON: json.RawMessage("{}")}
	}
	return json.Marshal(plain(f))
}

// UnmarshalJSON reads a finding, its evidence into the struct of its kind.
func (f *Finding) UnmarshalJSON(data []byte) error {
	type plain Finding // without the method
	var v struct {
		plain
		Evidence json.RawMessage `json:"evidence"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	*f = Finding(v.plain)
	f.Evidence = readEvidence(f.Kind, v.Evidence)
	return nil
}
