package socktrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// sock_diag (INET_DIAG) answers what /proc/PID/net/tcp{,6} does, but the
// kernel filters by state before formatting anything: TIME_WAIT sockets,
// tens of thousands on a busy host and never held by a process (their inode
// is 0), are skipped in the kernel instead of being printed as text and
// parsed here. /proc/net/tcp with 41 k TIME_WAIT lines cost ~115 ms of
// kernel time per read.
//
// Layouts from include/uapi/linux/inet_diag.h and sock_diag.h.
const (
	sockDiagByFamily = 20 // SOCK_DIAG_BY_FAMILY
	reqLen           = 56 // struct inet_diag_req_v2
	msgLen           = 72 // struct inet_diag_msg
	tcpTimeWait      = 6
	tcpNewSynRecv    = 12
	// diagStates asks for every TCP state but TIME_WAIT and NEW_SYN_RECV
	// (request sockets): neither belongs to a process.
	diagStates = (1<<13 - 1) &^ (1<<tcpTimeWait | 1<<tcpNewSynRecv)
)

// diag reads TCP sockets through sock_diag, one netlink socket per network
// namespace (a netlink socket serves the namespace it was created in).
type diag struct {
	procRoot string
	self     string // our own network namespace
	conns    map[string]*netlink.Conn
	used     map[string]bool // namespaces read since the last sweep
	// refused: joining another network namespace (setns) needs
	// CAP_SYS_ADMIN, which a DaemonSet rightly drops; said once.
	refused bool
}

// errCannotJoin: sock_diag cannot be asked inside pid's network namespace;
// its sockets are read from /proc/PID/net instead.
var errCannotJoin = errors.New("sock_diag: cannot join the network namespace (needs CAP_SYS_ADMIN)")

// newDiag checks that the kernel answers sock_diag for TCP (CONFIG_INET_DIAG,
// tcp_diag) with one dump of our own namespace.
func newDiag(procRoot string) (*diag, error) {
	self, err := os.Readlink(filepath.Join(procRoot, "self", "ns", "net"))
	if err != nil {
		return nil, err
	}
	d := &diag{procRoot: procRoot, self: self, conns: map[string]*netlink.Conn{}, used: map[string]bool{}}
	if _, err := d.tcp(os.Getpid(), self); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

// tcp returns the TCP sockets of pid's network namespace ns that a process
// can hold, by inode, as procinfo.FS.TCPSockets reads them from /proc.
func (d *diag) tcp(pid int, ns string) (map[uint64]procinfo.Socket, error) {
	c, err := d.conn(pid, ns)
	if err != nil {
		return nil, err
	}
	d.used[ns] = true
	out := map[uint64]procinfo.Socket{}
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		if err := dump(c, family, out); err != nil {
			// A kernel without IPv6 has no AF_INET6 handler.
			if family == unix.AF_INET6 && errors.Is(err, unix.ENOENT) {
				continue
			}
			return nil, fmt.Errorf("sock_diag: %w", err)
		}
	}
	return out, nil
}

// conn returns the netlink socket of namespace ns, created inside it (through
// /proc/PID/ns/net) on first use.
func (d *diag) conn(pid int, ns string) (*netlink.Conn, error) {
	if c := d.conns[ns]; c != nil {
		return c, nil
	}
	cfg := &netlink.Config{}
	if ns != d.self {
		if d.refused {
			return nil, errCannotJoin
		}
		f, err := os.Open(filepath.Join(d.procRoot, strconv.Itoa(pid), "ns", "net"))
		if err != nil {
			return nil, err
		}
		defer f.Close()
		cfg.NetNS = int(f.Fd())
	}
	c, err := netlink.Dial(unix.NETLINK_SOCK_DIAG, cfg)
	if cfg.NetNS != 0 && errors.Is(err, unix.EPERM) {
		slog.Info("sock_diag cannot join other network namespaces without CAP_SYS_ADMIN: their TCP sockets are read from /proc/PID/net/tcp{,6}", "err", err)
		d.refused = true
		return nil, errCannotJoin
	}
	if err != nil {
		return nil, fmt.Errorf("sock_diag: %w", err)
	}
	d.conns[ns] = c
	return c, nil
}

// dump adds the TCP sockets of one address family to out.
func dump(c *netlink.Conn, family uint8, out map[uint64]procinfo.Socket) error {
	req := make([]byte, reqLen)
	req[0] = family
	req[1] = unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(req[4:], diagStates)
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: sockDiagByFamily, Flags: netlink.Request | netlink.Dump},
		Data:   req,
	})
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if len(m.Data) < msgLen {
			continue
		}
		ino := uint64(binary.NativeEndian.Uint32(m.Data[68:]))
		if ino == 0 {
			continue // orphaned: no process holds it
		}
		out[ino] = procinfo.Socket{
			Proto:  "TCP",
			Local:  diagAddr(m.Data[0], m.Data[8:24], m.Data[4:6]),
			Remote: diagAddr(m.Data[0], m.Data[24:40], m.Data[6:8]),
			State:  m.Data[1],
		}
	}
	return nil
}

// diagAddr formats an inet_diag_sockid address (4 or 16 bytes used of 16)
// and its big-endian port as ip:port, as procinfo does.
func diagAddr(family uint8, ip, port []byte) string {
	a := net.IP(ip[:16])
	if family == unix.AF_INET {
		a = net.IP(ip[:4])
	}
	return net.JoinHostPort(a.String(), strconv.Itoa(int(binary.BigEndian.Uint16(port))))
}

// sweep closes the sockets of namespaces no process was read in since the
// last sweep (their processes exited or moved).
func (d *diag) sweep() {
	for ns, c := range d.conns {
		if !d.used[ns] {
			_ = c.Close()
			delete(d.conns, ns)
		}
	}
	clear(d.used)
}

func (d *diag) close() {
	for ns, c := range d.conns {
		_ = c.Close()
		delete(d.conns, ns)
	}
}
