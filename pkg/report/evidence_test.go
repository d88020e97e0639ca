package report

import (
	"bytes"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// evidenceCards renders a report of one process with findings and returns
// the page's cards by finding kind.
func evidenceCards(t *testing.T, findings ...model.Finding) map[string]string {
	t.Helper()
	w, buf := toStdout()
	if err := w.Close(&model.Snapshot{Time: t0.Add(time.Minute), Start: t0, Processes: []*model.Process{proc(100, "trainer", 40, false)}, Findings: findings}); err != nil {
		t.Fatal(err)
	}
	r := decode(t, buf.Bytes())
	var page bytes.Buffer
	if err := WriteHTML(&page, &r); err != nil {
		t.Fatal(err)
	}
	cards := map[string]string{}
	for _, m := range regexp.MustCompile(`(?s)<div class="finding sev-[a-z]+" id="finding-\d+" data-kind="([a-z_]+)">.*?</table>\n</div>`).FindAllStringSubmatch(page.String(), -1) {
		cards[m[1]] = m[0]
	}
	if len(cards) != len(findings) {
		t.Fatalf("%d cards with evidence, want %d:\n%s", len(cards), len(findings), page.String())
	}
	return cards
}

func frames(fns ...string) []model.Frame {
	var out []model.Frame
	for i, fn := range fns {
		out = append(out, model.Frame{Kind: model.FrameNative, Function: fn, Module: "trainer", File: "/src/trainer.c", Line: 10 + i})
	}
	return out
}

// Cards show evidence as a person reads it: bytes in binary units, rates
// and durations with their unit, sites as a table with their innermost
// frames; what does not apply is left out, and what the traced process
// controls stays text.
func TestEvidenceCards(t *testing.T) {
	tte := 985.2
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	finding := func(kind string, ev model.Evidence) model.Finding {
		return model.Finding{Kind: kind, PID: 100, Comm: "trainer", Severity: model.SeverityWarning, FirstSeen: at(10), LastSeen: at(50), Summary: kind, Evidence: ev}
	}
	cards := evidenceCards(t,
		finding(model.KindFDLeak, model.FDLeakEvidence{
			OpenFDs: 461, Limit: 20000, GrowthPerSecond: 12.5, TimeToExhaustionSeconds: &tte, WindowSeconds: 240, TimeScaleSeconds: 8,
			OpenedByKind: map[string]uint64{"socket": 3, "file": 12, "pipe": 0},
			TopSites: []model.FDLeakSite{
				{UnclosedFDs: 396, UnclosedFDsGrowth: 156, OldestAgeSeconds: 25, Stack: frames("<script>alert(2)</script>", "cache_tokenizer", "handle_request", "serve", "main", "_start", "__libc_start_main")},
				{UnclosedFDs: 1, OldestAgeSeconds: 0.25, Stack: frames("dup2")},
			},
			LeakedTargets: []model.LeakedTarget{{Target: "/etc/hostname", FDs: 278}},
		}),
		finding(model.KindGPUAllocBurst, model.GPUAllocBurstEvidence{
			BurstBytes: 18 << 30, PeakLiveBytes: 20 << 30, BaselineBytesMean: 16 << 20, WindowSeconds: 1,
			TopSites: []model.BurstSite{{Bytes: 18 << 30, Share: 0.99, Stack: frames("burst_step", "main")}},
		}),
		finding(model.KindGPUMemoryLeak, model.GPUMemoryLeakEvidence{
			LiveBytes: 3 << 30, GrowthBytesPerSecond: 1.2 * (1 << 30), WindowSeconds: 30, TimeScaleSeconds: 30,
			TopSites: []model.GPULeakSite{{Bytes: 3 << 30, Allocations: 12, OldBytes: 2 << 30, OldestAgeSeconds: 40, Stack: frames("load_weights")}},
		}),
		finding("gpu_from_the_future", model.RawEvidence{Kind: "gpu_from_the_future", JSON: json.RawMessage(`{"warp_factor": 9, "engine": "<b>dilithium</b>"}`)}),
	)

	fd := cards[model.KindFDLeak]
	for _, s := range []string{
		`<td class="k" title="open_fds">open fds</td><td>461</td>`,
		`<td>12.5 fds/s</td>`,
		`<td>16 min</td>`,            // time to the limit
		`<td>4 min</td>`,             // window
		`<td>file 12, socket 3</td>`, // no zero counts
		`<th>unclosed fds</th>`,
		`<tr><td>396</td><td>&#43;156</td><td>25 s</td></tr>`,
		`<tr><td>1</td><td>0</td><td>250.00 ms</td></tr>`,
		`<div>&lt;script&gt;alert(2)&lt;/script&gt; (trainer.c:10)</div>`, // innermost first, escaped
		`<div>cache_tokenizer (trainer.c:11)</div>`,
		`<div>serve (trainer.c:13)</div>`,
		`<div>… 3 more frames</div>`,
		`<div>dup2 (trainer.c:10)</div>`,
		`<tr><td>/etc/hostname</td><td>278</td></tr>`,
	} {
		if !strings.Contains(fd, s) {
			t.Errorf("fd_leak card lacks %s", s)
		}
	}
	if strings.Contains(fd, "main (trainer.c") {
		t.Error("fd_leak card shows a site's stack past its first frames")
	}
	if strings.Contains(fd, "closed_by_kind") {
		t.Error("fd_leak card shows closed_by_kind, which is empty")
	}

	burst := cards[model.KindGPUAllocBurst]
	for _, s := range []string{`<td>18.0 GiB</td><td>99 %</td>`, `title="burst_bytes">burst</td><td>18.0 GiB</td>`, `<td>20.0 GiB</td>`,
		`<td>16.0 MiB ± 0 B</td>`, `<td>1 s</td>`, `<div>burst_step (trainer.c:10)</div>`, `<div>main (trainer.c:11)</div>`} {
		if !strings.Contains(burst, s) {
			t.Errorf("gpu_alloc_burst card lacks %s", s)
		}
	}
	for _, key := range []string{"period_seconds", "near_full"} { // null: does not apply
		if strings.Contains(burst, key) {
			t.Errorf("gpu_alloc_burst card shows %s, which is null", key)
		}
	}

	leak := cards[model.KindGPUMemoryLeak]
	for _, s := range []string{`<td>1.2 GiB/s</td>`, `<td>3.0 GiB</td><td>12</td><td>2.0 GiB</td><td>40 s</td>`, `<div>load_weights (trainer.c:10)</div>`} {
		if !strings.Contains(leak, s) {
			t.Errorf("gpu_memory_leak card lacks %s", s)
		}
	}
	for _, key := range []string{"time_to_exhaustion_seconds", "headroom", "nvml_used_bytes", "kept"} {
		if strings.Contains(leak, key) {
			t.Errorf("gpu_memory_leak card shows %s, which does not apply", key)
		}
	}

	// Evidence this release cannot read shows key by key.
	raw := cards["gpu_from_the_future"]
	for _, s := range []string{`<td class="k" title="warp_factor">warp_factor</td><td>9</td>`, `<td>&lt;b&gt;dilithium&lt;/b&gt;</td>`} {
		if !strings.Contains(raw, s) {
			t.Errorf("raw evidence card lacks %s:\n%s", s, raw)
		}
	}

	for kind, card := range cards {
		if strings.Contains(card, "null") || strings.Contains(card, "{&#34;") {
			t.Errorf("%s card has JSON in it:\n%s", kind, card)
		}
		if strings.Contains(card, "<script>") || strings.Contains(card, "<b>") {
			t.Errorf("%s card: evidence became markup", kind)
		}
	}
}

// Every kind of finding has its evidence laid out by its fields, not from
// its JSON form.
func TestEveryKindHasEvidenceRows(t *testing.T) {
	all := []model.Evidence{
		model.FDLeakEvidence{}, model.FDExhaustedEvidence{}, model.SocketLeakEvidence{}, model.CtxSwitchStormEvidence{},
		model.GPUAllocBurstEvidence{}, model.GPUMemoryLeakEvidence{}, model.GPUAllocFailureEvidence{}, model.GPUAllocChurnEvidence{},
		model.GPUXIDEvidence{}, model.GPUECCEvidence{}, model.GPUInputBoundEvidence{}, model.GPUSyncStormEvidence{},
		model.NCCLStragglerEvidence{}, model.NCCLHangEvidence{},
		// A failure's snapshot with nothing in it.
		model.GPUAllocFailureEvidence{Snapshot: &model.GPUMemorySnapshot{Devices: []model.SnapshotDevice{{Processes: []model.SnapshotProcess{{}}}}}},
	}
	clock := func(t time.Time) string { return t.Format(time.TimeOnly) }
	var kinds []string
	for _, ev := range all {
		kinds = append(kinds, ev.EvidenceKind())
		rows, ok := typedRows(ev, clock)
		if !ok || len(rows) == 0 {
			t.Errorf("%T: no rows of its own", ev)
		}
		for _, r := range rows {
			if r.Label == "" || r.Key == "" || (r.Value == "") == (r.Table == nil) {
				t.Errorf("%T: row %+v", ev, r)
			}
		}
	}
	for _, k := range model.Kinds {
		if !slices.Contains(kinds, k) {
			t.Errorf("kind %s: no evidence struct in this test", k)
		}
	}
	if _, ok := typedRows(model.RawEvidence{Kind: "x", JSON: json.RawMessage(`{}`)}, clock); ok {
		t.Error("raw evidence laid out as a known kind")
	}
}

// The other kinds, their lists and times.
func TestEvidenceRowsOtherKinds(t *testing.T) {
	clock := func(t time.Time) string { return t.UTC().Format(time.TimeOnly) }
	text := func(rows []evRow) string {
		var b strings.Builder
		for _, r := range rows {
			b.WriteString(r.Label + ": " + r.Value)
			if r.Table != nil {
				b.WriteString(strings.Join(r.Table.Head, "|"))
				for _, e := range r.Table.Rows {
					b.WriteString(" [" + strings.Join(e.Cells, "|") + "] " + strings.Join(e.Lines, " / "))
				}
			}
			b.WriteString("\n")
		}
		return b.String()
	}
	p99 := 0.004
	for _, c := range []struct {
		ev   model.Evidence
		want []string
	}{
		{model.CtxSwitchStormEvidence{RatePerSecond: 60000, VoluntaryRatio: 0.9, RunqueueP99Seconds: &p99, TopThreads: []model.ThreadRate{{TID: 7, Name: "spin", Rate: 30000}}},
			[]string{"rate: 60000 switches/s", "voluntary share: 90 %", "run-queue p99: 4.00 ms", "[7|spin|30000 switches/s]"}},
		{model.FDExhaustedEvidence{Limit: 1024, FailingCall: &model.FailingCall{Kind: "socket", SecondsAgo: 3, Stack: frames("accept_conn")}, FailuresTotal: map[string]uint64{"EMFILE": 4}},
			[]string{"failed calls: EMFILE 4", "[socket|3 s ago] accept_conn (trainer.c:10)"}},
		{model.SocketLeakEvidence{TopPairs: []model.SocketPair{{Local: "10.0.0.2:*", Remote: "10.0.0.9:5432", Count: 40}}, TCPByState: map[string]int{"CLOSE_WAIT": 40, "ESTABLISHED": 2},
			FDGrowth: &model.FDGrowth{GrowthPerSecond: 2, OpenFDs: 100, Limit: 1024, WindowSeconds: 8, FDLeakFirstSeen: t0}},
			[]string{"[10.0.0.2:*|10.0.0.9:5432|40]", "TCP by state: CLOSE_WAIT 40, ESTABLISHED 2", "fd leak explained: 2 fds/s, 100 of 1024 open, over 8 s, since 03:04:05"}},
		{model.GPUXIDEvidence{XID: 79, Class: model.XIDDevice, Meaning: "fallen off the bus", FirstAt: t0, MIGInstances: []model.MIGInstance{{GPUInstance: 1, ComputeInstance: 0}},
			Processes: []model.DeviceProcess{{PID: 12, Comm: "train"}, {PID: 13}}},
			[]string{"XID: 79", "class: device", "first: 03:04:05", "MIG instances: GI 1 CI 0", "[12|train]", "[13|(not watched)]"}},
		{model.GPUInputBoundEvidence{SMUtilizationMean: 0.125, StarvedShare: 0.6, Waiting: []model.WaitingProcess{{PID: 9, Comm: "loader", Role: "child", RunqP99Seconds: 0.02, AllowedCPUs: 2,
			Threads: []model.WaitingThread{{Name: "worker", TID: 10, Preempted: 12}}}}},
			[]string{"SM utilization: 12.5 %", "intervals starved: 60 %", "[9|loader|child|20.00 ms|2] worker (tid 10) preempted 12 times"}},
		{model.GPUInputBoundEvidence{SMUtilizationMean: 0.1, HostWaitShare: new(0.04)},
			[]string{"host waiting on the GPU: 4 %"}},
		{model.GPUSyncStormEvidence{CallsPerSecond: 1000, ShortShare: 1, ShortWaitSeconds: 0.001, HostWaitShare: 0.05,
			TopSites: []model.SyncSite{{API: "cudaStreamSynchronize", CallsPerSecond: 990, CallShare: 0.99, WaitShare: 0.9, Stack: frames("train_step")}}},
			[]string{"synchronisations: 1000 calls/s", "SM utilization: not known (no NVML)", "host thread waiting: 5 %",
				"[cudaStreamSynchronize|990 calls/s|99 %|90 %] train_step (trainer.c:10)"}},
		{model.GPUSyncStormEvidence{SMUtilizationMean: new(0.25)}, []string{"SM utilization: 25 %"}},
		{model.GPUAllocChurnEvidence{BytesPerSecond: 3 << 30, PairsPerSecond: 2500.4, SynchronizingFrees: map[string]uint64{"cudaFree": 9}},
			[]string{"allocated: 3.0 GiB/s", "alloc/free pairs: 2500 pairs/s", "synchronizing frees: cudaFree 9"}},
		{model.NCCLStragglerEvidence{StalledSeconds: 75, Communicators: []model.NCCLLag{{Communicator: "9f86d081", Rank: 2, NRanks: 4, Collectives: 20, Behind: 1,
			LastCall: &model.NCCLCall{Op: "allreduce", At: t0, Stack: frames("train_step")}, Peers: []model.NCCLRank{{Rank: 0, PID: 11, Comm: "train", Collectives: 21}}}},
			Threads: []model.NCCLThread{{TID: 12, Name: "train", State: "sleeping", WaitChannel: "hrtimer_nanosleep", Stack: frames("load_next_batch")}}},
			[]string{"no collective for: 1 min 15 s", "[9f86d081|2 of 4|20|1|allreduce] train_step (trainer.c:10) / peer rank 0: pid 11 (train), 21 collectives",
				"[12|train|sleeping|hrtimer_nanosleep] load_next_batch (trainer.c:10)"}},
		{model.NCCLStragglerEvidence{StacksUnavailable: "no registers"}, []string{"no thread stacks: no registers"}},
		{model.NCCLHangEvidence{StalledSeconds: 30, Communicators: []model.NCCLHung{{Communicator: "c0ffee", NRanks: 4, Collectives: 20,
			Ranks: []model.NCCLRank{{Rank: 0, PID: 11}, {Rank: 1, PID: 12}}}}},
			[]string{"no collective for: 30 s", "[c0ffee|4|20|0 (pid 11), 1 (pid 12)]"}},
	} {
		got := text(evidenceRows(c.ev, clock))
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%T: rows lack %q:\n%s", c.ev, w, got)
			}
		}
	}
}

func TestDurationText(t *testing.T) {
	for s, want := range map[float64]string{
		0: "0 s", 0.25: "250.00 ms", 8: "8 s", 2.5: "2.5 s", 25: "25 s", 59.4: "59.4 s", 60: "1 min", 240: "4 min", 265: "4 min 25 s",
		985.2: "16 min", 3599.9: "1 h", 7200: "2 h", 7500: "2 h 5 min", 43200: "12 h", 90000: "1 d 1 h", -30: "−30 s", 1e12: "11574074 d",
	} {
		if got := durationText(s); got != want {
			t.Errorf("durationText(%v) = %q, want %q", s, got, want)
		}
	}
}
