package socktrack

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// stateName names a state number of /proc/net/tcp's st column and of the
// kernel's sk_state.
func stateName(st uint64) string {
	if st >= 1 && st <= uint64(len(model.TCPStates)) {
		return model.TCPStates[st-1]
	}
	return "UNKNOWN_" + strconv.FormatUint(st, 10)
}

// tcpRow is one TCP socket from /proc/net/tcp{,6}.
type tcpRow struct {
	local, remote string
	state         uint8
}

// readTCP reads the TCP tables of pid's network namespace, by inode, from
// /proc, where sock_diag is missing. A table the kernel does not have (tcp6
// with IPv6 off) is empty.
func readTCP(procRoot string, pid int) (map[uint64]tcpRow, error) {
	fs, err := procfs.NewFS(filepath.Join(procRoot, strconv.Itoa(pid)))
	if err != nil {
		return nil, err
	}
	tcp := map[uint64]tcpRow{}
	// procfs marks these readers deprecated in favour of sock_diag, which
	// is what the tracker uses where the kernel has it.
	for _, read := range []func() (procfs.NetTCP, error){fs.NetTCP, fs.NetTCP6} {
		rows, err := read()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		for _, r := range rows {
			// TIME_WAIT and orphaned sockets have inode 0: no process holds them.
			if r.Inode != 0 {
				tcp[r.Inode] = tcpRow{local: addr(r.LocalAddr, r.LocalPort), remote: addr(r.RemAddr, r.RemPort), state: uint8(r.St)}
			}
		}
	}
	return tcp, nil
}

// sockKind classifies a socket fd that is not in the TCP tables by the
// protocol sockfs names for it. The UDP and unix tables under /proc/net would
// miss sockets: an unbound UDP socket is listed nowhere. ok is false when the
// fd is gone.
func sockKind(procRoot string, pid, fd int) (kind string, ok bool) {
	var buf [32]byte
	n, err := unix.Getxattr(filepath.Join(procRoot, strconv.Itoa(pid), "fd", strconv.Itoa(fd)), "system.sockprotoname", buf[:])
	if err != nil {
		return "", false
	}
	proto := unix.ByteSliceToString(buf[:n])
	switch {
	case strings.HasPrefix(proto, "TCP"): // TCP, TCPv6; not yet bound, so not listed
		return "tcp", true
	case strings.HasPrefix(proto, "UDP"): // UDP, UDPv6, UDP-Lite
		return "udp", true
	case strings.HasPrefix(proto, "UNIX"): // UNIX, or UNIX-STREAM etc. on newer kernels
		return "unix", true
	}
	return "other", true
}

func addr(ip net.IP, port uint64) string {
	return net.JoinHostPort(ip.String(), strconv.FormatUint(port, 10))
}

// netns names the network namespace of pid, so that processes sharing one
// read its tables once per poll.
func netns(procRoot string, pid int) (string, error) {
	return os.Readlink(filepath.Join(procRoot, strconv.Itoa(pid), "ns", "net"))
}

// sockFD is one socket fd of a process.
type sockFD struct {
	num   int
	inode uint64
}

// sockets returns the socket fds among fds.
func sockets(fds []procinfo.FD) []sockFD {
	var out []sockFD
	for _, fd := range fds {
		s, ok := strings.CutPrefix(fd.Target, "socket:[")
		if !ok {
			continue
		}
		if ino, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64); err == nil {
			out = append(out, sockFD{fd.Num, ino})
		}
	}
	return out
}
