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
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// evRow is one row of a finding's evidence on its card: a value, or a
// small table (a list of sites, pairs, threads) shown under its label.
type evRow struct {
	Key   string // the JSON key (docs/REPORT.md), the label's tooltip
	Label string
	Value string
	Table *evTable
}

// evTable is a list within the evidence: a row per entry, with its lines
// (a site's stack, innermost frame first) under it.
type evTable struct {
	Head []string
	Rows []evEntry
}

type evEntry struct {
	Cells []string
	Lines []string
}

// stackMax is how many frames of a site's stack a card shows; the
// embedded report has them all.
const stackMax = 4

// evidenceRows lays out a finding's evidence as the page's card shows it:
// numbers in their units, times by clock, lists of sites as tables with
// their stacks. What does not apply (null, empty lists) is left out.
// Evidence this release cannot read (model.RawEvidence) is shown key by
// key from its JSON form.
func evidenceRows(ev model.Evidence, clock func(time.Time) string) []evRow {
	if ev == nil {
		return nil
	}
	if rows, ok := typedRows(ev, clock); ok {
		return rows
	}
	return rawRows(ev)
}

// evRows collects the rows of one evidence: the model.Card its card is
// written on, with the page's units and clock.
type evRows struct {
	rows  []evRow
	clock func(time.Time) string
	// cell says the rows are a table's cells: every figure is one, shown
	// even when empty.
	cell bool
}

// typedRows lays out the evidence of the kinds this release knows, as
// their cards say; false for others.
func typedRows(ev model.Evidence, clock func(time.Time) string) ([]evRow, bool) {
	e, ok := ev.(model.TypedEvidence)
	if !ok {
		return nil, false
	}
	b := &evRows{clock: clock}
	e.Card(b)
	return b.rows, true
}

// add adds a row; an empty value is one that does not apply.
func (b *evRows) add(key, label, value string) {
	if value != "" || b.cell {
		b.rows = append(b.rows, evRow{Key: key, Label: label, Value: value})
	}
}

// The figures of model.Card, in the page's units.

func (b *evRows) Text(key, label, text string)   { b.add(key, label, text) }
func (b *evRows) Count(key, label string, n int) { b.add(key, label, strconv.Itoa(n)) }
func (b *evRows) CountUint64(key, label string, n uint64) {
	b.add(key, label, strconv.FormatUint(n, 10))
}
func (b *evRows) Change(key, label string, n int) { b.add(key, label, signed(n)) }
func (b *evRows) Counts(key, label string, counts map[string]uint64) {
	b.add(key, label, countsText(counts))
}
func (b *evRows) CountsInt(key, label string, counts map[string]int) {
	b.add(key, label, countsText(counts))
}
func (b *evRows) YesNo(key, label string, yes bool)      { b.add(key, label, yesNo(yes)) }
func (b *evRows) Bytes(key, label string, n uint64)      { b.add(key, label, bytesText(n)) }
func (b *evRows) SignedBytes(key, label string, n int64) { b.add(key, label, signedBytesText(n)) }
func (b *evRows) BytesChange(key, label string, n int64) {
	b.add(key, label, plus(n)+signedBytesText(n))
}

// BytesOf writes what the bytes are of in brackets after them.
func (b *evRows) BytesOf(key, label string, n uint64, of string) {
	text := bytesText(n)
	if of != "" {
		text += " (" + of + ")"
	}
	b.add(key, label, text)
}

func (b *evRows) MeanBytes(key, label string, mean, stddev float64) {
	b.add(key, label, floatBytesText(mean)+" ± "+floatBytesText(stddev))
}
func (b *evRows) BytesRate(key, label string, perSecond float64) {
	b.add(key, label, bytesRateText(perSecond))
}
func (b *evRows) Rate(key, label string, perSecond float64, unit string) {
	b.add(key, label, rateText(perSecond, unit))
}
func (b *evRows) Share(key, label string, share float64) { b.add(key, label, percentText(share)) }
func (b *evRows) Duration(key, label string, seconds float64) {
	b.add(key, label, durationText(seconds))
}
func (b *evRows) Ago(key, label string, seconds float64) {
	b.add(key, label, durationText(seconds)+" ago")
}

// Time writes an instant by the page's clock; the zero time is none.
func (b *evRows) Time(key, label string, t time.Time) {
	if !t.IsZero() {
		b.add(key, label, b.clock(t))
	}
}

// Phrase writes its parts in one row, separated by commas.
func (b *evRows) Phrase(key, label string, parts func(model.Card)) {
	p := &evRows{clock: b.clock}
	parts(p)
	var texts []string
	for _, r := range p.rows {
		if r.Label != "" {
			r.Value = r.Label + " " + r.Value
		}
		texts = append(texts, r.Value)
	}
	b.add(key, label, strings.Join(texts, ", "))
}

// Table adds a list, each entry's stack cut to its innermost frames; an
// empty list is left out.
func (b *evRows) Table(key, label string, head []string, rows []model.Row) {
	if len(rows) == 0 {
		return
	}
	t := &evTable{Head: head}
	for _, r := range rows {
		cells := make([]string, len(r.Cells))
		for i, cell := range r.Cells {
			cells[i] = b.cellText(cell)
		}
		t.Rows = append(t.Rows, evEntry{Cells: cells, Lines: append(stackLines(r.Stack), r.Lines...)})
	}
	b.rows = append(b.rows, evRow{Key: key, Label: label, Table: t})
}

// cellText writes a table's cell as the row of its figure would be
// written; "–" for one that does not apply.
func (b *evRows) cellText(cell model.Cell) string {
	if cell == nil {
		return "–"
	}
	c := &evRows{clock: b.clock, cell: true}
	cell(c)
	var texts []string
	for _, r := range c.rows {
		texts = append(texts, r.Value)
	}
	return strings.Join(texts, " ")
}

// stackLines are the frames of a stack as the card shows them: innermost
// first, cut to stackMax (a line saying so stands for the rest, unless it
// would stand for one frame).
func stackLines(frames []model.Frame) []string {
	if len(frames) <= stackMax+1 {
		return frameTexts(frames)
	}
	return append(frameTexts(frames[:stackMax]), fmt.Sprintf("… %d more frames", len(frames)-stackMax))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// numText writes a number briefly: whole numbers whole, others to three
// significant digits (a tenth for those from 10 to 100), none past the
// point from 100 up.
func numText(x float64) string {
	switch a := math.Abs(x); {
	case x == math.Trunc(x) && a < 1<<53, a >= 100:
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}

// rateText writes a rate with its unit, e.g. "12.5 fds/s".
func rateText(x float64, unit string) string { return numText(x) + " " + unit }

// percentText writes a share (0–1) as a percentage, e.g. "99 %".
func percentText(r float64) string { return numText(r*100) + " %" }

// signed writes a count with its sign, e.g. "+12".
func signed(n int) string { return plus(n) + strconv.Itoa(n) }

func plus[N int | int64](n N) string {
	if n > 0 {
		return "+"
	}
	return ""
}

// signedBytesText writes a byte count that may be below zero.
func signedBytesText(n int64) string {
	if n < 0 {
		return "−" + bytesText(uint64(-n))
	}
	return bytesText(uint64(n))
}

// floatBytesText writes a byte count kept as a number (a mean).
func floatBytesText(x float64) string {
	if x < 0 {
		return "−" + floatBytesText(-x)
	}
	return bytesText(uint64(math.Round(x)))
}

// bytesRateText writes bytes per second, e.g. "1.2 GiB/s".
func bytesRateText(x float64) string { return floatBytesText(x) + "/s" }

// durationText writes seconds as a person reads a duration: "350 ms",
// "25 s", "4 min", "4 min 25 s", "16 min", "2 h 5 min", "3 d 4 h".
func durationText(s float64) string {
	switch {
	case s < 0:
		return "−" + durationText(-s)
	case s > 0 && s < 1:
		return secondsText(s)
	case s < 59.5:
		return numText(s) + " s"
	case s >= 100*86400: // past what a Duration holds, in time
		return numText(math.Round(s/86400)) + " d"
	}
	d := time.Duration(math.Round(s)) * time.Second
	if d >= 10*time.Minute {
		d = d.Round(time.Minute) // seconds do not matter then
	}
	day, h, m, sec := int(d/(24*time.Hour)), int(d/time.Hour)%24, int(d/time.Minute)%60, int(d/time.Second)%60
	two := func(a int, au string, b int, bu string) string {
		if b == 0 {
			return fmt.Sprintf("%d %s", a, au)
		}
		return fmt.Sprintf("%d %s %d %s", a, au, b, bu)
	}
	switch {
	case day > 0:
		return two(day, "d", h, "h")
	case h > 0:
		return two(h, "h", m, "min")
	}
	return two(m, "min", sec, "s")
}

// countsText writes counts by name, e.g. "file 12, socket 3", the names
// sorted; zeros are left out.
func countsText[N int | uint64](m map[string]N) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if m[k] != 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
	}
	return strings.Join(parts, ", ")
}

// rawRows lays out evidence this release cannot read, key by key from its
// JSON form.
func rawRows(ev any) []evRow {
	data, err := json.Marshal(ev)
	if err != nil {
		return nil
	}
	var fields map[string]any
	if json.Unmarshal(data, &fields) != nil {
		return nil
	}
	var rows []evRow
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		rows = append(rows, evRow{Key: k, Label: k, Value: evidence(stackTexts(fields[k]))})
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
