package report

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/history"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

func proc(pid int, comm string, open int, exited bool) *model.Process {
	return &model.Process{
		PID: pid, Comm: comm, Started: t0, Exited: exited,
		FD: model.FDStats{
			Open: open, Limit: 1024,
			Opened: map[string]uint64{"file": 80, "socket": 2},
			Closed: map[string]uint64{"file": 23},
		},
	}
}

// toStdout returns a Writer for "-" that writes into a buffer.
func toStdout() (*Writer, *bytes.Buffer) {
	w := New("v1.2.3", Outputs{JSON: "-"})
	var buf bytes.Buffer
	w.stdout = &buf
	return w, &buf
}

func decode(t *testing.T, data []byte) Report {
	t.Helper()
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatalf("decode: %v\n%s", err, data)
	}
	return r
}

func TestRoundTrip(t *testing.T) {
	f := model.Finding{
		Kind: model.KindFDLeak, PID: 100, Comm: "fdwork", Severity: model.SeverityWarning,
		FirstSeen: t0.Add(10 * time.Second), LastSeen: t0.Add(20 * time.Second), Active: true,
		Summary:  "open fds grew by 40 in 20s",
		Stack:    mixedStack,
		Evidence: model.FDLeakEvidence{GrowthPerSecond: 40},
	}
	w, buf := toStdout()
	w.Update(&model.Snapshot{Time: t0.Add(10 * time.Second), Start: t0, Targets: []int{100}, Processes: []*model.Process{proc(100, "fdwork", 40, false)}})
	err := w.Close(&model.Snapshot{
		Time: t0.Add(30 * time.Second), Start: t0, Targets: []int{100},
		Processes: []*model.Process{proc(100, "fdwork", 57, false)},
		Findings:  []model.Finding{f},
		Lost:      map[string]uint64{"fd_events": 3},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := decode(t, buf.Bytes())
	if r.SchemaVersion != SchemaVersion || r.Version != "v1.2.3" || !r.Start.Equal(t0) || !r.End.Equal(t0.Add(30*time.Second)) || r.DurationSeconds != 30 {
		t.Errorf("header = %q %v %v %v", r.Version, r.Start, r.End, r.DurationSeconds)
	}
	if !reflect.DeepEqual(r.Targets, []int{100}) {
		t.Errorf("targets = %v", r.Targets)
	}
	// One point, from the update: the final snapshot repeats the last
	// poll's figures and ends the report, not the history.
	if len(r.Processes) == 1 {
		h := r.Processes[0].History
		if h == nil || !reflect.DeepEqual(h.Time, []int64{t0.Add(10 * time.Second).UnixMilli()}) ||
			!reflect.DeepEqual(h.Series["open_fds"].Last, history.Values{40}) {
			t.Errorf("history = %+v", h)
		}
		r.Processes[0].History = nil
		r.Processes[0].Started = r.Processes[0].Started.UTC()
	}
	wantProc := Process{
		PID: 100, Comm: "fdwork", Started: t0, OpenFDs: 57, FDLimit: 1024,
		FDsOpened: map[string]uint64{"file": 80, "socket": 2},
		FDsClosed: map[string]uint64{"file": 23},

		TCPSocketsByState: map[string]int{}, SocketFDsByKind: map[string]int{},
	}
	if len(r.Processes) != 1 || !reflect.DeepEqual(r.Processes[0], wantProc) {
		t.Errorf("processes = %+v, want [%+v]", r.Processes, wantProc)
	}
	if len(r.Findings) != 1 {
		t.Fatalf("findings = %+v", r.Findings)
	}
	got := r.Findings[0]
	if !got.FirstSeen.Equal(f.FirstSeen) || !got.LastSeen.Equal(f.LastSeen) {
		t.Errorf("finding times = %v %v", got.FirstSeen, got.LastSeen)
	}
	got.FirstSeen, got.LastSeen = f.FirstSeen, f.LastSeen
	if !reflect.DeepEqual(got, f) {
		t.Errorf("finding = %+v, want %+v", got, f)
	}
	if !reflect.DeepEqual(r.LostEvents, map[string]uint64{"fd_events": 3}) {
		t.Errorf("lost_events = %v", r.LostEvents)
	}
	for _, key := range []string{`"first_seen"`, `"evidence"`, `"duration_seconds"`, `"fds_opened"`} {
		if !bytes.Contains(buf.Bytes(), []byte(key)) {
			t.Errorf("report lacks %s", key)
		}
	}
}

// mixedStack has a frame of each shape, as pkg/symbolize and pkg/pyframes
// make them.
var mixedStack = []model.Frame{
	{Kind: model.FrameNative, Function: "__open64", Module: "libc.so.6", Offset: 0x51},
	{Kind: model.FrameNative, Function: "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block", Module: "libc10_cuda.so", Offset: 0x40,
		Symbol: "_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator11alloc_blockERNS2_10AllocParamsEb"},
	{Kind: model.FramePython, Function: "cache_tokenizer", File: "/srv/app/leak.py", Line: 16},
	{Kind: model.FrameNative, Module: "libfoo.so", Offset: 0x1234},
	{Kind: model.FrameNative, Address: 0x7ffd0000},
	{Kind: model.FrameNative, Function: "main", Module: "trainer"},
}

// Stacks are arrays of frame objects, in the finding and in its evidence.
func TestStackFrames(t *testing.T) {
	w, buf := toStdout()
	f := model.Finding{Kind: model.KindFDLeak, PID: 100, FirstSeen: t0, LastSeen: t0, Stack: mixedStack,
		Evidence: model.FDLeakEvidence{TopSites: []model.FDLeakSite{{Stack: mixedStack[:1], UnclosedFDs: 3}}}}
	if err := w.Close(&model.Snapshot{Time: t0, Start: t0, Processes: []*model.Process{proc(100, "fdwork", 40, false)}, Findings: []model.Finding{f}}); err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Findings []struct {
			Stack    json.RawMessage `json:"stack"`
			Evidence struct {
				TopSites []struct {
					Stack json.RawMessage `json:"stack"`
				} `json:"top_sites"`
			} `json:"evidence"`
		} `json:"findings"`
	}
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	want := `[{"function":"__open64","kind":"native","module":"libc.so.6","offset":81},` +
		`{"function":"c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block","kind":"native","module":"libc10_cuda.so","offset":64,` +
		`"symbol":"_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator11alloc_blockERNS2_10AllocParamsEb"},` +
		`{"file":"/srv/app/leak.py","function":"cache_tokenizer","kind":"python","line":16},` +
		`{"kind":"native","module":"libfoo.so","offset":4660},` +
		`{"address":2147287040,"kind":"native"},` +
		`{"function":"main","kind":"native","module":"trainer"}]`
	var got bytes.Buffer
	if err := json.Compact(&got, raw.Findings[0].Stack); err != nil || got.String() != want {
		t.Errorf("stack\n %s\nwant\n %s", got.String(), want)
	}
	got.Reset()
	if err := json.Compact(&got, raw.Findings[0].Evidence.TopSites[0].Stack); err != nil || got.String() != `[{"function":"__open64","kind":"native","module":"libc.so.6","offset":81}]` {
		t.Errorf("top site's stack %s", got.String())
	}

	// The page shows frames as text, in the evidence too (as the template
	// escapes them).
	r := decode(t, buf.Bytes())
	var page bytes.Buffer
	if err := WriteHTML(&page, &r); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"<li>c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::alloc_block&#43;0x40 (libc10_cuda.so)</li>",
		"<li>0x7ffd0000</li>", "<li>main (trainer)</li>", `<tr><td>3</td>`, `<div>__open64&#43;0x51 (libc.so.6)</div>`} {
		if !strings.Contains(page.String(), s) {
			t.Errorf("page lacks %s", s)
		}
	}
}

// A schema 2 report, whose frames are strings, reads and renders.
func TestReadSchema2(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v2.json")
	old := `{"schema_version": 2, "version": "v0.3.0", "start": "2025-01-02T03:04:05Z", "end": "2025-01-02T03:05:05Z",
		"processes": [{"pid": 7, "comm": "w", "open_fds": 3, "fd_limit": 1024}],
		"findings": [{"kind": "fd_leak", "pid": 7, "comm": "w", "severity": "warning", "first_seen": "2025-01-02T03:04:35Z",
			"last_seen": "2025-01-02T03:05:05Z", "active": true, "summary": "fd leak",
			"stack": ["__open64+0x51 (libc.so.6)", "cache_tokenizer (/srv/app/leak.py:16)", "libfoo.so+0x1234"],
			"evidence": {"top_sites": [{"stack": ["__open64+0x51 (libc.so.6)"], "unclosed_fds": 3}]}}]}`
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []model.Frame{mixedStack[0], mixedStack[2], mixedStack[3]}
	if got := r.Findings[0].Stack; !reflect.DeepEqual(got, want) {
		t.Errorf("stack %+v\nwant %+v", got, want)
	}
	var page bytes.Buffer
	if err := WriteHTML(&page, r); err != nil {
		t.Fatal(err)
	}
	// As the template escapes them. The evidence lacks keys this release
	// writes: it is shown key by key, not with zeros it never had.
	for _, s := range []string{"<li>cache_tokenizer (/srv/app/leak.py:16)</li>", "<li>libfoo.so&#43;0x1234</li>", `[{&#34;stack&#34;:[&#34;__open64&#43;0x51 (libc.so.6)&#34;]`} {
		if !strings.Contains(page.String(), s) {
			t.Errorf("page lacks %s", s)
		}
	}
}

func TestEmptyRun(t *testing.T) {
	for name, final := range map[string]*model.Snapshot{
		"empty snapshot": {Time: t0.Add(5 * time.Second), Start: t0},
		"no snapshot":    nil,
	} {
		t.Run(name, func(t *testing.T) {
			w, buf := toStdout()
			if err := w.Close(final); err != nil {
				t.Fatal(err)
			}
			// Collections are empty, never null.
			var raw map[string]json.RawMessage
			if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
				t.Fatal(err)
			}
			want := map[string]string{"targets": "[]", "processes": "[]", "findings": "[]", "lost_events": "{}"}
			for key, v := range want {
				if string(raw[key]) != v {
					t.Errorf("%s = %s, want %s", key, raw[key], v)
				}
			}
			if r := decode(t, buf.Bytes()); r.DurationSeconds < 0 || r.End.Before(r.Start) {
				t.Errorf("start %v end %v duration %v", r.Start, r.End, r.DurationSeconds)
			}
		})
	}
}

func TestNilStackAndEvidence(t *testing.T) {
	w, buf := toStdout()
	f := model.Finding{Kind: model.KindFDLeak, PID: 100, FirstSeen: t0, LastSeen: t0}
	if err := w.Close(&model.Snapshot{Time: t0, Start: t0, Findings: []model.Finding{f}}); err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Findings []map[string]json.RawMessage `json:"findings"`
	}
	if err := json.Unmarshal(buf.Bytes(), &raw); err != nil {
		t.Fatal(err)
	}
	if s, e := string(raw.Findings[0]["stack"]), string(raw.Findings[0]["evidence"]); s != "[]" || e != "{}" {
		t.Errorf("stack = %s, evidence = %s; want [] and {}", s, e)
	}
}

func TestExitedProcessKept(t *testing.T) {
	w, buf := toStdout()
	w.Update(&model.Snapshot{Time: t0.Add(time.Second), Start: t0,
		Processes: []*model.Process{proc(100, "fdwork", 10, false), proc(200, "sockwork", 5, false)}})
	w.Update(&model.Snapshot{Time: t0.Add(2 * time.Second), Start: t0,
		Processes: []*model.Process{proc(100, "fdwork", 11, false), proc(200, "sockwork", 3, true)}})
	// pid 200 no longer appears; pid 100 is reused by a new process.
	reused := proc(100, "other", 4, false)
	reused.Started = t0.Add(3 * time.Second)
	w.Update(&model.Snapshot{Time: t0.Add(3 * time.Second), Start: t0,
		Processes: []*model.Process{proc(100, "fdwork", 12, true)}})
	if err := w.Close(&model.Snapshot{Time: t0.Add(4 * time.Second), Start: t0,
		Processes: []*model.Process{reused}}); err != nil {
		t.Fatal(err)
	}
	r := decode(t, buf.Bytes())
	type brief struct {
		pid    int
		comm   string
		open   int
		exited bool
	}
	var got []brief
	for _, p := range r.Processes {
		got = append(got, brief{p.PID, p.Comm, p.OpenFDs, p.Exited})
	}
	want := []brief{{100, "fdwork", 12, true}, {100, "other", 4, false}, {200, "sockwork", 3, true}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("processes = %+v, want %+v", got, want)
	}
}

func TestFileWrittenAtomically(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "report.json")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	w := New("v1", Outputs{JSON: path})
	if err := w.Close(&model.Snapshot{Time: t0, Start: t0, Processes: []*model.Process{proc(100, "fdwork", 1, false)}}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if r := decode(t, data); r.Version != "v1" || len(r.Processes) != 1 {
		t.Errorf("report = %+v", r)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the report (temporary file left?)", len(entries))
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o644 {
		t.Errorf("mode = %v, want 0644", fi.Mode())
	}
}

// A report that cannot be written says so with the path asked for, not the
// temporary file beside it.
func TestWriteError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "report.json")
	w := New("v1", Outputs{JSON: path})
	err := w.Close(nil)
	if err == nil || !strings.Contains(err.Error(), "report: writing "+path+": ") {
		t.Errorf("Close into a missing directory = %v, want an error naming %s", err, path)
	}
}
