package fdtrack

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

func TestGroupTargets(t *testing.T) {
	var links []string
	for _, n := range []string{"a", "b", "c", "d"} {
		links = append(links, "/var/cache/tok/"+n+".json")
	}
	links = append(links, "/dev/null", "/dev/null", "/dev/null", "/dev/null", "/dev/null",
		"socket:[101]", "socket:[102]", "pipe:[7]", "anon_inode:[eventfd]", "/etc/hosts")
	got := groupTargets(links)
	want := []Target{{"/dev/null", 5}, {"/var/cache/tok/*.json", 4}, {"socket", 2}}
	if !slices.Equal(got, want) {
		t.Errorf("groupTargets = %v, want %v", got, want)
	}
	if got := groupTargets([]string{"anon_inode:[eventfd]", "anon_inode:[eventfd]", "pipe:[1]"}); !slices.Equal(got, []Target{{"eventfd", 2}, {"pipe", 1}}) {
		t.Errorf("anon kinds: %v", got)
	}
	if got := groupTargets(nil); len(got) != 0 {
		t.Errorf("no links: %v", got)
	}
}

// A leak's sockets named from a fixture proc root (testdata/proc/4242/net,
// in the kernel's format): a client's connections to one database, a
// server's accepted IPv6 connections, connected UDP, unix sockets, and
// sockets the tables do not list (closed since the fds were read).
func TestDescribeSockets(t *testing.T) {
	fs, err := procinfo.New("testdata/proc")
	if err != nil {
		t.Fatal(err)
	}
	fds := []procinfo.FD{
		{Num: 3, Target: "/var/cache/tok/a.json"},
		{Num: 10, Target: "socket:[7101]"},
		{Num: 11, Target: "socket:[7102]"},
		{Num: 12, Target: "socket:[7103]"},
		{Num: 13, Target: "socket:[7104]"},
		{Num: 14, Target: "socket:[7101]"}, // a dup: still one connection
		{Num: 20, Target: "socket:[7201]"},
		{Num: 21, Target: "socket:[7202]"},
		{Num: 22, Target: "socket:[7203]"},
		{Num: 30, Target: "socket:[7401]"},
		{Num: 31, Target: "socket:[7402]"},
		{Num: 32, Target: "socket:[7403]"},
		{Num: 33, Target: "socket:[7404]"},
		{Num: 40, Target: "socket:[7301]"},
		{Num: 41, Target: "socket:[7302]"},
		{Num: 42, Target: "socket:[7300]"},
		{Num: 50, Target: "socket:[7999]"},
		{Num: 51, Target: "socket:[7998]"},
	}
	want := []string{
		"/var/cache/tok/a.json",
		"TCP 10.0.0.2:*->10.0.0.9:5432 (CLOSE_WAIT)",
		"TCP 10.0.0.2:*->10.0.0.9:5432 (CLOSE_WAIT)",
		"TCP 10.0.0.2:*->10.0.0.9:5432 (CLOSE_WAIT)",
		"TCP 10.0.0.2:*->10.0.0.9:5432 (CLOSE_WAIT)",
		"TCP 10.0.0.2:*->10.0.0.9:5432 (CLOSE_WAIT)",
		"TCP [2001:db8::1]:8080->[2001:db8::7]:* (ESTABLISHED)",
		"TCP [2001:db8::1]:8080->[2001:db8::7]:* (ESTABLISHED)",
		"TCP [2001:db8::1]:8080->[2001:db8::7]:* (ESTABLISHED)",
		"unix /run/app.sock",
		"unix /run/app.sock",
		"unix (unnamed)",
		"unix @app-notify",
		"UDP 10.0.0.2:*->10.0.0.53:53",
		"UDP 10.0.0.2:*->10.0.0.53:53",
		"UDP 0.0.0.0:*",
		// In no table, and no fd left to ask sockfs about.
		"socket:[7999]",
		"socket:[7998]",
	}
	got := describe(fs, 4242, fds)
	if !slices.Equal(got, want) {
		t.Errorf("describe =\n%q\nwant\n%q", got, want)
	}
	wantTop := []Target{
		{"TCP 10.0.0.2:*->10.0.0.9:5432 (CLOSE_WAIT)", 5},
		{"TCP [2001:db8::1]:8080->[2001:db8::7]:* (ESTABLISHED)", 3},
		{"UDP 10.0.0.2:*->10.0.0.53:53", 2},
	}
	if top := groupTargets(got); !slices.Equal(top, wantTop) {
		t.Errorf("groupTargets = %v, want %v", top, wantTop)
	}
	if top := groupTargets(got[15:]); !slices.Equal(top, []Target{{"socket", 2}, {"UDP 0.0.0.0:*", 1}}) {
		t.Errorf("unknown sockets: %v", top)
	}

	// No tables to read (the process is gone): every socket keeps its link.
	if got := describe(fs, 4243, fds); !slices.Equal(got, links(fds)) {
		t.Errorf("without tables: %q", got)
	}
}

func links(fds []procinfo.FD) []string {
	out := make([]string, len(fds))
	for i, fd := range fds {
		out[i] = fd.Target
	}
	return out
}

func TestSocketNames(t *testing.T) {
	none := func(addr string) string { return addr }
	for _, tt := range []struct {
		s    procinfo.Socket
		want string
	}{
		{procinfo.Socket{Proto: "TCP", Local: "0.0.0.0:8080", Remote: "0.0.0.0:0", State: 10}, "TCP 0.0.0.0:8080 (LISTEN)"},
		{procinfo.Socket{Proto: "TCP", Local: "[::]:8080", Remote: "[::]:0", State: 10}, "TCP [::]:8080 (LISTEN)"},
		{procinfo.Socket{Proto: "TCP", Local: "10.0.0.2:5000", Remote: "10.0.0.9:5432", State: 2}, "TCP 10.0.0.2:5000->10.0.0.9:5432 (SYN_SENT)"},
		{procinfo.Socket{Proto: "UDP", Local: "0.0.0.0:5353", Remote: "0.0.0.0:0", State: 7}, "UDP 0.0.0.0:5353"},
		{procinfo.Socket{Proto: "unix", Local: "@/tmp/.X11-unix/X0"}, "unix @/tmp/.X11-unix/X0"},
	} {
		if got := socketName(tt.s, none); got != tt.want {
			t.Errorf("socketName(%+v) = %q, want %q", tt.s, got, tt.want)
		}
	}
	for proto, want := range map[string]string{
		"TCP": "TCP (unconnected)", "TCPv6": "TCP (unconnected)", "UDP": "UDP (unbound)", "UDPv6": "UDP (unbound)",
		"NETLINK": "netlink", "PACKET": "packet", "UNIX-STREAM": "unix",
	} {
		if got := unlisted(proto); got != want {
			t.Errorf("unlisted(%q) = %q, want %q", proto, got, want)
		}
	}
}

// The same against this process's own sockets: what the kernel lists for
// accepted connections, and what it lists nowhere (an unbound UDP socket,
// netlink), named through sockfs.
func TestDescribeSelf(t *testing.T) {
	fs, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skipf("no loopback TCP here: %v", err)
	}
	t.Cleanup(func() { ln.Close() })
	mine := map[int]string{}
	keep := func(f *os.File, want string) {
		t.Cleanup(func() { f.Close() })
		mine[int(f.Fd())] = want
	}
	port := ln.Addr().(*net.TCPAddr).Port
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		a, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		f, err := a.(*net.TCPConn).File()
		if err != nil {
			t.Fatal(err)
		}
		keep(f, fmt.Sprintf("TCP 127.0.0.1:%d->127.0.0.1:* (ESTABLISHED)", port))
	}
	path := filepath.Join(t.TempDir(), "app.sock")
	ul, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ul.Close() })
	uc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uc.Close() })
	ua, err := ul.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ua.Close() })
	f, err := ua.(*net.UnixConn).File()
	if err != nil {
		t.Fatal(err)
	}
	keep(f, "unix "+path)
	if f, err = uc.(*net.UnixConn).File(); err != nil {
		t.Fatal(err)
	}
	keep(f, "unix (unnamed)") // the connecting end has no name of its own
	for _, s := range []struct {
		domain, typ, proto int
		want               string
	}{
		{unix.AF_INET, unix.SOCK_DGRAM, 0, "UDP (unbound)"},
		{unix.AF_INET, unix.SOCK_STREAM, 0, "TCP (unconnected)"},
		{unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_ROUTE, "netlink"},
	} {
		fd, err := unix.Socket(s.domain, s.typ|unix.SOCK_CLOEXEC, s.proto)
		if err != nil {
			t.Logf("no %s socket here: %v", s.want, err)
			continue
		}
		keep(os.NewFile(uintptr(fd), s.want), s.want)
	}

	all, err := fs.FDs(os.Getpid(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var fds []procinfo.FD
	for _, fd := range all {
		if _, ok := mine[fd.Num]; ok {
			fds = append(fds, fd)
		}
	}
	got := describe(fs, os.Getpid(), fds)
	for i, fd := range fds {
		if want := mine[fd.Num]; got[i] != want {
			t.Errorf("fd %d (%s) described as %q, want %q", fd.Num, fd.Target, got[i], want)
		}
	}
	if len(fds) != len(mine) {
		t.Errorf("%d of the %d sockets listed", len(fds), len(mine))
	}
}

// An fd leak's targets are read from the leaking site's fds alone: the rest
// of the table, however large, is not read link by link. Here the one fd
// outside the site cannot be read at all (a plain file where /proc has a
// link), so a read of the whole table would fail and name nothing.
func TestLeakedTargetsReadSiteOnly(t *testing.T) {
	root := t.TempDir()
	fdDir := filepath.Join(root, "100", "fd")
	if err := os.MkdirAll(fdDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for num, target := range map[int]string{3: "/var/cache/tok/a.json", 4: "/var/cache/tok/b.json", 5: "/var/cache/tok/c.json"} {
		if err := os.Symlink(target, filepath.Join(fdDir, fmt.Sprint(num))); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(fdDir, "7"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	fs, err := procinfo.New(root)
	if err != nil {
		t.Fatal(err)
	}
	c := &Concern{Tracker: &Tracker{proc: fs}, targets: map[findingKey]leakRead{}}
	stack := []model.Frame{{Function: "leak_tick"}}
	p := &model.Process{PID: 100}
	p.FD.Sites = []model.FDSite{{Stack: stack, FDs: []int32{3, 4, 5}}}
	f := &model.Finding{Kind: model.KindFDLeak, PID: 100, Stack: stack, Evidence: model.FDLeakEvidence{}}
	c.Annotate(p, f)
	want := []model.LeakedTarget{{Target: "/var/cache/tok/*.json", FDs: 3}}
	if got := f.Evidence.(model.FDLeakEvidence).LeakedTargets; !slices.Equal(got, want) {
		t.Errorf("leaked_targets %v, want %v (summary %q)", got, want, f.Summary)
	}
}
