package main

import (
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// The daemon exports the memory limit of the cgroup it runs in, beside
// its RSS: started inside a memory cgroup limited to 1 GiB (the v1 memory
// controller's hierarchy where the machine mounts one, v2's elsewhere),
// autoglm_memory_limit_bytes is that limit.
func TestDaemonMemoryLimit(t *testing.T) {
	testutil.RequireRoot(t)
	const limit = 1 << 30
	dir, file := "/sys/fs/cgroup/autoglm-memlimit", "memory.max"
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		dir, file = "/sys/fs/cgroup/memory/autoglm-memlimit", "memory.limit_in_bytes"
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		testutil.Eventually(t, 20*time.Second, "cgroup "+dir+" to be removed", func() bool {
			err := os.Remove(dir)
			return err == nil || errors.Is(err, os.ErrNotExist)
		})
	})
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.Itoa(limit)), 0o644); err != nil {
		t.Fatalf("limiting %s: %v", dir, err)
	}

	d := &daemonProc{addr: testutil.FreeAddr(t), out: &strings.Builder{}}
	d.cmd = exec.Command("sh", append(inCgroup(dir), binary, "daemon", "--web.listen-address", d.addr, "--require-views", "fd")...)
	d.cmd.Stdout, d.cmd.Stderr = d.out, os.Stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.cmd.Process.Kill(); _ = d.cmd.Wait() })
	testutil.Eventually(t, 20*time.Second, "daemon ready", func() bool {
		code, _ := get(d.addr, "/readyz")
		return code == http.StatusOK
	})
	mf := d.scrape(t)
	if s := series(mf, "autoglm_memory_limit_bytes", nil); len(s) != 1 || s[0].GetGauge().GetValue() != limit {
		t.Errorf("autoglm_memory_limit_bytes = %v, want %d", s, limit)
	}
	if s := series(mf, "process_resident_memory_bytes", nil); len(s) != 1 || s[0].GetGauge().GetValue() <= 0 {
		t.Errorf("process_resident_memory_bytes = %v", s)
	}
}
