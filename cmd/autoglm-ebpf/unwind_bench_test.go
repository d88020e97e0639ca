package main

import (
	encbinary "encoding/binary"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// opensScript opens files the same ways, from the same lines, in every
// process running it: os.open, open(), a directory listing, a pipe, a
// socket and an SQLite database (opened by libsqlite3, which the import
// after SIGUSR1 loads: a library dlopen'ed after the process was tracked),
// N times, once SIGUSR1 comes; then it waits to be killed.
const opensScript = `
import os, signal, socket, sys
n, db = int(sys.argv[1]), sys.argv[2]
def opens():
    os.close(os.open("/dev/null", os.O_RDONLY))
    with open("/etc/hostname", "rb") as f:
        f.read()
    os.listdir("/")
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    socket.socket().close()
    sqlite3.connect(db).close()
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
print("ready", flush=True)
signal.sigwait([signal.SIGUSR1])
import sqlite3
for _ in range(n):
    opens()
print("done", flush=True)
signal.sigwait([signal.SIGUSR1])
`

// BenchmarkUnwindByFile measures what the fd view's stack unwinding costs
// with 1 and with 32 Python processes of one interpreter doing the same
// opens (opensScript): the unwind rules and code mapping blocks in the
// kernel and their memory, the unwind requests user space served (each a
// copy of the stack through the ring buffer), those the full ring kept
// from being sent (their stacks cut short) and the agent's CPU. The
// agent is this tree's, or the binary AUTOGLM_BENCH_BIN names (another
// commit's, for a before and after in one session). Three rounds,
// alternating the two sizes.
//
//	go test -run '^$' -bench UnwindByFile -benchtime 1x ./cmd/autoglm-ebpf
func BenchmarkUnwindByFile(b *testing.B) {
	testutil.RequireRoot(b)
	if _, err := os.Stat(testutil.DebianPython); err != nil {
		b.Skipf("%s: %v", testutil.DebianPython, err)
	}
	bin := binary
	if env := os.Getenv("AUTOGLM_BENCH_BIN"); env != "" {
		bin = env
	}
	results := map[int][]unwindRun{}
	for round := range 3 {
		for _, n := range []int{1, 32} {
			r := unwindRound(b, bin, n)
			fmt.Fprintf(os.Stderr, "round %d, %d processes: %+v\n", round+1, n, r)
			results[n] = append(results[n], r)
		}
	}
	for _, n := range []int{1, 32} {
		rs := results[n]
		med := func(f func(unwindRun) float64) float64 {
			xs := make([]float64, len(rs))
			for i, r := range rs {
				xs[i] = f(r)
			}
			slices.Sort(xs)
			return xs[len(xs)/2]
		}
		name := strconv.Itoa(n) + "procs"
		b.ReportMetric(med(func(r unwindRun) float64 { return float64(r.rules) }), name+"-rules")
		b.ReportMetric(med(func(r unwindRun) float64 { return float64(r.blocks) }), name+"-mapping-blocks")
		b.ReportMetric(med(func(r unwindRun) float64 { return float64(r.unwindBytes) }), name+"-unwind-maps-bytes")
		b.ReportMetric(med(func(r unwindRun) float64 { return float64(r.stacksBytes) }), name+"-stacks-view-bytes")
		b.ReportMetric(med(func(r unwindRun) float64 { return float64(r.requests) }), name+"-requests")
		b.ReportMetric(med(func(r unwindRun) float64 { return float64(r.ringBytes) }), name+"-request-bytes")
		b.ReportMetric(med(func(r unwindRun) float64 { return r.ringFull }), name+"-requests-ring-full")
		b.ReportMetric(med(func(r unwindRun) float64 { return r.workCPU }), name+"-cpu-s-workload")
		b.ReportMetric(med(func(r unwindRun) float64 { return r.totalCPU }), name+"-cpu-s-total")
	}
}

// unwindRun is what one round measured, after the workload.
type unwindRun struct {
	rules, blocks          int     // entries of unwind_rules and unwind_mappings
	unwindBytes            uint64  // the kernel's memlock of those two maps
	stacksBytes            float64 // autoglm_bpf_memory_bytes{view="stacks"}
	requests, ringBytes    uint64  // requests sent through unwind_requests, and their bytes
	ringFull               float64 // requests not sent, the ring full: stacks cut short (fd_ringbuf)
	workCPU, totalCPU      float64 // the agent's user+sys seconds: from the signal on, and all
	watchTime, workloadDur time.Duration
	lost                   []string // autoglm_bpf_events_lost_total series that are not 0
}

func unwindRound(b *testing.B, bin string, n int) unwindRun {
	dir := b.TempDir()
	var procs []*testutil.Proc
	var pids []string
	for i := range n {
		p := testutil.StartProc(b, nil, testutil.DebianPython, "-c", opensScript, "200", filepath.Join(dir, strconv.Itoa(i)+".db"))
		procs = append(procs, p)
		pids = append(pids, strconv.Itoa(p.Cmd.Process.Pid))
	}
	addr := testutil.FreeAddr(b)
	began := time.Now()
	agent := exec.Command(bin, "attach", "--pid", strings.Join(pids, ","), "--web.listen-address", addr)
	agent.Stderr = os.Stderr
	if err := agent.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = agent.Process.Signal(os.Interrupt); _ = agent.Wait() }()
	var run unwindRun
	testutil.Eventually(b, 60*time.Second, "every process watched by the fd view", func() bool {
		body := scrapeText(addr)
		for _, pid := range pids {
			if !strings.Contains(body, `autoglm_open_fds{comm="python3.11",pid="`+pid+`"}`) {
				return false
			}
		}
		return true
	})
	run.watchTime = time.Since(began)
	cpu0 := cpuSeconds(b, agent.Process.Pid)
	t0 := time.Now()
	for _, p := range procs {
		p.Signal(b)
	}
	for _, p := range procs {
		p.Wait(b, "done", 5*time.Minute)
	}
	run.workloadDur = time.Since(t0)
	// The last requests are answered within milliseconds; a poll reads
	// the sites.
	time.Sleep(2 * time.Second)
	run.workCPU = cpuSeconds(b, agent.Process.Pid) - cpu0
	run.totalCPU = cpuSeconds(b, agent.Process.Pid)
	for _, line := range strings.Split(scrapeText(addr), "\n") {
		if v, ok := strings.CutPrefix(line, `autoglm_bpf_memory_bytes{view="stacks"} `); ok {
			run.stacksBytes, _ = strconv.ParseFloat(v, 64)
		}
		if v, ok := strings.CutPrefix(line, `autoglm_bpf_events_lost_total{source="fd_ringbuf"} `); ok {
			run.ringFull, _ = strconv.ParseFloat(v, 64)
		}
		if rest, ok := strings.CutPrefix(line, "autoglm_bpf_events_lost_total{"); ok && !strings.HasSuffix(rest, " 0") {
			run.lost = append(run.lost, rest)
		}
	}
	unwindMaps(b, agent.Process.Pid, &run)
	for _, p := range procs {
		_ = p.Cmd.Process.Kill()
	}
	return run
}

func scrapeText(addr string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// unwindMaps reads the unwind maps the agent pid holds (found from its
// fds, so that other BPF users do not count): the entries of the rules and
// of the code mapping trie (absent before it existed) with their memlock;
// the requests sent, from the per-CPU request numbers (unwind_seq: each
// CPU counts the requests it sent); and their bytes, from the request
// ring buffer's producer position (bytes ever written). Maps that every
// commit has, so that any commit's agent is measured alike.
func unwindMaps(b *testing.B, pid int, run *unwindRun) {
	fdinfo := fmt.Sprintf("/proc/%d/fdinfo", pid)
	ents, err := os.ReadDir(fdinfo)
	if err != nil {
		b.Fatal(err)
	}
	seen := map[ebpf.MapID]bool{}
	for _, e := range ents {
		raw, err := os.ReadFile(filepath.Join(fdinfo, e.Name()))
		if err != nil {
			continue
		}
		var id uint64
		for _, line := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(line, "map_id:"); ok {
				id, _ = strconv.ParseUint(strings.TrimSpace(v), 10, 32)
			}
		}
		if id == 0 || seen[ebpf.MapID(id)] {
			continue
		}
		seen[ebpf.MapID(id)] = true
		m, err := ebpf.NewMapFromID(ebpf.MapID(id))
		if err != nil {
			continue
		}
		info, err := m.Info()
		if err != nil {
			m.Close()
			continue
		}
		memlock, _ := info.Memlock()
		switch info.Name {
		case "unwind_rules":
			run.rules = keys(m)
			run.unwindBytes += memlock
		case "unwind_mappings":
			run.blocks = keys(m)
			run.unwindBytes += memlock
		case "unwind_seq":
			var perCPU []uint32
			if err := m.Lookup(uint32(0), &perCPU); err != nil {
				b.Fatal(err)
			}
			for _, n := range perCPU {
				run.requests += uint64(n)
			}
		case "unwind_requests":
			run.ringBytes = producerPos(b, m)
		}
		m.Close()
	}
}

// keys counts the keys of m.
func keys(m *ebpf.Map) int {
	key := make([]byte, m.KeySize())
	n := 0
	err := m.NextKey(nil, &key)
	for err == nil {
		n++
		err = m.NextKey(key, &key)
	}
	return n
}

// producerPos reads a ring buffer's producer position: the page after the
// consumer's, mapped read-only (reading records would take them from the
// agent).
func producerPos(b *testing.B, m *ebpf.Map) uint64 {
	page := os.Getpagesize()
	mem, err := unix.Mmap(m.FD(), int64(page), page, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(mem)
	return encbinary.NativeEndian.Uint64(mem)
}
