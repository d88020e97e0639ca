package socktrack

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// sockKind classifies a socket fd that is not in the TCP tables by the
// protocol sockfs names for it (procinfo.SockProto). The UDP and unix
// tables under /proc/net would miss sockets: an unbound UDP socket is
// listed nowhere.
func sockKind(proto string) string {
	switch {
	case strings.HasPrefix(proto, "TCP"): // TCP, TCPv6; not yet bound, so not listed
		return "tcp"
	case strings.HasPrefix(proto, "UDP"): // UDP, UDPv6, UDP-Lite
		return "udp"
	case strings.HasPrefix(proto, "UNIX"): // UNIX, or UNIX-STREAM etc. on newer kernels
		return "unix"
	}
	return "other"
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
		if ino, ok := fd.SocketInode(); ok {
			out = append(out, sockFD{fd.Num, ino})
		}
	}
	return out
}
