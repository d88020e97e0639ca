package profiles

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// failedAt is the instant of the snapshot's failed allocation.
var failedAt = time.Date(2026, 12, 5, 17, 16, 20, 123456789, time.UTC)

// oomSnapshot is a process's memory when its allocation of 2 GiB failed:
// a leak's 80 MiB, a burst's 4 GiB (freed right after the failure), a
// site without a stack, and two allocations at smaller sites.
func oomSnapshot(at time.Time) *model.GPUMemorySnapshot {
	p := process()
	leak, burst := p.CUDA.Sites[0].Stack, p.CUDA.Sites[1].Stack
	nvml, gap := uint64(6<<30), int64(6<<30-(80<<20+4<<30+1<<20+3<<20))
	return &model.GPUMemorySnapshot{
		Time: at, API: "cudaMalloc", Error: "cudaErrorMemoryAllocation", Code: 2, SizeBytes: 2 << 30, Why: model.SnapshotOutOfMemory,
		Stack:     []model.Frame{{Kind: model.FramePython, Function: "allocate_kv_cache", File: "/srv/engine.py", Line: 210}},
		LiveBytes: 80<<20 + 4<<30 + 1<<20 + 3<<20, LiveAllocations: 17,
		Sites: []model.SnapshotSite{
			{Bytes: 4 << 30, Allocations: 4, FreedAfterBytes: 4 << 30, Stack: burst},
			{Bytes: 80 << 20, Allocations: 10, OldestAgeSeconds: 30, Stack: leak},
			{Bytes: 1 << 20, Allocations: 1},
		},
		OtherSitesBytes: 3 << 20, FreedAfterBytes: 4 << 30,
		NVMLUsedBytes: &nvml, GapBytes: &gap,
	}
}

// parse writes p and reads it back as go tool pprof does.
func parse(t *testing.T, p *profile.Profile) *profile.Profile {
	t.Helper()
	var buf bytes.Buffer
	if err := p.Write(&buf); err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The profile of a snapshot has what was live at the failure only: one
// sample a site, the sites past the bound as one, at the failure's time,
// the failed call in its comments.
func TestSnapshotProfile(t *testing.T) {
	prof, err := OfSnapshot(42, "serve", oomSnapshot(failedAt))
	if err != nil {
		t.Fatal(err)
	}
	p := parse(t, prof)
	if len(p.SampleType) != 2 || p.SampleType[0].Type != "inuse_objects" || p.SampleType[1].Type != "inuse_space" || p.SampleType[1].Unit != "bytes" ||
		p.DefaultSampleType != "inuse_space" || len(p.Sample) != 4 {
		t.Fatalf("sample types %v, default %q, %d samples", p.SampleType, p.DefaultSampleType, len(p.Sample))
	}
	if p.TimeNanos != failedAt.UnixNano() {
		t.Errorf("time %v, want the failure's %v", time.Unix(0, p.TimeNanos).UTC(), failedAt)
	}
	var total int64
	for fn, want := range map[string][2]int64{
		"burst_step": {4, 4 << 30},
		"leak_step":  {10, 80 << 20},
		unsymbolized: {1, 1 << 20},
		smallerSites: {2, 3 << 20}, // 17 live, 15 at the sites listed
	} {
		got := values(t, p, fn)
		if [2]int64(got) != want {
			t.Errorf("%s: %v, want %v (inuse objects and space)", fn, got, want)
		}
		total += got[1]
	}
	if total != int64(oomSnapshot(failedAt).LiveBytes) {
		t.Errorf("samples sum to %d bytes, want the live %d", total, oomSnapshot(failedAt).LiveBytes)
	}
	for _, s := range p.Sample {
		freed := s.NumLabel["freed_after_failure"]
		if fn := s.Location[0].Line[0].Function.Name; fn == "burst_step" {
			if len(freed) != 1 || freed[0] != 4<<30 || s.NumUnit["freed_after_failure"][0] != "bytes" {
				t.Errorf("burst_step freed after the failure %v %v, want 4 GiB", freed, s.NumUnit)
			}
		} else if freed != nil {
			t.Errorf("%s freed after the failure %v, want none", fn, freed)
		}
	}
	comments := strings.Join(p.Comments, "\n")
	for _, want := range []string{"pid 42 (serve)", "cudaMalloc of 2.0 GiB failed with cudaErrorMemoryAllocation (2), out_of_memory", "2026-12-05T17:16:20.123456789Z",
		"allocate_kv_cache", "NVML: 6.0 GiB used", "freed after the failure"} {
		if !strings.Contains(comments, want) {
			t.Errorf("comments lack %q:\n%s", want, comments)
		}
	}
	if _, err := OfSnapshot(42, "serve", nil); err == nil {
		t.Error("a profile of no snapshot was made")
	}
}

// go tool pprof -top reads a snapshot's file: the sites' functions with
// the bytes they held at the failure.
func TestSnapshotProfileTop(t *testing.T) {
	dir := t.TempDir()
	w := NewWriter(dir)
	p := process()
	p.CUDA.Snapshots = []*model.GPUMemorySnapshot{oomSnapshot(failedAt)}
	w.Update(&model.Snapshot{Time: failedAt.Add(time.Second), Processes: []*model.Process{p}})
	file := filepath.Join(dir, "42-gpu-oom-20261205T171620.123Z.pb.gz")
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodefraction=0", file).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof -top %s: %v\n%s", file, err, out)
	}
	// "    4096MB 98.00% 98.00%     4096MB 98.00%  burst_step" (pprof's
	// MB are MiB); main is every site's caller.
	for fn, want := range map[string]string{"burst_step": "4096MB", "leak_step": "80MB", regexp.QuoteMeta(unsymbolized): "1MB", regexp.QuoteMeta(smallerSites): "3MB"} {
		re := regexp.MustCompile(`(?m)^\s*` + want + `\s+\S+%\s+\S+%\s+` + want + `\s+\S+%\s+` + fn + `$`)
		if !re.Match(out) {
			t.Errorf("go tool pprof -top: no %s at %s:\n%s", want, fn, out)
		}
	}
	if !regexp.MustCompile(`(?m)^\s*0\s+0%\s+\S+%\s+4176MB\s+\S+%\s+main$`).Match(out) {
		t.Errorf("go tool pprof -top: main does not hold the 4096+80 MB of its callees:\n%s", out)
	}
}

func TestOOMNames(t *testing.T) {
	at := time.Date(2026, 12, 5, 18, 16, 20, 123999999, time.FixedZone("CET", 3600))
	if got := OOMFileName(42, at); got != "42-gpu-oom-20261205T171620.123Z.pb.gz" {
		t.Errorf("OOMFileName = %q", got)
	}
	if got := OOMPath(42, at); got != "/debug/pprof/gpu?pid=42&at=failure&time=20261205T171620.123Z" {
		t.Errorf("OOMPath = %q", got)
	}
	// Sorted by name, a process's files are in time order.
	names := []string{OOMFileName(7, at.Add(time.Hour)), OOMFileName(7, at), OOMFileName(7, at.Add(time.Minute))}
	if slices.Sort(names); names[0] != OOMFileName(7, at) || names[2] != OOMFileName(7, at.Add(time.Hour)) {
		t.Errorf("names sorted %v", names)
	}
	for _, tc := range []struct {
		in        string
		at        time.Time
		precision time.Duration
	}{
		{"20261205T171620.123Z", time.Date(2026, 12, 5, 17, 16, 20, 123e6, time.UTC), time.Millisecond},
		{"2026-12-05T17:16:20Z", time.Date(2026, 12, 5, 17, 16, 20, 0, time.UTC), time.Second},
		{"2026-12-05T18:16:20.12+01:00", time.Date(2026, 12, 5, 17, 16, 20, 120e6, time.UTC), 10 * time.Millisecond},
		{"2026-12-05T18:16:20.12 01:00", time.Date(2026, 12, 5, 17, 16, 20, 120e6, time.UTC), 10 * time.Millisecond}, // + unescaped in a query
		{"2026-12-05T17:16:20.123456789Z", time.Date(2026, 12, 5, 17, 16, 20, 123456789, time.UTC), time.Nanosecond},
	} {
		at, precision, err := parseSnapshotTime(tc.in)
		if err != nil || !at.Equal(tc.at) || precision != tc.precision {
			t.Errorf("parseSnapshotTime(%q) = %v, %v, %v; want %v, %v", tc.in, at, precision, err, tc.at, tc.precision)
		}
	}
	for _, bad := range []string{"", "yesterday", "20261205T171620Z", "2026-12-05 17:16:20"} {
		if _, _, err := parseSnapshotTime(bad); err == nil {
			t.Errorf("parseSnapshotTime(%q): no error", bad)
		}
	}
}

// The Writer writes a snapshot's profile as soon as a snapshot of the
// model has it, once, and lists it in Written.
func TestWriterSnapshotAtUpdate(t *testing.T) {
	dir := t.TempDir()
	w := NewWriter(dir)
	p := process()
	first := oomSnapshot(failedAt)
	p.CUDA.Snapshots = []*model.GPUMemorySnapshot{first}
	snap := func(sec int) *model.Snapshot {
		return &model.Snapshot{Time: failedAt.Add(time.Duration(sec) * time.Second), Processes: []*model.Process{p}}
	}
	w.Update(snap(1))
	file := filepath.Join(dir, OOMFileName(42, failedAt))
	if !slices.Equal(w.Written, []string{file}) {
		t.Fatalf("written %v at the first update, want %s", w.Written, file)
	}
	if p := readFile(t, file); p.TimeNanos != failedAt.UnixNano() {
		t.Errorf("%s: time %d", file, p.TimeNanos)
	}
	// Not again: the later snapshots of the model share it.
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	w.Update(snap(2))
	if _, err := os.Stat(file); !os.IsNotExist(err) || len(w.Written) != 1 {
		t.Fatalf("written again (%v): %v", err, w.Written)
	}
	second := oomSnapshot(failedAt.Add(model.SnapshotEvery))
	p.CUDA.Snapshots = []*model.GPUMemorySnapshot{first, second}
	w.Update(snap(61))
	next := filepath.Join(dir, OOMFileName(42, second.Time))
	if !slices.Equal(w.Written, []string{file, next}) {
		t.Fatalf("written %v, want %s then %s", w.Written, file, next)
	}
	// Close writes the process's profiles, not the snapshots again.
	if err := w.Close(snap(62)); err != nil {
		t.Fatal(err)
	}
	want := []string{file, next, filepath.Join(dir, "42-gpu.pb.gz"), filepath.Join(dir, "42-fd.pb.gz")}
	if !slices.Equal(w.Written, want) {
		t.Errorf("written %v, want %v", w.Written, want)
	}

	// One that cannot be written is said at Close.
	w = NewWriter(filepath.Join(dir, "gone"))
	w.Update(snap(1))
	if err := w.Close(nil); err == nil || !strings.Contains(err.Error(), "20261205T171620.123Z") {
		t.Errorf("Close: %v, want the snapshot's write error", err)
	}
}

func readFile(t *testing.T, file string) *profile.Profile {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return p
}

// get asks h for url: the status, the profile served (nil if none) and
// the body's text otherwise.
func get(t *testing.T, h http.Handler, url string) (int, *profile.Profile, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, url, nil))
	if rec.Code != http.StatusOK {
		return rec.Code, nil, rec.Body.String()
	}
	p, err := profile.Parse(rec.Body)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	if d := rec.Header().Get("Content-Disposition"); !strings.Contains(d, "-gpu-oom-") {
		t.Errorf("%s: Content-Disposition %q", url, d)
	}
	return rec.Code, p, ""
}

// The daemon serves the newest snapshot of a process, or the one asked
// for, after the process exited; a reused pid's newest is the new
// process's; bad requests are told why.
func TestLiveFailures(t *testing.T) {
	var l Live
	h := l.Handler(GPU)
	p := process()
	p.Started = failedAt.Add(-time.Hour)
	first, second := oomSnapshot(failedAt), oomSnapshot(failedAt.Add(model.SnapshotEvery))
	second.Sites, second.OtherSitesBytes = second.Sites[:1], 0
	p.CUDA.Snapshots = []*model.GPUMemorySnapshot{first, second}
	l.Update(&model.Snapshot{Time: failedAt.Add(2 * time.Minute), Processes: []*model.Process{p}})
	// It exits, and is forgotten.
	l.Update(&model.Snapshot{Time: failedAt.Add(3 * time.Minute)})

	base := "/debug/pprof/gpu?pid=42&at=failure"
	if code, prof, body := get(t, h, base); code != http.StatusOK || prof.TimeNanos != second.Time.UnixNano() || len(prof.Sample) != 1 {
		t.Errorf("%s: %d %s, want the newest snapshot's profile", base, code, body)
	}
	for _, q := range []string{"&time=20261205T171620.123Z", "&time=2026-12-05T17:16:20Z", "&time=2026-12-05T18:16:20.1234%2B01:00"} {
		if code, prof, body := get(t, h, base+q); code != http.StatusOK || prof.TimeNanos != first.Time.UnixNano() || len(prof.Sample) != 4 {
			t.Errorf("%s: %d %s, want the first snapshot's profile", base+q, code, body)
		}
	}
	if code, prof, body := get(t, h, OOMPath(42, second.Time)); code != http.StatusOK || prof.TimeNanos != second.Time.UnixNano() {
		t.Errorf("%s: %d %s", OOMPath(42, second.Time), code, body)
	}
	for url, want := range map[string]struct {
		code int
		says string
	}{
		base + "&time=20261205T171620.124Z":  {http.StatusNotFound, "it has: 20261205T171620.123Z, 20261205T171720.123Z"},
		"/debug/pprof/gpu?pid=43&at=failure": {http.StatusNotFound, "pid 43 has no memory snapshot"},
		"/debug/pprof/gpu?pid=-1&at=failure": {http.StatusBadRequest, "not a positive number"},
		"/debug/pprof/gpu?pid=x&at=failure":  {http.StatusBadRequest, "not a positive number"},
		"/debug/pprof/gpu?at=failure":        {http.StatusBadRequest, "needs pid"},
		"/debug/pprof/gpu?pid=42&at=start":   {http.StatusBadRequest, "only at=failure"},
		"/debug/pprof/gpu?pid=42&time=2026":  {http.StatusBadRequest, "only at=failure"},
		base + "&time=yesterday":             {http.StatusBadRequest, "nor RFC 3339"},
	} {
		if code, _, body := get(t, h, url); code != want.code || !strings.Contains(body, want.says) {
			t.Errorf("%s: %d %q, want %d saying %q", url, code, body, want.code, want.says)
		}
	}
	rec := httptest.NewRecorder()
	l.Handler(FD).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/pprof/fd?pid=42&at=failure", nil))
	if rec.Code != http.StatusBadRequest {
		t.Errorf("fd at a failure: %d", rec.Code)
	}

	// The pid reused: its newest snapshot is the new process's; the old
	// one's still served by time.
	again := process()
	again.Started = failedAt.Add(time.Hour)
	third := oomSnapshot(failedAt.Add(2 * time.Hour))
	again.CUDA.Snapshots = []*model.GPUMemorySnapshot{third}
	l.Update(&model.Snapshot{Time: third.Time, Processes: []*model.Process{again}})
	if _, prof, _ := get(t, h, base); prof == nil || prof.TimeNanos != third.Time.UnixNano() {
		t.Errorf("reused pid: %v, want the new process's snapshot", prof)
	}
	if _, prof, _ := get(t, h, OOMPath(42, first.Time)); prof == nil || prof.TimeNanos != first.Time.UnixNano() {
		t.Errorf("reused pid: the old process's first snapshot not served")
	}
}

// At most model.MaxSnapshots a process and MaxFailureProcesses processes
// are kept: the oldest go.
func TestLiveFailuresBound(t *testing.T) {
	var l Live
	h := l.Handler(GPU)
	p := process()
	var all []*model.GPUMemorySnapshot
	for i := range model.MaxSnapshots + 2 {
		all = append(all, oomSnapshot(failedAt.Add(time.Duration(i)*model.SnapshotEvery)))
		// As the model has them: the newest few.
		p.CUDA.Snapshots = all[max(0, len(all)-model.MaxSnapshots):]
		l.Update(&model.Snapshot{Time: all[i].Time, Processes: []*model.Process{p}})
	}
	for i, s := range all {
		code, _, _ := get(t, h, OOMPath(42, s.Time))
		if kept := i >= len(all)-model.MaxSnapshots; kept != (code == http.StatusOK) {
			t.Errorf("snapshot %d: %d, kept %v", i, code, kept)
		}
	}

	// Processes 1000, 1001, ... fail one after another, each later.
	for i := range MaxFailureProcesses + 10 {
		q := &model.Process{PID: 1000 + i, Comm: "w", CUDA: model.CUDAStats{Snapshots: []*model.GPUMemorySnapshot{oomSnapshot(failedAt.Add(time.Duration(i+10) * time.Hour))}}}
		l.Update(&model.Snapshot{Processes: []*model.Process{q}})
	}
	l.failures.mu.Lock()
	n := len(l.failures.procs)
	l.failures.mu.Unlock()
	if n != MaxFailureProcesses {
		t.Errorf("%d processes kept, want %d", n, MaxFailureProcesses)
	}
	// 42's are the oldest, then 1000-1009's.
	for pid, kept := range map[int]bool{42: false, 1000: false, 1009: false, 1010: true, 1000 + MaxFailureProcesses + 9: true} {
		code, _, body := get(t, h, "/debug/pprof/gpu?pid="+strconv.Itoa(pid)+"&at=failure")
		if kept != (code == http.StatusOK) {
			t.Errorf("pid %d: %d %s, kept %v", pid, code, body, kept)
		}
	}
}
