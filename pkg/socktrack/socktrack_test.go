package socktrack

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj/bpfobjtest"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/sockleak"
	"github.com/open-autoglm/autoglm-ebpf/pkg/launch"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// judged is the socket concern with the detector the pipeline runs on
// its view.
type judged struct {
	*Concern
	det *sockleak.Detector
}

// Observe fills procs and judges those filled, as a poll of the pipeline
// does.
func (j *judged) Observe(now time.Time, procs []*model.Process) ([]model.Finding, error) {
	return testutil.Judge(now, procs, j.Fill, nil, j.det)
}

func newConcern(t *testing.T) *judged {
	t.Helper()
	testutil.RequireRoot(t)
	c, err := NewConcern(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &judged{Concern: c, det: sockleak.New(sockleak.Config{})}
}

// tcpRows reads /proc/PID/net/tcp{,6} as fields, and the socket inodes
// among the fds of pid.
func tcpRows(t *testing.T, pid int) (rows [][]string, inodes map[string]bool) {
	t.Helper()
	dir := filepath.Join("/proc", strconv.Itoa(pid))
	ents, err := os.ReadDir(filepath.Join(dir, "fd"))
	if err != nil {
		t.Fatal(err)
	}
	inodes = map[string]bool{}
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, "fd", e.Name()))
		if ino, ok := strings.CutPrefix(target, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(filepath.Join(dir, "net", table))
		if table == "tcp6" && errors.Is(err, os.ErrNotExist) {
			continue // IPv6 off
		}
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
			if fields := strings.Fields(sc.Text()); len(fields) > 9 {
				rows = append(rows, fields)
			}
		}
		f.Close()
	}
	return rows, inodes
}

// procCloseWait counts, straight from /proc, the TCP sockets in CLOSE_WAIT
// among the socket fds of pid.
func procCloseWait(t *testing.T, pid int) int {
	t.Helper()
	rows, inodes := tcpRows(t, pid)
	n := 0
	for _, r := range rows {
		if r[3] == "08" && inodes[r[9]] {
			n++
		}
	}
	return n
}

// procServed counts the connections to pid's listening socket that are over
// and waiting out TIME_WAIT on the client's side.
func procServed(t *testing.T, pid int) int {
	t.Helper()
	rows, inodes := tcpRows(t, pid)
	var port string
	for _, r := range rows {
		if r[3] == "0A" && inodes[r[9]] {
			port = r[1][strings.LastIndex(r[1], ":"):]
		}
	}
	n := 0
	for _, r := range rows {
		if port != "" && r[3] == "06" && strings.HasSuffix(r[2], port) {
			n++
		}
	}
	return n
}

func activeLeak(fs []model.Finding) *model.Finding {
	for i, f := range fs {
		if f.Kind == model.KindSocketLeak && f.Active {
			return &fs[i]
		}
	}
	return nil
}

// The leaky server is flagged, its CLOSE_WAIT count growing and matching
// /proc, every CLOSE_WAIT socket dated by the kernel (it was tracked from its
// first instruction, so every accepted socket was claimed at accept), and its
// sockets counted by kind.
func TestLeakyServerFlagged(t *testing.T) {
	c := newConcern(t)
	bin := testutil.Fixture(t, "sockwork")
	g, err := launch.Start([]string{bin, "leaky-server", "10", "120"}, nil, nil, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Abort)
	pid := g.Cmd.Process.Pid
	if err := c.Track(pid); err != nil {
		t.Fatal(err)
	}
	if err := g.Release(); err != nil {
		t.Fatal(err)
	}

	p := &model.Process{PID: pid, Comm: "sockwork"}
	var (
		f             *model.Finding
		counts        []int
		before, after int // /proc's count just before and after the last poll
	)
	for range 30 {
		// Measurement window: a poll interval; the detector judges the
		// CLOSE_WAIT growth per second over its polls.
		time.Sleep(time.Second)
		before = procCloseWait(t, pid)
		fs, err := c.Observe(time.Now(), []*model.Process{p})
		if err != nil {
			t.Fatal(err)
		}
		after = procCloseWait(t, pid)
		counts = append(counts, p.Sock.TCPByState["CLOSE_WAIT"])
		if f = activeLeak(fs); f != nil {
			break
		}
	}
	if f == nil {
		t.Fatalf("leaky server not flagged in 30 s; CLOSE_WAIT counts %v", counts)
	}
	t.Logf("flagged after %d polls: %s", len(counts), f.Summary)

	n := p.Sock.TCPByState["CLOSE_WAIT"]
	if len(counts) < 6 || n <= counts[len(counts)-6] {
		t.Errorf("CLOSE_WAIT count not growing: %v", counts)
	}
	// The server keeps leaking while the poll runs: /proc is read around it.
	if n < before-2 || n > after+2 {
		t.Errorf("CLOSE_WAIT = %d, /proc/%d/net/tcp has %d..%d for its inodes", n, pid, before, after)
	}
	if len(p.Sock.CloseWait) != n {
		t.Errorf("%d CLOSE_WAIT connections listed, %d counted", len(p.Sock.CloseWait), n)
	}
	for i, cw := range p.Sock.CloseWait {
		if i > 0 && cw.Since.Before(p.Sock.CloseWait[i-1].Since) {
			t.Fatalf("CloseWait not oldest first at %d", i)
		}
		if !strings.HasPrefix(cw.Local, "127.0.0.1:") || !strings.HasPrefix(cw.Remote, "127.0.0.1:") {
			t.Fatalf("connection %s <- %s is not on loopback", cw.Local, cw.Remote)
		}
	}
	ev := f.Evidence.(model.SocketLeakEvidence)
	if ev.CloseWait != n || ev.GrowthPerSecond <= 0 {
		t.Errorf("evidence %+v", ev)
	}
	top := ev.TopPairs
	if len(top) == 0 || top[0].Remote != "127.0.0.1:*" || top[0].Local == "127.0.0.1:*" {
		t.Errorf("top_pairs %v, want the listening port against any client port", top)
	}
	if p.Sock.TCPByState["LISTEN"] != 1 {
		t.Errorf("TCP by state %v, want one LISTEN", p.Sock.TCPByState)
	}
	tcp := 0
	for _, k := range p.Sock.TCPByState {
		tcp += k
	}
	if k := p.Sock.ByKind; k["tcp"] != tcp || k["udp"] != 1 || k["unix"] != 2 || k["other"] != 0 {
		t.Errorf("by kind %v, want tcp=%d (every TCP socket) udp=1 unix=2", k, tcp)
	}

	s, err := c.Poll([]int{pid}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cw, dated := 0, 0
	for _, conn := range s[pid].Conns {
		if conn.State == "CLOSE_WAIT" {
			cw++
			if conn.Dated {
				dated++
			}
		}
	}
	if dated < cw-2 {
		t.Errorf("%d of %d CLOSE_WAIT sockets dated by the kernel", dated, cw)
	}
	lost, err := c.Lost()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range lost {
		if v != 0 || !strings.HasPrefix(k, "sock_") {
			t.Errorf("lost %s = %d", k, v)
		}
	}
}

// A server that closes each connection once the client hangs up is quiet,
// while its connections come and go.
func TestHealthyServerQuiet(t *testing.T) {
	c := newConcern(t)
	bin := testutil.Fixture(t, "sockwork")
	cmd := testutil.Start(t, bin, "healthy-server", "20", "120")
	pid := cmd.Process.Pid
	if err := c.Track(pid); err != nil {
		t.Fatal(err)
	}
	p := &model.Process{PID: pid, Comm: "sockwork"}
	served := 0
	for range 20 {
		// Measurement window: 20 poll intervals of a second in which the
		// healthy server must not be flagged.
		time.Sleep(time.Second)
		fs, err := c.Observe(time.Now(), []*model.Process{p})
		if err != nil {
			t.Fatal(err)
		}
		if len(fs) > 0 {
			t.Fatalf("healthy server flagged: %s", fs[0].Summary)
		}
		served = max(served, procServed(t, pid))
	}
	// Quiet because it closes its sockets, not because nothing happened.
	if served == 0 {
		t.Error("the server accepted no connection")
	}
	t.Logf("up to %d served connections in TIME_WAIT at once", served)
	if p.Sock.TCPByState["LISTEN"] != 1 || p.Sock.ByKind["udp"] != 1 || p.Sock.ByKind["unix"] != 2 {
		t.Errorf("by state %v, by kind %v", p.Sock.TCPByState, p.Sock.ByKind)
	}
	if tcp := p.Sock.ByKind["tcp"]; tcp > 5 {
		t.Errorf("%d TCP sockets held by a server that closes them", tcp)
	}
}

// Untrack drops the process's kernel state, and Close unloads every program
// and map.
func TestUntrackAndClose(t *testing.T) {
	testutil.RequireRoot(t)
	c, err := NewConcern(Config{})
	if err != nil {
		t.Fatal(err)
	}
	bin := testutil.Fixture(t, "sockwork")
	cmd := testutil.Start(t, bin, "leaky-server", "20", "30")
	pid := cmd.Process.Pid
	if err := c.Track(pid); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "kernel map entries of a server accepting 20 connections/s", func() bool {
		if _, err := c.Poll([]int{pid}, nil); err != nil {
			t.Fatal(err)
		}
		return testutil.Entries(t, c.maps.SockTable)+testutil.Entries(t, c.maps.SockInodes) > 0
	})
	c.Untrack(pid)
	// Untrack deletes the entries the last poll read; those the kernel made
	// since (the server keeps accepting until its pid leaves tracked_pids)
	// go at the next poll's read, which keeps only tracked owners.
	testutil.Eventually(t, 10*time.Second, "no kernel entries after Untrack and a poll", func() bool {
		if _, err := c.Poll(nil, nil); err != nil {
			t.Fatal(err)
		}
		n := testutil.Entries(t, c.maps.SockTable) + testutil.Entries(t, c.maps.SockInodes) + testutil.Entries(t, c.maps.TrackedPids)
		if n != 0 {
			t.Logf("%d kernel entries left", n)
		}
		return n == 0
	})

	var ids []ebpf.ProgramID
	for _, p := range c.obj.Programs() {
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		ids = append(ids, id)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if p, err := ebpf.NewProgramFromID(id); !errors.Is(err, os.ErrNotExist) {
			if err == nil {
				p.Close()
			}
			t.Errorf("program %d still loaded after Close (err %v)", id, err)
		}
	}
}

// sock_diag and /proc/PID/net/tcp agree on the sockets a process holds,
// and sock_diag leaves out the TIME_WAIT sockets /proc lists.
func TestDiagMatchesProc(t *testing.T) {
	testutil.RequireRoot(t)
	d, err := newDiag("/proc")
	if err != nil {
		t.Fatal(err)
	}
	defer d.close()
	bin := testutil.Fixture(t, "sockwork")
	// The client hangs up first, so its ends of the served connections
	// wait out TIME_WAIT in the same namespace.
	pid := testutil.Start(t, bin, "healthy-server", "50", "30").Process.Pid
	testutil.Eventually(t, 20*time.Second, "served connections in TIME_WAIT", func() bool { return procServed(t, pid) > 0 })
	ns, err := netns("/proc", pid)
	if err != nil {
		t.Fatal(err)
	}
	proc, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	fromProc, err := proc.TCPSockets(pid)
	if err != nil {
		t.Fatal(err)
	}
	fromDiag, err := d.tcp(pid, ns)
	if err != nil {
		t.Fatal(err)
	}
	_, inodes := tcpRows(t, pid)
	held, differ := 0, 0
	for s := range inodes {
		ino, _ := strconv.ParseUint(s, 10, 64)
		p, inProc := fromProc[ino]
		if !inProc {
			continue // not TCP
		}
		held++
		if q, ok := fromDiag[ino]; !ok || q != p {
			differ++ // a connection that changed between the two reads
			t.Logf("inode %d: /proc %+v, sock_diag %+v (present %v)", ino, p, q, ok)
		}
	}
	if held == 0 || differ > 2 {
		t.Errorf("%d of the %d TCP sockets the server holds differ between /proc and sock_diag", differ, held)
	}
	for ino, r := range fromDiag {
		if r.State == tcpTimeWait || r.State == tcpNewSynRecv {
			t.Errorf("sock_diag returned inode %d in state %d", ino, r.State)
		}
	}
	if n := procServed(t, pid); n == 0 {
		t.Error("no TIME_WAIT connection to compare against")
	}
	if len(fromDiag) > len(fromProc)+5 {
		t.Errorf("sock_diag returned %d sockets, /proc %d", len(fromDiag), len(fromProc))
	}
}

// The fallbacks of kernels before 6.1, taken on this one: hash maps
// preallocated, the accepting task read with CO-RE rather than through
// bpf_get_current_task_btf.
func TestOlderKernelFallbacks(t *testing.T) {
	bpfobjtest.OlderKernel(t)
	TestLeakyServerFlagged(t)
}
