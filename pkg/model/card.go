package model

import "time"

// TypedEvidence is the evidence of a kind this release knows: its struct
// writes its card, the rows that show it on the report's page. The card is
// declared with the struct, in its view's file, so that a new view adds
// its evidence without touching the report; RawEvidence has none (the
// report shows it key by key).
type TypedEvidence interface {
	Evidence
	Card(c Card)
}

// Card is what a finding's evidence is shown as: rows, in the order they
// are written, each a figure (or a small table) under a label, keyed by
// the evidence's JSON key (docs/REPORT.md), which the label's tooltip
// shows. Its methods say what a figure is, the report (pkg/report) how it
// is printed.
//
// A figure that does not apply is left out: an empty Text, Counts of
// zeros only, a zero Time, a Table without rows. An optional figure that
// is nil is not written at all.
type Card interface {
	// Text is text, shown as it is.
	Text(key, label, text string)
	// Count is a whole number: how many of something, or the number of
	// one (a pid, a device index).
	Count(key, label string, n int)
	// CountUint64 is a Count the evidence holds as a uint64 (a limit, a
	// kernel counter, an XID).
	CountUint64(key, label string, n uint64)
	// Change is how much a Count changed, with its sign.
	Change(key, label string, n int)
	// Counts are counts by name (fds by kind, failures by errno).
	Counts(key, label string, counts map[string]uint64)
	// CountsInt are Counts the evidence holds as ints.
	CountsInt(key, label string, counts map[string]int)
	// YesNo is a yes or a no.
	YesNo(key, label string, yes bool)
	// Bytes is an amount of memory.
	Bytes(key, label string, n uint64)
	// SignedBytes is an amount of memory that may be below zero (a
	// difference).
	SignedBytes(key, label string, n int64)
	// BytesChange is how much an amount of memory changed, with its sign.
	BytesChange(key, label string, n int64)
	// BytesOf is an amount of memory with what it is of ("" for nothing
	// named).
	BytesOf(key, label string, n uint64, of string)
	// MeanBytes is the mean and standard deviation of amounts of memory.
	MeanBytes(key, label string, mean, stddev float64)
	// BytesRate is memory per second.
	BytesRate(key, label string, perSecond float64)
	// Rate is things per second; unit names them, e.g. "fds/s".
	Rate(key, label string, perSecond float64, unit string)
	// Share is a part of a whole, from 0 to 1.
	Share(key, label string, share float64)
	// Duration is a span of time in seconds.
	Duration(key, label string, seconds float64)
	// Ago is how many seconds before the evidence something happened.
	Ago(key, label string, seconds float64)
	// Time is an instant.
	Time(key, label string, t time.Time)
	// Phrase is figures in one row: parts writes them, each read as its
	// label ("" for none) then its figure; those that do not apply are
	// left out, as rows are.
	Phrase(key, label string, parts func(c Card))
	// Table is a list (of sites, pairs, threads): a column per head, a
	// row per entry.
	Table(key, label string, head []string, rows []Row)
}

// Row is an entry of a Table: a cell per column, and under them the
// entry's stack (a site's, innermost frame first; the card shows the
// first few frames) and its Lines.
type Row struct {
	Cells []Cell
	Stack []Frame
	Lines []string
}

// Cell is a figure in a Row, written as Card's method of its kind writes
// it, shown even when empty; a nil Cell is one that does not apply to the
// entry.
type Cell func(c Card)

// TextCell is a Text in a Row.
func TextCell(text string) Cell { return func(c Card) { c.Text("", "", text) } }

// CountCell is a Count in a Row.
func CountCell(n int) Cell { return func(c Card) { c.Count("", "", n) } }

// ChangeCell is a Change in a Row.
func ChangeCell(n int) Cell { return func(c Card) { c.Change("", "", n) } }

// YesNoCell is a YesNo in a Row.
func YesNoCell(yes bool) Cell { return func(c Card) { c.YesNo("", "", yes) } }

// BytesCell is Bytes in a Row.
func BytesCell(n uint64) Cell { return func(c Card) { c.Bytes("", "", n) } }

// SignedBytesCell is SignedBytes in a Row.
func SignedBytesCell(n int64) Cell { return func(c Card) { c.SignedBytes("", "", n) } }

// BytesChangeCell is a BytesChange in a Row.
func BytesChangeCell(n int64) Cell { return func(c Card) { c.BytesChange("", "", n) } }

// RateCell is a Rate in a Row.
func RateCell(perSecond float64, unit string) Cell {
	return func(c Card) { c.Rate("", "", perSecond, unit) }
}

// ShareCell is a Share in a Row.
func ShareCell(share float64) Cell { return func(c Card) { c.Share("", "", share) } }

// DurationCell is a Duration in a Row.
func DurationCell(seconds float64) Cell { return func(c Card) { c.Duration("", "", seconds) } }

// AgoCell is an Ago in a Row.
func AgoCell(seconds float64) Cell { return func(c Card) { c.Ago("", "", seconds) } }

// optionalCell is the cell of *p; nil (does not apply) when p is nil.
func optionalCell[T any](p *T, cell func(T) Cell) Cell {
	if p == nil {
		return nil
	}
	return cell(*p)
}
