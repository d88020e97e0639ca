package main

import (
	"net/http"
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

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// topValue runs go tool pprof -top with sample index idx on file and
// returns the flat and cumulative values it gives fn, as printed ("18GB",
// "120"); "" when fn is not listed.
func topValue(t *testing.T, file, idx, fn string) (flat, cum string) {
	t.Helper()
	out, err := exec.Command("go", "tool", "pprof", "-top", "-sample_index="+idx, file).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof -top %s: %v\n%s", file, err, out)
	}
	// "      18GB 99.57% 99.57%       18GB 99.57%  burst_step"
	re := regexp.MustCompile(`(?m)^\s*(\S+)\s+\S+%\s+\S+%\s+(\S+)\s+\S+%\s+` + regexp.QuoteMeta(fn) + `$`)
	m := re.FindStringSubmatch(string(out))
	if m == nil {
		t.Logf("go tool pprof -top -sample_index=%s %s:\n%s", idx, file, out)
		return "", ""
	}
	return m[1], m[2]
}

// holds reports whether a sample of p with fn on its stack has a positive
// value of type idx.
func holds(p *profile.Profile, idx, fn string) bool {
	i := slices.IndexFunc(p.SampleType, func(st *profile.ValueType) bool { return st.Type == idx })
	if i < 0 {
		return false
	}
	for _, s := range p.Sample {
		if s.Value[i] <= 0 {
			continue
		}
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				if l.Function != nil && l.Function.Name == fn {
					return true
				}
			}
		}
	}
	return false
}

// readProfile parses a profile file as go tool pprof does.
func readProfile(t *testing.T, file string) *profile.Profile {
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

// run --pprof on a loop that leaks 8 MiB of (stand-in) GPU memory from
// leak_step every 100 ms and every 3 s takes and frees 300 × 64 MiB in
// burst_step, and on a Go program leaking files: the profiles parse, and
// go tool pprof lists burst_step's bytes as allocated (alloc_space) and
// leak_step's as held (inuse_space), and main.cacheShard's open fds.
func TestPprofFiles(t *testing.T) {
	testutil.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "profiles") // made by the tool
	rt := testutil.CUDAStubs(t)
	out, code := cli(t, nil, "run", "--pprof", dir, "--", testutil.Fixture(t, "cudawork"), rt, "spike", "7")
	if code != 0 {
		t.Fatalf("exit %d; output:\n%s", code, out)
	}
	gpu, _ := filepath.Glob(filepath.Join(dir, "*-gpu.pb.gz"))
	if len(gpu) != 1 {
		t.Fatalf("GPU profiles %v, want one", gpu)
	}
	p := readProfile(t, gpu[0])
	if p.DefaultSampleType != "inuse_space" || len(p.SampleType) != 4 || p.SampleType[1].Type != "alloc_space" {
		t.Errorf("sample types %v, default %q", p.SampleType, p.DefaultSampleType)
	}
	// A burst at 3 s and one at 6 s, unless the run ends first: 18.75
	// GiB each (pprof's MB are MiB).
	if v, _ := topValue(t, gpu[0], "alloc_space", "burst_step"); v != "19200MB" && v != "38400MB" {
		t.Errorf("burst_step alloc_space %q, want 19200MB or 38400MB", v)
	}
	if v, _ := topValue(t, gpu[0], "inuse_space", "burst_step"); v != "" {
		t.Errorf("burst_step holds %s, want nothing", v)
	}
	if v, _ := topValue(t, gpu[0], "inuse_space", "leak_step"); !strings.HasSuffix(v, "MB") {
		t.Errorf("leak_step inuse_space %q, want hundreds of MB", v)
	}
	// The JSON report carries the call sites: `report --pprof` writes the
	// same profile from it.
	js := filepath.Join(t.TempDir(), "r.json")
	out, code = cli(t, nil, "run", "--json", js, "--", testutil.Fixture(t, "cudawork"), rt, "spike", "7")
	if code != 0 {
		t.Fatalf("exit %d; output:\n%s", code, out)
	}
	fromReport := t.TempDir()
	if out, code := cli(t, nil, "report", js, "--pprof", fromReport); code != 0 {
		t.Fatalf("report --pprof: exit %d; output:\n%s", code, out)
	}
	gpu, _ = filepath.Glob(filepath.Join(fromReport, "*-gpu.pb.gz"))
	if len(gpu) != 1 {
		t.Fatalf("GPU profiles from the report %v, want one", gpu)
	}
	if v, _ := topValue(t, gpu[0], "alloc_space", "burst_step"); v != "19200MB" && v != "38400MB" {
		t.Errorf("from the report: burst_step alloc_space %q, want 19200MB or 38400MB", v)
	}

	dir = t.TempDir()
	out, code = cli(t, nil, "run", "--pprof", dir, "--", testutil.GoProgram(t, "goleak"), "20", "4")
	if code != 0 {
		t.Fatalf("exit %d; output:\n%s", code, out)
	}
	fd, _ := filepath.Glob(filepath.Join(dir, "*-fd.pb.gz"))
	if len(fd) != 1 {
		t.Fatalf("fd profiles %v, want one", fd)
	}
	readProfile(t, fd[0])
	// The fds are opened below it, in the Go runtime's syscall wrapper.
	_, v := topValue(t, fd[0], "inuse_objects", "main.cacheShard")
	if n, err := strconv.Atoi(v); err != nil || n < 60 || n > 90 {
		t.Errorf("main.cacheShard holds %q fds, want 4 s × 20/s", v)
	}
}

// attach --listen serves the current profiles: go tool pprof reads one
// process's over HTTP, and the profile of all watched processes labels
// each sample with its pid and comm.
func TestPprofHTTP(t *testing.T) {
	testutil.RequireRoot(t)
	target := testutil.Start(t, testutil.GoProgram(t, "goleak"), "20", "60")
	pid := strconv.Itoa(target.Process.Pid)
	addr := attachListening(t, pid, "30s")

	url := "http://" + addr + "/debug/pprof/fd"
	// get returns the profile served at u; nil while none is.
	get := func(u string) *profile.Profile {
		resp, err := http.Get(u)
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil
		}
		p, err := profile.Parse(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	var all *profile.Profile
	testutil.Eventually(t, 20*time.Second, "an fd profile with samples at "+url, func() bool {
		all = get(url)
		return all != nil && len(all.Sample) > 0
	})
	for _, s := range all.Sample {
		if got := s.Label["pid"]; len(got) != 1 || got[0] != pid || s.Label["comm"][0] != "goleak" {
			t.Fatalf("sample labels %v, want pid %s and comm goleak", s.Label, pid)
		}
	}
	// Opened after attach: these fds have their stacks.
	testutil.Eventually(t, 20*time.Second, "fds held by main.cacheShard at "+url+"?pid="+pid, func() bool {
		p := get(url + "?pid=" + pid)
		return p != nil && holds(p, "inuse_objects", "main.cacheShard")
	})
	file := filepath.Join(t.TempDir(), "fd.pb.gz")
	out, err := exec.Command("go", "tool", "pprof", "-proto", "-output", file, url+"?pid="+pid).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool pprof %s?pid=%s: %v\n%s", url, pid, err, out)
	}
	if _, cum := topValue(t, file, "inuse_objects", "main.cacheShard"); cum == "" || cum == "0" {
		t.Errorf("main.cacheShard holds %q fds over HTTP", cum)
	}
	resp, err := http.Get(url + "?pid=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("profile of an unwatched pid: %s, want 404", resp.Status)
	}
}
