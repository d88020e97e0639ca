package fdtrack

import (
	"cmp"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// targetsShown is how many groups of leaked fds a finding names.
const targetsShown = 3

// Target is a group of leaked fds that point at the same kind of thing, as
// lsof would show them: files of one directory and extension
// ("/var/cache/tok/*.json"), one file, sockets to one peer or on one port
// ("TCP 10.0.0.2:*->10.0.0.9:5432 (CLOSE_WAIT)"), pipes, eventfds, ...
type Target struct {
	What string
	FDs  int
}

// groupTargets groups what fds point at (describe), most fds first; a
// directory with several files of one extension becomes dir/*.ext, a
// socket that could not be named is "socket".
func groupTargets(links []string) []Target {
	type fileGroup struct{ dir, ext string }
	files := map[fileGroup][]string{}
	counts := map[string]int{}
	for _, l := range links {
		switch {
		case strings.HasPrefix(l, "/"):
			g := fileGroup{path.Dir(l), path.Ext(l)}
			files[g] = append(files[g], l)
		case strings.HasPrefix(l, "socket:"):
			counts["socket"]++
		case strings.HasPrefix(l, "pipe:"):
			counts["pipe"]++
		case strings.HasPrefix(l, "anon_inode:"):
			kind := strings.Trim(strings.TrimPrefix(l, "anon_inode:"), "[]")
			counts[kind]++
		default:
			counts[l]++
		}
	}
	for g, paths := range files {
		slices.Sort(paths)
		if slices.Equal(paths, slices.Repeat(paths[:1], len(paths))) {
			counts[paths[0]] += len(paths) // one file, opened again and again
		} else {
			counts[path.Join(g.dir, "*"+g.ext)] += len(paths)
		}
	}
	out := make([]Target, 0, len(counts))
	for what, n := range counts {
		out = append(out, Target{What: what, FDs: n})
	}
	slices.SortFunc(out, func(a, b Target) int {
		return cmp.Or(cmp.Compare(b.FDs, a.FDs), cmp.Compare(a.What, b.What))
	})
	return out[:min(len(out), targetsShown)]
}

// Annotate names what the fds of an fd leak's opening site point at, read
// from /proc when the finding is made and again whenever the site has
// doubled since (the counts then say how many at that time), not every
// interval: a leak can hold thousands of links. Other findings are left
// as they are.
func (c *Concern) Annotate(p *model.Process, f *model.Finding) {
	if f.Kind != model.KindFDLeak || len(f.Stack) == 0 {
		return
	}
	i := slices.IndexFunc(p.FD.Sites, func(s model.FDSite) bool { return slices.Equal(s.Stack, f.Stack) })
	key := findingKey{p.PID, f.FirstSeen.UnixNano()}
	cached, ok := c.targets[key]
	if i >= 0 && (!ok || len(p.FD.Sites[i].FDs) >= 2*max(cached.fds, 1)) {
		nums := make([]int, len(p.FD.Sites[i].FDs))
		for j, n := range p.FD.Sites[i].FDs {
			nums[j] = int(n)
		}
		if leaked, err := c.proc.FDs(p.PID, nums); err == nil {
			cached = leakRead{groupTargets(describe(c.proc, p.PID, leaked)), len(leaked)}
			c.targets[key] = cached
		}
	}
	targets := cached.targets
	if len(targets) == 0 {
		return
	}
	list := make([]model.LeakedTarget, len(targets))
	parts := make([]string, len(targets))
	for i, t := range targets {
		list[i] = model.LeakedTarget{Target: t.What, FDs: t.FDs}
		parts[i] = fmt.Sprintf("%s (%d)", t.What, t.FDs)
	}
	// Set on a copy: f's evidence may be shared with an earlier snapshot.
	ev, _ := f.Evidence.(model.FDLeakEvidence)
	ev.LeakedTargets = list
	f.Evidence = ev
	f.Summary += "; leaking " + strings.Join(parts, ", ")
}

// describe returns what each of fds points at: its link (/proc/PID/fd), or
// for a socket what lsof would show (socketName). The socket tables of
// pid's network namespace are read here, once, and only when fds has a
// socket: they can be long on a busy host. A socket they do not list is
// named by its protocol (unlisted); one closed since fds were listed keeps
// its link, as do all when the tables cannot be read.
func describe(fs procinfo.FS, pid int, fds []procinfo.FD) []string {
	out := make([]string, len(fds))
	socks := map[int]uint64{} // inode, by index in fds
	for i, fd := range fds {
		out[i] = fd.Target
		if ino, ok := fd.SocketInode(); ok {
			socks[i] = ino
		}
	}
	if len(socks) == 0 {
		return out
	}
	table, err := fs.Sockets(pid)
	if err != nil {
		return out
	}
	// Ports are masked over the sockets, not the fds: a dup'ed socket is
	// one connection.
	var addrs []string
	counted := map[uint64]bool{}
	for _, ino := range socks {
		if s, ok := table[ino]; ok && s.Proto != "unix" && !counted[ino] {
			counted[ino] = true
			addrs = append(addrs, s.Local, s.Remote)
		}
	}
	mask := procinfo.PortMask(addrs)
	for i, ino := range socks {
		if s, ok := table[ino]; ok {
			out[i] = socketName(s, mask)
		} else if proto, err := fs.SockProto(pid, fds[i].Num); err == nil {
			out[i] = unlisted(proto)
		}
	}
	return out
}

// socketName is what lsof shows for a listed socket, its ports masked as
// the socket leak's top_pairs are (procinfo.PortMask), so that a leak's
// connections make one group: "TCP 10.0.0.2:*->10.0.0.9:5432
// (CLOSE_WAIT)" for a client's, "TCP 127.0.0.1:8080->127.0.0.1:*
// (CLOSE_WAIT)" for a server's, "TCP 0.0.0.0:8080 (LISTEN)", "UDP
// 10.0.0.2:*->10.0.0.53:53", "UDP 0.0.0.0:*", "unix /run/app.sock",
// "unix (unnamed)".
func socketName(s procinfo.Socket, mask func(string) string) string {
	if s.Proto == "unix" {
		if s.Local == "" {
			return "unix (unnamed)"
		}
		return "unix " + s.Local
	}
	name := s.Proto + " " + mask(s.Local)
	// Remote port 0: no peer (listening TCP, unconnected UDP).
	if !strings.HasSuffix(s.Remote, ":0") {
		name += "->" + mask(s.Remote)
	}
	if s.Proto == "TCP" {
		name += " (" + s.StateName() + ")"
	}
	return name
}

// unlisted names a socket the tables do not list by the protocol sockfs
// gives it: a TCP socket neither listening nor connected (a failed connect
// leaves one so), a UDP socket never bound, or one of a protocol without a
// table read here ("netlink", "packet", "raw").
func unlisted(proto string) string {
	switch {
	case strings.HasPrefix(proto, "TCP"): // TCP, TCPv6
		return "TCP (unconnected)"
	case strings.HasPrefix(proto, "UDP"): // UDP, UDPv6, UDP-Lite
		return "UDP (unbound)"
	}
	proto, _, _ = strings.Cut(proto, "-") // UNIX-STREAM and the like on newer kernels
	return strings.ToLower(proto)
}

// leakRead is what an fd leak's fds pointed at when last read, and how many
// fds there were then.
type leakRead struct {
	targets []Target
	fds     int
}

// findingKey is one finding of a process, by its first sighting.
type findingKey struct {
	pid       int
	firstSeen int64
}
