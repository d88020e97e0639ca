package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/open-autoglm/autoglm-ebpf/pkg/daemon"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/profiles"
	"github.com/open-autoglm/autoglm-ebpf/pkg/report"
)

// run and attach name the file --pprof writes a snapshot's profile to, and
// nothing without --pprof.
func TestOOMProfileOfWatch(t *testing.T) {
	at := time.Date(2026, 12, 5, 17, 16, 20, 123456789, time.UTC)
	if f := (&watchFlags{listen: ":9464"}).oomProfile(); f != nil {
		t.Errorf("without --pprof a profile is named: %q", f(42, at))
	}
	if got := (&watchFlags{pprof: "prof"}).oomProfile()(42, at); got != filepath.Join("prof", "42-gpu-oom-20261205T171620.123Z.pb.gz") {
		t.Errorf("--pprof prof names %q", got)
	}
}

// The daemon's finding log names where the profile of a failure's memory
// snapshot is served (as the daemon sets pipeline.Config.OOMProfile), and
// the daemon's server serves it there, after the process is gone.
func TestOOMProfileOfDaemon(t *testing.T) {
	srv, err := daemon.Listen("0.0.0.0:0", "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	live := serveProfiles(srv)
	srv.Serve(prometheus.NewRegistry(), nil, 0)

	at := time.Date(2026, 12, 5, 17, 16, 20, 123456789, time.UTC)
	snap := &model.GPUMemorySnapshot{Time: at, API: "cudaMalloc", Error: "cudaErrorMemoryAllocation", Code: 2, SizeBytes: 1 << 30, Why: model.SnapshotOutOfMemory,
		LiveBytes: 3 << 30, LiveAllocations: 3, Sites: []model.SnapshotSite{{Bytes: 3 << 30, Allocations: 3,
			Stack: []model.Frame{{Kind: model.FramePython, Function: "allocate_kv_cache", File: "/srv/engine.py", Line: 210}}}}}
	// As pkg/gpuoom fills it from the daemon's pipeline.Config.OOMProfile.
	snap.Profile = profiles.OOMPath(42, at)
	p := &model.Process{PID: 42, Comm: "serve", Started: at.Add(-time.Hour), CUDA: model.CUDAStats{Snapshots: []*model.GPUMemorySnapshot{snap}}}
	f := model.Finding{Kind: model.KindGPUAllocFailure, PID: 42, Comm: "serve", Severity: model.SeverityCritical, FirstSeen: at, Active: true,
		Summary: "cudaMalloc failed", Evidence: model.GPUAllocFailureEvidence{API: "cudaMalloc", Error: "cudaErrorMemoryAllocation", Code: 2, Count: 1,
			FirstFailure: at, LastFailure: at, SizeBytes: 1 << 30, Snapshot: snap, Snapshots: 1}}
	var log bytes.Buffer
	findings := daemon.NewFindingsLog(&log)
	s := &model.Snapshot{Time: at.Add(time.Second), Processes: []*model.Process{p}, Findings: []model.Finding{f}}
	live.Update(s)
	findings.Update(s)
	// The process dies of it.
	p = &model.Process{PID: 42, Comm: "serve", Started: p.Started, Exited: true, CUDA: p.CUDA}
	live.Update(&model.Snapshot{Time: at.Add(2 * time.Second), Processes: []*model.Process{p}})
	live.Update(&model.Snapshot{Time: at.Add(3 * time.Second)})

	var line struct {
		Evidence struct {
			Snapshot struct {
				Profile string `json:"profile"`
			} `json:"snapshot"`
		} `json:"evidence"`
	}
	if err := json.Unmarshal(log.Bytes(), &line); err != nil {
		t.Fatalf("finding log %q: %v", log.String(), err)
	}
	path := line.Evidence.Snapshot.Profile
	if path != "/debug/pprof/gpu?pid=42&at=failure&time=20261205T171620.123Z" {
		t.Fatalf("the finding log names %q", path)
	}
	port := strconv.Itoa(srv.Addr().(*net.TCPAddr).Port)
	resp, err := http.Get("http://" + net.JoinHostPort("127.0.0.1", port) + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s", path, resp.Status)
	}
	prof, err := profile.Parse(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if prof.TimeNanos != at.UnixNano() || len(prof.Sample) != 1 || prof.Sample[0].Value[1] != 3<<30 ||
		prof.Sample[0].Location[0].Line[0].Function.Name != "allocate_kv_cache" {
		t.Errorf("%s: time %d, samples %v", path, prof.TimeNanos, prof.Sample)
	}

	// Served as the other profiles are: not to a client from elsewhere
	// than loopback, without --web.expose-profiles or authentication.
	t.Run("not loopback", func(t *testing.T) {
		ip := nonLoopbackIPv4(t)
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}, Timeout: 10 * time.Second}
		c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
		resp, err := c.Get("http://" + net.JoinHostPort(ip.String(), port) + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s from %s: %s, want 403", path, ip, resp.Status)
		}
	})
}

// nonLoopbackIPv4 is an address of this machine other than loopback; the
// test is skipped without one.
func nonLoopbackIPv4(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.To4()
		}
	}
	t.Skip("this machine has no non-loopback IPv4 address to make a non-loopback request from")
	return nil
}

// report --pprof writes the profile of the snapshot each gpu_alloc_failure
// of the report carries, as run --pprof did.
func TestOOMProfileOfReport(t *testing.T) {
	at := time.Date(2026, 12, 5, 17, 16, 20, 123456789, time.UTC)
	snap := &model.GPUMemorySnapshot{Time: at, API: "cudaMalloc", Error: "cudaErrorMemoryAllocation", Code: 2, SizeBytes: 1 << 30, Why: model.SnapshotOutOfMemory,
		LiveBytes: 3 << 30, LiveAllocations: 3, Sites: []model.SnapshotSite{{Bytes: 3 << 30, Allocations: 3}}}
	r := &report.Report{End: at.Add(time.Minute), Findings: []model.Finding{
		{Kind: model.KindGPUAllocFailure, PID: 42, Comm: "serve", Evidence: model.GPUAllocFailureEvidence{API: "cudaMalloc", Snapshot: snap, Snapshots: 1}},
		{Kind: model.KindGPUAllocFailure, PID: 43, Comm: "serve", Evidence: model.GPUAllocFailureEvidence{API: "cudaMalloc"}}, // none taken
	}}
	dir := t.TempDir()
	if err := writeProfiles(dir, r); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.pb.gz"))
	if len(files) != 1 || filepath.Base(files[0]) != "42-gpu-oom-20261205T171620.123Z.pb.gz" {
		t.Fatalf("written %v", files)
	}
	if p := readProfile(t, files[0]); p.TimeNanos != at.UnixNano() || len(p.Sample) != 1 {
		t.Errorf("%s: time %d, %d samples", files[0], p.TimeNanos, len(p.Sample))
	}
}
