package procinfo

import (
	"errors"
	"maps"
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Tables as the kernel writes them (header, then one line per socket).
const (
	tcpTable = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5001 1 0000000000000000 100 0 0 10 0
   1: 0200000A:C350 0900000A:1538 08 00000000:00000001 00:00000000 00000000     0        0 5002 1 0000000000000000 20 4 0 10 -1
   2: 0200000A:C34F 0900000A:1538 06 00000000:00000000 03:00000D05 00000000     0        0 0 3 0000000000000000
`
	tcp6Table = `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: B80D0120000000000000000001000000:1F90 B80D0120000000000000000007000000:A028 01 00000000:00000000 00:00000000 00000000     0        0 5003 1 0000000000000000 20 4 0 10 -1
   1: 0000000000000000FFFF00000200000A:1F90 0000000000000000FFFF00000700000A:A029 01 00000000:00000000 00:00000000 00000000     0        0 5004 1 0000000000000000 20 4 0 10 -1
`
	udpTable = `   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
15224: 0200000A:9C40 3500000A:0035 01 00000000:00000000 00:00000000 00000000     0        0 5005 2 0000000000000000 0
`
	unixTable = `Num       RefCount Protocol Flags    Type St Inode Path
0000000000000000: 00000002 00000000 00010000 0001 01 5006 /run/app.sock
0000000000000000: 00000003 00000000 00000000 0001 03 5007
0000000000000000: 00000002 00000000 00000000 0002 01 5008 @app-notify
`
)

func TestSockets(t *testing.T) {
	p := worker
	// No udp6: a kernel without IPv6 has no such table.
	p.net = map[string]string{"tcp": tcpTable, "tcp6": tcp6Table, "udp": udpTable, "unix": unixTable}
	bare := fakeProc{pid: 101, comm: "bare", state: "S", ppid: 1, nofile: "1024"}
	fs := newFixture(t, p, bare)

	tcp := map[uint64]Socket{
		5001: {Proto: "TCP", Local: "0.0.0.0:8080", Remote: "0.0.0.0:0", State: 10},
		5002: {Proto: "TCP", Local: "10.0.0.2:50000", Remote: "10.0.0.9:5432", State: 8},
		5003: {Proto: "TCP", Local: "[2001:db8::1]:8080", Remote: "[2001:db8::7]:41000", State: 1},
		// IPv4 on a dual-stack socket reads as IPv4, as sock_diag's does.
		5004: {Proto: "TCP", Local: "10.0.0.2:8080", Remote: "10.0.0.7:41001", State: 1},
	}
	got, err := fs.TCPSockets(p.pid)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, tcp) {
		t.Errorf("TCPSockets =\n%v\nwant\n%v", got, tcp)
	}

	all := maps.Clone(tcp)
	all[5005] = Socket{Proto: "UDP", Local: "10.0.0.2:40000", Remote: "10.0.0.53:53", State: 1}
	all[5006] = Socket{Proto: "unix", Local: "/run/app.sock"}
	all[5007] = Socket{Proto: "unix"}
	all[5008] = Socket{Proto: "unix", Local: "@app-notify"}
	if got, err = fs.Sockets(p.pid); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(got, all) {
		t.Errorf("Sockets =\n%v\nwant\n%v", got, all)
	}
	if name := got[5002].StateName(); name != "CLOSE_WAIT" {
		t.Errorf("state 8 named %q", name)
	}

	if got, err := fs.Sockets(bare.pid); err != nil || len(got) != 0 {
		t.Errorf("no tables: %v, %v", got, err)
	}
	if _, err := fs.Sockets(999); !errors.Is(err, ErrNoProcess) {
		t.Errorf("missing process: %v", err)
	}
}

func TestSocketInode(t *testing.T) {
	for target, want := range map[string]uint64{"socket:[12345]": 12345, "pipe:[12345]": 0, "socket:[x]": 0, "/tmp/socket:[1]": 0} {
		ino, ok := FD{Target: target}.SocketInode()
		if ino != want || ok != (want != 0) {
			t.Errorf("SocketInode(%q) = %d, %v", target, ino, ok)
		}
	}
}

// The readers against the running kernel, with this process's sockets.
func TestRealSockets(t *testing.T) {
	fs := realFS(t)
	pid := os.Getpid()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skipf("no loopback TCP here: %v", err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	u, err := net.Dial("udp", "127.0.0.1:53") // connected, nothing sent
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	path := filepath.Join(t.TempDir(), "s.sock")
	ul, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	unbound, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(unbound)

	fds, err := fs.FDs(pid, nil)
	if err != nil {
		t.Fatal(err)
	}
	socks, err := fs.Sockets(pid)
	if err != nil {
		t.Fatal(err)
	}
	want := map[Socket]bool{
		{Proto: "TCP", Local: ln.Addr().String(), Remote: "0.0.0.0:0", State: 10}:                true,
		{Proto: "TCP", Local: c.LocalAddr().String(), Remote: c.RemoteAddr().String(), State: 1}: true,
		{Proto: "UDP", Local: u.LocalAddr().String(), Remote: "127.0.0.1:53", State: 1}:          true,
		{Proto: "unix", Local: path}: true,
	}
	for _, fd := range fds {
		ino, ok := fd.SocketInode()
		if !ok {
			continue
		}
		s, listed := socks[ino]
		delete(want, s)
		if fd.Num == unbound {
			if listed {
				t.Errorf("unbound UDP socket listed: %+v", s)
			}
			if proto, err := fs.SockProto(pid, fd.Num); err != nil || proto != "UDP" {
				t.Errorf("SockProto(unbound UDP) = %q, %v", proto, err)
			}
		}
	}
	for s := range want {
		t.Errorf("socket not read: %+v", s)
	}
	if _, err := fs.SockProto(pid, 1<<20); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("SockProto of no fd: %v", err)
	}
}
