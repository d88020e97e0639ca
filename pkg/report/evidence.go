package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// evidenceRows lays out a finding's evidence as the page's card shows it,
// one row per field, from its JSON form.
func evidenceRows(ev any) []kv {
	data, err := json.Marshal(ev)
	if err != nil {
		return nil
	}
	var fields map[string]any
	if json.Unmarshal(data, &fields) != nil {
		return nil
	}
	var rows []kv
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		rows = append(rows, kv{k, evidence(stackTexts(fields[k]))})
	}
	return rows
}

// evidenceMax bounds an evidence value on the page (lists of sites with
// their stacks run long); the embedded report has them whole.
const evidenceMax = 160

// evidence writes one evidence value as read from JSON: whole numbers
// without exponent, others briefly, long values cut.
func evidence(v any) string {
	var text string
	switch x := v.(type) {
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return strconv.FormatInt(int64(x), 10)
		}
		return strconv.FormatFloat(x, 'g', 6, 64)
	case string:
		text = x
	default:
		// The page escapes it; JSON's own HTML escapes would show.
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return fmt.Sprint(v)
		}
		text = strings.TrimSuffix(b.String(), "\n")
	}
	if r := []rune(text); len(r) > evidenceMax {
		return string(r[:evidenceMax]) + "…"
	}
	return text
}

// stackTexts replaces the stacks within an evidence value as read from JSON
// (the "stack" of each of top_sites, of failing_call) by the text of their
// frames, so that they read as a finding's stack does.
func stackTexts(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = stackTexts(e)
			if k != "stack" {
				continue
			}
			if frames, ok := readStack(e); ok {
				out[k] = frameTexts(frames)
			}
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = stackTexts(e)
		}
		return out
	}
	return v
}
