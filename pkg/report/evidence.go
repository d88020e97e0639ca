package report

import (
	"bytes"
	"cmp"
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

// evRows collects the rows of one evidence.
type evRows struct {
	rows  []evRow
	clock func(time.Time) string
}

// add adds a row; an empty value is one that does not apply.
func (b *evRows) add(key, label, value string) {
	if value != "" {
		b.rows = append(b.rows, evRow{Key: key, Label: label, Value: value})
	}
}

// table adds a list; an empty one is left out.
func (b *evRows) table(key, label string, head []string, rows []evEntry) {
	if len(rows) > 0 {
		b.rows = append(b.rows, evRow{Key: key, Label: label, Table: &evTable{Head: head, Rows: rows}})
	}
}

func (b *evRows) time(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return b.clock(t)
}

// typedRows lays out the evidence of the kinds this release knows; false
// for others.
func typedRows(ev model.Evidence, clock func(time.Time) string) ([]evRow, bool) {
	b := &evRows{clock: clock}
	switch e := ev.(type) {
	case model.FDLeakEvidence:
		fdLeakRows(b, e)
	case model.FDExhaustedEvidence:
		fdExhaustedRows(b, e)
	case model.SocketLeakEvidence:
		socketLeakRows(b, e)
	case model.CtxSwitchStormEvidence:
		ctxSwitchRows(b, e)
	case model.GPUAllocBurstEvidence:
		gpuBurstRows(b, e)
	case model.GPUMemoryLeakEvidence:
		gpuLeakRows(b, e)
	case model.GPUAllocFailureEvidence:
		gpuFailureRows(b, e)
	case model.GPUAllocChurnEvidence:
		gpuChurnRows(b, e)
	case model.GPUXIDEvidence:
		b.add("xid", "XID", strconv.FormatUint(e.XID, 10))
		b.add("meaning", "meaning", e.Meaning)
		gpuFaultRows(b, e.Device, e.UUID, e.Count, e.FirstAt, e.LastAt, e.MIGInstances)
	case model.GPUECCEvidence:
		gpuFaultRows(b, e.Device, e.UUID, e.Count, e.FirstAt, e.LastAt, e.MIGInstances)
	case model.GPUInputBoundEvidence:
		inputBoundRows(b, e)
	default:
		return nil, false
	}
	return b.rows, true
}

func fdLeakRows(b *evRows, e model.FDLeakEvidence) {
	b.add("open_fds", "open fds", strconv.Itoa(e.OpenFDs))
	b.add("limit", "fd limit", strconv.FormatUint(e.Limit, 10))
	b.add("growth_fds_per_second", "growth", rateText(e.GrowthPerSecond, "fds/s"))
	b.add("time_to_exhaustion_seconds", "time to limit", optional(e.TimeToExhaustionSeconds, durationText))
	b.add("window_seconds", "window", durationText(e.WindowSeconds))
	b.add("time_scale_seconds", "time scale", durationText(e.TimeScaleSeconds))
	b.add("opened_by_kind", "opened", countsText(e.OpenedByKind))
	b.add("closed_by_kind", "closed", countsText(e.ClosedByKind))
	var sites []evEntry
	for _, s := range e.TopSites {
		sites = append(sites, evEntry{Cells: []string{strconv.Itoa(s.UnclosedFDs), signed(s.UnclosedFDsGrowth), durationText(s.OldestAgeSeconds)}, Lines: stackLines(s.Stack)})
	}
	b.table("top_sites", "top sites", []string{"unclosed fds", "growth", "oldest"}, sites)
	var targets []evEntry
	for _, t := range e.LeakedTargets {
		targets = append(targets, evEntry{Cells: []string{t.Target, strconv.Itoa(t.FDs)}})
	}
	b.table("leaked_targets", "leaked fds point at", []string{"target", "fds"}, targets)
}

func fdExhaustedRows(b *evRows, e model.FDExhaustedEvidence) {
	b.add("open_fds", "open fds", strconv.Itoa(e.OpenFDs))
	b.add("limit", "fd limit", strconv.FormatUint(e.Limit, 10))
	b.add("at_limit", "at the limit", yesNo(e.AtLimit))
	b.add("at_limit_at_attach", "at the limit at attach", yesNo(e.AtLimitAtAttach))
	b.add("errno", "errno", e.Errno)
	b.add("failures_total", "failed calls", countsText(e.FailuresTotal))
	b.add("failures_per_second", "failures", rateText(e.FailuresPerSecond, "calls/s"))
	b.add("unattributed_fds", "fds without a site", strconv.Itoa(e.UnattributedFDs))
	if c := e.FailingCall; c != nil {
		b.table("failing_call", "failing call", []string{"fd kind", "when"},
			[]evEntry{{Cells: []string{c.Kind, durationText(c.SecondsAgo) + " ago"}, Lines: stackLines(c.Stack)}})
	}
	var sites []evEntry
	for _, s := range e.TopSites {
		sites = append(sites, evEntry{Cells: []string{strconv.Itoa(s.FDs), durationText(s.OldestAgeSeconds)}, Lines: stackLines(s.Stack)})
	}
	b.table("top_sites", "top sites", []string{"fds", "oldest"}, sites)
}

func socketLeakRows(b *evRows, e model.SocketLeakEvidence) {
	b.add("close_wait", "CLOSE_WAIT sockets", strconv.Itoa(e.CloseWait))
	b.add("close_wait_older_than_min", "older than min age", strconv.Itoa(e.CloseWaitOlderThanMin))
	b.add("min_age_seconds", "min age", durationText(e.MinAgeSeconds))
	b.add("oldest_close_wait_seconds", "oldest CLOSE_WAIT", durationText(e.OldestCloseWaitSeconds))
	b.add("growth_per_second", "growth", rateText(e.GrowthPerSecond, "sockets/s"))
	b.add("window_seconds", "window", durationText(e.WindowSeconds))
	b.add("fd_limit", "fd limit", strconv.FormatUint(e.FDLimit, 10))
	b.add("time_to_fd_limit_seconds", "time to fd limit", optional(e.TimeToFDLimitSeconds, durationText))
	b.add("tcp_by_state", "TCP by state", countsText(e.TCPByState))
	b.add("opening_stack_sockets", "sockets with their opening stack", strconv.Itoa(e.OpeningStackSockets))
	if g := e.FDGrowth; g != nil {
		parts := []string{rateText(g.GrowthPerSecond, "fds/s"), fmt.Sprintf("%d of %d open", g.OpenFDs, g.Limit)}
		if g.TimeToExhaustionSeconds != nil {
			parts = append(parts, "limit in "+durationText(*g.TimeToExhaustionSeconds))
		}
		parts = append(parts, "over "+durationText(g.WindowSeconds))
		if !g.FDLeakFirstSeen.IsZero() {
			parts = append(parts, "since "+b.time(g.FDLeakFirstSeen))
		}
		b.add("fd_growth", "fd leak explained", strings.Join(parts, ", "))
	}
	var pairs []evEntry
	for _, p := range e.TopPairs {
		pairs = append(pairs, evEntry{Cells: []string{p.Local, p.Remote, strconv.Itoa(p.Count)}})
	}
	b.table("top_pairs", "CLOSE_WAIT by address pair", []string{"local", "remote", "sockets"}, pairs)
}

func ctxSwitchRows(b *evRows, e model.CtxSwitchStormEvidence) {
	b.add("rate_per_second", "rate", rateText(e.RatePerSecond, "switches/s"))
	b.add("voluntary_per_second", "voluntary", rateText(e.VoluntaryPerSecond, "switches/s"))
	b.add("involuntary_per_second", "involuntary", rateText(e.InvoluntaryPerSecond, "switches/s"))
	b.add("voluntary_ratio", "voluntary share", percentText(e.VoluntaryRatio))
	b.add("threshold_per_second", "storm threshold", rateText(e.ThresholdPerSecond, "switches/s"))
	b.add("baseline_mean", "baseline", optional(e.BaselineMean, func(v float64) string { return rateText(v, "switches/s") }))
	b.add("threads", "threads", strconv.Itoa(e.Threads))
	b.add("allowed_cpus", "allowed CPUs", strconv.Itoa(e.AllowedCPUs))
	b.add("runqueue_p99_seconds", "run-queue p99", optional(e.RunqueueP99Seconds, durationText))
	b.add("runqueue_window_seconds", "run-queue window", durationText(e.RunqueueWindowSeconds))
	b.add("hint", "hint", e.Hint)
	var threads []evEntry
	for _, t := range e.TopThreads {
		threads = append(threads, evEntry{Cells: []string{strconv.Itoa(t.TID), t.Name, rateText(t.Rate, "switches/s")}})
	}
	b.table("top_threads", "top threads", []string{"tid", "name", "rate"}, threads)
}

func gpuBurstRows(b *evRows, e model.GPUAllocBurstEvidence) {
	b.add("burst_bytes", "burst", bytesText(e.BurstBytes))
	b.add("peak_live_bytes", "peak live", bytesText(e.PeakLiveBytes))
	b.add("largest_burst_bytes", "largest burst", bytesText(e.LargestBurstBytes))
	b.add("largest_peak_live_bytes", "largest peak live", bytesText(e.LargestPeakLiveBytes))
	b.add("live_bytes", "live now", bytesText(e.LiveBytes))
	b.add("near_full", "near full", optional(e.NearFull, func(s string) string { return s }))
	b.add("occurrences", "occurrences", strconv.Itoa(e.Occurrences))
	b.add("period_seconds", "period", optional(e.PeriodSeconds, durationText))
	b.add("bytes_in_window", "allocated in its interval", bytesText(e.BytesInWindow))
	b.add("calls_in_window", "calls in its interval", strconv.FormatUint(e.CallsInWindow, 10))
	b.add("window_seconds", "window", durationText(e.WindowSeconds))
	b.add("baseline_bytes_mean", "baseline rise", floatBytesText(e.BaselineBytesMean)+" ± "+floatBytesText(e.BaselineBytesStddev))
	b.add("startup_step", "start-up step", yesNo(e.StartupStep))
	var sites []evEntry
	for _, s := range e.TopSites {
		sites = append(sites, evEntry{Cells: []string{bytesText(s.Bytes), percentText(s.Share)}, Lines: stackLines(s.Stack)})
	}
	b.table("top_sites", "top sites", []string{"allocated", "share"}, sites)
}

func gpuLeakRows(b *evRows, e model.GPUMemoryLeakEvidence) {
	b.add("live_bytes", "live", bytesText(e.LiveBytes))
	b.add("live_allocations", "live allocations", strconv.Itoa(e.LiveAllocations))
	b.add("growth_bytes_per_second", "growth", bytesRateText(e.GrowthBytesPerSecond))
	b.add("time_to_exhaustion_seconds", "time to exhaustion", optional(e.TimeToExhaustionSeconds, durationText))
	if e.HeadroomBytes != nil {
		h := bytesText(*e.HeadroomBytes)
		if e.HeadroomOf != nil && *e.HeadroomOf != "" {
			h += " (" + *e.HeadroomOf + ")"
		}
		b.add("headroom_bytes", "headroom", h)
	}
	b.add("window_seconds", "window", durationText(e.WindowSeconds))
	b.add("time_scale_seconds", "time scale", durationText(e.TimeScaleSeconds))
	b.add("min_age_seconds", "min age", optional(e.MinAgeSeconds, durationText))
	b.add("old_bytes_at_top_site", "old at top site", optional(e.OldBytesAtTopSite, signedBytesText))
	b.add("nvml_used_bytes", "NVML used", optional(e.NVMLUsedBytes, bytesText))
	b.add("untracked_bytes", "untracked", optional(e.UntrackedBytes, signedBytesText))
	b.add("alloc_bytes_since_attach", "allocated since attach", bytesText(e.AllocBytesSinceAttach))
	b.add("free_bytes_since_attach", "freed since attach", bytesText(e.FreeBytesSinceAttach))
	// Kept and old-growth columns where some site has them (they depend
	// on the scale).
	var kept, growth bool
	for _, s := range e.TopSites {
		kept = kept || s.KeptAllocations != nil || s.KeptBytes != nil
		growth = growth || s.OldBytesGrowth != nil
	}
	head := []string{"live", "allocations", "old", "oldest"}
	if kept {
		head = append(head, "kept", "kept allocations")
	}
	if growth {
		head = append(head, "old growth")
	}
	var sites []evEntry
	for _, s := range e.TopSites {
		cells := []string{bytesText(s.Bytes), strconv.Itoa(s.Allocations), signedBytesText(s.OldBytes), durationText(s.OldestAgeSeconds)}
		if kept {
			cells = append(cells, orDash(optional(s.KeptBytes, bytesText)), orDash(optional(s.KeptAllocations, strconv.Itoa)))
		}
		if growth {
			cells = append(cells, orDash(optional(s.OldBytesGrowth, func(v int64) string { return plus(v) + signedBytesText(v) })))
		}
		sites = append(sites, evEntry{Cells: cells, Lines: stackLines(s.Stack)})
	}
	b.table("top_sites", "top sites", head, sites)
}

func gpuFailureRows(b *evRows, e model.GPUAllocFailureEvidence) {
	b.add("api", "call", e.API)
	b.add("error", "error", fmt.Sprintf("%s (%d)", e.Error, e.Code))
	b.add("size_bytes", "size", bytesText(e.SizeBytes))
	b.add("max_size_bytes", "largest size", bytesText(e.MaxSizeBytes))
	b.add("count", "failures", strconv.Itoa(e.Count))
	b.add("first_failure", "first", b.time(e.FirstFailure))
	b.add("last_failure", "last", b.time(e.LastFailure))
	b.add("live_bytes", "live", bytesText(e.LiveBytes))
}

func gpuChurnRows(b *evRows, e model.GPUAllocChurnEvidence) {
	b.add("pairs_per_second", "alloc/free pairs", rateText(e.PairsPerSecond, "pairs/s"))
	b.add("max_pairs_per_second", "most pairs", rateText(e.MaxPairsPerSecond, "pairs/s"))
	b.add("bytes_per_second", "allocated", bytesRateText(e.BytesPerSecond))
	b.add("held_bytes", "held at most", bytesText(e.HeldBytes))
	b.add("live_bytes", "live", bytesText(e.LiveBytes))
	b.add("synchronizing_frees", "synchronizing frees", countsText(e.SynchronizingFrees))
	var sites []evEntry
	for _, s := range e.TopSites {
		sites = append(sites, evEntry{Cells: []string{strconv.Itoa(s.CaughtLive)}, Lines: stackLines(s.Stack)})
	}
	b.table("top_sites", "top sites", []string{"caught live"}, sites)
}

func gpuFaultRows(b *evRows, device int, uuid string, count int, first, last time.Time, mig []model.MIGInstance) {
	b.add("device", "device", strconv.Itoa(device))
	b.add("uuid", "uuid", uuid)
	b.add("count", "count", strconv.Itoa(count))
	b.add("first_at", "first", b.time(first))
	b.add("last_at", "last", b.time(last))
	var inst []string
	for _, m := range mig {
		inst = append(inst, fmt.Sprintf("GI %d CI %d", m.GPUInstance, m.ComputeInstance))
	}
	b.add("mig_instances", "MIG instances", strings.Join(inst, ", "))
}

func inputBoundRows(b *evRows, e model.GPUInputBoundEvidence) {
	b.add("verdict", "verdict", e.Verdict)
	b.add("sm_utilization_mean", "SM utilization", percentText(e.SMUtilizationMean))
	b.add("starved_share", "intervals starved", percentText(e.StarvedShare))
	b.add("window_seconds", "window", durationText(e.WindowSeconds))
	var waiting []evEntry
	for _, w := range e.Waiting {
		var lines []string
		for _, t := range w.Threads {
			lines = append(lines, fmt.Sprintf("%s (tid %d) preempted %d times", t.Name, t.TID, t.Preempted))
		}
		waiting = append(waiting, evEntry{Cells: []string{strconv.Itoa(w.PID), w.Comm, w.Role, durationText(w.RunqP99Seconds), strconv.Itoa(w.AllowedCPUs)}, Lines: lines})
	}
	b.table("waiting", "waiting for a CPU", []string{"pid", "comm", "role", "run-queue p99", "CPUs"}, waiting)
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

// optional writes *p with f; "" (left out) when p is nil.
func optional[T any](p *T, f func(T) string) string {
	if p == nil {
		return ""
	}
	return f(*p)
}

func orDash(s string) string { return cmp.Or(s, "–") }

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
