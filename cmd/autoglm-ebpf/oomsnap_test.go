package main

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// attach on a process whose allocation fails on a full (stand-in) device:
// cudawork oom keeps 64 MiB at oom_weights and 100 MiB at oom_activations,
// asks oom_grow for 1 GiB over 512 MiB and frees the activations right
// after. The report's gpu_alloc_failure carries the memory as it stood at
// the failure (the activations in it), the page shows its flame graph, and
// --pprof wrote PID-gpu-oom-TIME.pb.gz, which go tool pprof reads.
func TestOOMSnapshotReport(t *testing.T) {
	testutil.RequireRoot(t)
	browser := testutil.Chromium(t)
	t.Setenv("CUDA_STUB_MEMORY", strconv.Itoa(512<<20))
	target := testutil.Start(t, testutil.Fixture(t, "cudawork"), testutil.CUDAStubs(t), "oom", "60")
	pid := target.Process.Pid
	dir := t.TempDir()
	js, page, prof := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.html"), filepath.Join(dir, "prof")
	addr := testutil.FreeAddr(t)
	attach := exec.Command(binary, "attach", "--pid", strconv.Itoa(pid), "--listen", addr, "--duration", "60s",
		"--json", js, "--html", page, "--pprof", prof)
	var logs bytes.Buffer
	attach.Stdout, attach.Stderr = &logs, &logs
	if err := attach.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = attach.Process.Kill(); _ = attach.Wait() })

	metrics := func() string {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// Its runtime hooked (it has CUDA figures), the allocations may start.
	testutil.Eventually(t, 30*time.Second, "the runtime hooked", func() bool {
		return strings.Contains(metrics(), "autoglm_cuda_live_bytes{")
	})
	if err := target.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the failure counted", func() bool {
		return strings.Contains(metrics(), "autoglm_cuda_alloc_failures_total{")
	})
	if err := attach.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := attach.Wait(); err != nil {
		t.Fatalf("attach: %v\n%s", err, logs.Bytes())
	}

	r := readReport(t, js)
	var ev model.GPUAllocFailureEvidence
	for _, f := range r.Findings {
		if e, ok := f.Evidence.(model.GPUAllocFailureEvidence); ok && f.PID == pid {
			ev = e
			t.Log(f.Summary)
		}
	}
	s := ev.Snapshot
	if s == nil || ev.Snapshots != 1 {
		t.Fatalf("failure evidence %+v: want one snapshot", ev)
	}
	bySite := map[string]model.SnapshotSite{}
	for _, site := range s.Sites {
		if len(site.Stack) > 0 {
			bySite[site.Stack[0].Function] = site
		}
	}
	const mib = 1 << 20
	if w, a := bySite["oom_weights"], bySite["oom_activations"]; w.Bytes != 64*mib || w.Allocations != 4 || a.Bytes != 100*mib || a.Allocations != 100 || a.FreedAfterBytes != 100*mib {
		t.Errorf("sites at the failure: weights %+v, activations %+v; want 4 x 16 MiB kept, 100 x 1 MiB freed after", w, a)
	}
	if _, ok := bySite["oom_grow"]; ok || s.LiveBytes != 164*mib || s.Why != model.SnapshotOutOfMemory {
		t.Errorf("snapshot live %d, why %q, sites %v: want 164 MiB, out of memory, not the failing call's", s.LiveBytes, s.Why, bySite)
	}

	files, _ := filepath.Glob(filepath.Join(prof, strconv.Itoa(pid)+"-gpu-oom-*.pb.gz"))
	if len(files) != 1 || s.Profile != files[0] {
		t.Fatalf("snapshot profiles %v, the evidence names %q", files, s.Profile)
	}
	readProfile(t, files[0])
	for fn, want := range map[string]string{"oom_weights": "64MB", "oom_activations": "100MB"} {
		if flat, _ := topValue(t, files[0], "inuse_space", fn); flat != want {
			t.Errorf("go tool pprof -top: %s holds %q, want %s", fn, flat, want)
		}
	}

	dom := string(testutil.Headless(t, browser, page, "--dump-dom"))
	i := strings.Index(dom, `data-flame="gpu_failure"`)
	if i < 0 {
		t.Fatal("the page has no flame graph of the memory at the failure")
	}
	if fl := dom[i:]; !strings.Contains(fl[:strings.Index(fl, "</figure>")], "oom_activations") {
		t.Error("the failure's flame graph does not name oom_activations")
	}
}
