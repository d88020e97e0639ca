package procinfo

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Socket is one socket of a network namespace as its tables under
// /proc/PID/net list it.
type Socket struct {
	Proto string // "TCP", "UDP" (IPv4 and IPv6 alike) or "unix"
	// Local and Remote are ip:port for TCP and UDP, as net.JoinHostPort
	// writes them; Remote's port is 0 when there is no peer (a listening
	// or unconnected socket). For a unix socket Local is its path ("@name"
	// for an abstract one, "" for an unnamed one; the connecting end of a
	// connection is unnamed) and Remote is empty.
	Local, Remote string
	// State is the st column of TCP and UDP: for TCP the kernel's state
	// number (StateName); for UDP 1 when connected, 7 when not.
	State uint8
}

// StateName names State as the kernel names TCP states ("CLOSE_WAIT").
func (s Socket) StateName() string {
	if s.State >= 1 && int(s.State) <= len(model.TCPStates) {
		return model.TCPStates[s.State-1]
	}
	return "UNKNOWN_" + strconv.Itoa(int(s.State))
}

// SocketInode returns the inode of a socket fd's link ("socket:[12345]"),
// which keys the socket tables; ok is false for other fds.
func (fd FD) SocketInode() (ino uint64, ok bool) {
	s, ok := strings.CutPrefix(fd.Target, "socket:[")
	if !ok {
		return 0, false
	}
	ino, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64)
	return ino, err == nil
}

// TCPSockets returns the TCP sockets (IPv4 and IPv6) of pid's network
// namespace that a process can hold, by inode.
func (fs FS) TCPSockets(pid int) (map[uint64]Socket, error) { return fs.sockets(pid, false) }

// Sockets returns the TCP, UDP and unix sockets of pid's network namespace
// that a process can hold, by inode. Sockets that none of these tables
// list (TCP and UDP ones neither bound nor connected, netlink, packet, raw)
// are named by SockProto.
func (fs FS) Sockets(pid int) (map[uint64]Socket, error) { return fs.sockets(pid, true) }

// sockets reads the TCP tables, and with all the UDP and unix ones too.
func (fs FS) sockets(pid int, all bool) (map[uint64]Socket, error) {
	// pid's directory as a proc root: its net/ holds the tables of the
	// process's network namespace, which need not be ours.
	pfs, err := procfs.NewFS(filepath.Join(fs.root, strconv.Itoa(pid)))
	if err != nil {
		return nil, procErr(pid, err)
	}
	out := map[uint64]Socket{}
	// procfs marks these readers deprecated in favour of sock_diag, which
	// is what socktrack polls with where the kernel has it; /proc is its
	// fallback, and what a finding reads once.
	for _, read := range []func() (procfs.NetTCP, error){pfs.NetTCP, pfs.NetTCP6} {
		rows, err := read()
		if err := addInet(out, "TCP", rows, err); err != nil {
			return nil, procErr(pid, err)
		}
	}
	if !all {
		return out, nil
	}
	for _, read := range []func() (procfs.NetUDP, error){pfs.NetUDP, pfs.NetUDP6} {
		rows, err := read()
		if err := addInet(out, "UDP", rows, err); err != nil {
			return nil, procErr(pid, err)
		}
	}
	un, err := pfs.NetUNIX()
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, procErr(pid, err)
	}
	if un != nil {
		for _, r := range un.Rows {
			out[r.Inode] = Socket{Proto: "unix", Local: r.Path}
		}
	}
	return out, nil
}

// addInet adds the rows of one TCP or UDP table, as read, to out. A table
// the kernel does not have (tcp6 with IPv6 off) is empty.
func addInet[T procfs.NetTCP | procfs.NetUDP](out map[uint64]Socket, proto string, rows T, err error) error {
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, r := range rows {
		// TIME_WAIT and orphaned sockets have inode 0: no process holds them.
		if r.Inode != 0 {
			out[r.Inode] = Socket{Proto: proto, Local: hostPort(r.LocalAddr, r.LocalPort), Remote: hostPort(r.RemAddr, r.RemPort), State: uint8(r.St)}
		}
	}
	return nil
}

func hostPort(ip net.IP, port uint64) string {
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10))
}

// SockProto returns the protocol sockfs names socket fd of pid by ("TCP",
// "UDPv6", "UNIX-STREAM", "NETLINK", ...: the system.sockprotoname
// attribute of /proc/PID/fd/N). It names sockets the tables under
// /proc/PID/net miss: an unbound UDP socket is listed nowhere.
func (fs FS) SockProto(pid, fd int) (string, error) {
	var buf [32]byte
	n, err := unix.Getxattr(filepath.Join(fs.root, strconv.Itoa(pid), "fd", strconv.Itoa(fd)), "system.sockprotoname", buf[:])
	if err != nil {
		// Not procErr: a missing file here is a closed fd.
		return "", fmt.Errorf("pid %d fd %d: %w", pid, fd, err)
	}
	return unix.ByteSliceToString(buf[:n]), nil
}

// PortMask returns how the addresses (ip:port) of a group of sockets are
// shown to group them, as top_pairs and the fd leak's targets do: an
// address that occurs once in addrs has its port shown as "*". Grouping by
// the full 4-tuple would give every connection its own group, since one
// end's port is ephemeral (the client's on a server, ours on a client);
// what is left names the peer a client leaks connections to, or the port
// a server leaks accepted ones on.
func PortMask(addrs []string) func(addr string) string {
	uses := map[string]int{}
	for _, a := range addrs {
		uses[a]++
	}
	return func(addr string) string {
		if uses[addr] > 1 {
			return addr
		}
		if host, _, err := net.SplitHostPort(addr); err == nil {
			return net.JoinHostPort(host, "*")
		}
		return addr
	}
}
