package socktrack

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cilium/ebpf"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
)

// Conn is one TCP socket a process holds.
type Conn struct {
	Inode         uint64
	FD            int    // the process's fd for the socket (its lowest, if several)
	Local, Remote string // ip:port
	State         string
	Since         time.Time // when it entered State
	// Dated is true when Since is the kernel's transition time; else it is
	// the first poll that saw the socket in State (tracking start at the
	// earliest).
	Dated bool
}

// Sample is the socket view of one process at one poll.
type Sample struct {
	Conns  []Conn         // TCP sockets held, one per socket (not per fd)
	ByKind map[string]int // socket fds by kind
}

// procState is what user space remembers about one tracked process.
type procState struct {
	seen   map[uint64]seen // TCP sockets by inode, as of the last poll
	inodes map[uint64]bool // inodes given to the kernel's sock_inodes map
	// The socket fds of the last /proc/PID/fd listing and the FDMark
	// then (marked: there was one); the protocols of its non-TCP sockets,
	// by inode.
	socks  []sockFD
	mark   FDMark
	marked bool
	protos map[uint64]string
}

// FDMark is what the fd view counted of a process's socket fds (opened and
// closed since tracking began, live now): while it stays the same, the
// process holds the socket fds it held, and they are not listed again. A
// process holding 15 000 fds otherwise costs 15 000 readlinks a poll, and
// one leaking files more each poll. Every traced way to gain or lose a
// socket fd (socket, accept, dup*, close, exec, close_range) moves the
// counts; a socket that comes where no tracepoint sees (SCM_RIGHTS) moves
// the live count once the fd view's drift check has taken it in.
type FDMark struct {
	Opened, Closed uint64
	Live           int
}

type seen struct {
	state uint8
	since time.Time
}

// Track starts tracking pid: the filter first, so that its connect, listen
// and accept calls are seen, then its TCP socket inodes, so that the kernel
// recognises sockets it already held. The kernel table is not read: what it
// has of pid (claimed since the filter) dates its sockets from the next
// poll on.
func (t *Tracker) Track(pid int) error {
	if err := t.table.Claim(uint32(pid), t.tracked); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	if err := t.member.Track(uint32(pid), 0, 0); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	st := &procState{seen: map[uint64]seen{}, inodes: map[uint64]bool{}}
	t.pids[pid] = st
	if _, err := t.sample(pid, st, nil, map[string]map[uint64]procinfo.Socket{}, nil); err != nil {
		t.Untrack(pid)
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	return nil
}

// Untrack stops tracking pid and drops its kernel state, the sockets
// claimed since the last poll at the next (see bpfobj.Table).
func (t *Tracker) Untrack(pid int) {
	t.member.Untrack(uint32(pid), 0)
	if st := t.pids[pid]; st != nil {
		for ino := range st.inodes {
			_ = t.maps.SockInodes.Delete(ino)
		}
	}
	delete(t.pids, pid)
	t.table.Forget(uint32(pid))
}

// Poll returns a sample for each pid in pids that is tracked and could be
// read; a process that cannot be read (it exited) is left out. It also hands
// the kernel the TCP socket inodes each process holds now. marks (nil: none)
// are the fd view's, by pid, this poll.
func (t *Tracker) Poll(pids []int, marks map[int]FDMark) (map[int]*Sample, error) {
	kernel, err := t.kernelTable()
	if err != nil {
		return nil, err
	}
	tables := map[string]map[uint64]procinfo.Socket{} // by network namespace, read once per poll
	out := make(map[int]*Sample, len(pids))
	for _, pid := range pids {
		st := t.pids[pid]
		if st == nil {
			continue
		}
		var mark *FDMark
		if m, ok := marks[pid]; ok {
			mark = &m
		}
		if s, err := t.sample(pid, st, kernel, tables, mark); err == nil {
			out[pid] = s
		}
	}
	if t.diag != nil {
		t.diag.sweep()
	}
	return out, nil
}

// sample reads the sockets of pid (its socket fds listed again unless
// mark, when not nil, says they are those of the last listing), dates its TCP sockets
// from the kernel table where it has them, and updates what user space
// remembers. The TCP table of its network namespace is read only if it
// holds sockets: most processes that come and go hold none.
func (t *Tracker) sample(pid int, st *procState, kernel map[uint64]sockSockInfo, tables map[string]map[uint64]procinfo.Socket, mark *FDMark) (*Sample, error) {
	if mark == nil || !st.marked || *mark != st.mark {
		fds, err := t.proc.SocketFDs(pid)
		if err != nil {
			return nil, err
		}
		st.socks, st.marked = sockets(fds), mark != nil
		if mark != nil {
			st.mark = *mark
		}
		protos := map[uint64]string{}
		for _, s := range st.socks {
			if p, ok := st.protos[s.inode]; ok {
				protos[s.inode] = p
			}
		}
		st.protos = protos
	}
	var tcp map[uint64]procinfo.Socket
	if len(st.socks) > 0 {
		var err error
		if tcp, err = t.tcpTable(pid, tables); err != nil {
			return nil, err
		}
	}
	nowWall, nowMono := time.Now(), bpfobj.KtimeNow()
	s := &Sample{ByKind: map[string]int{}}
	held := map[uint64]bool{}
	for _, sfd := range st.socks {
		ino := sfd.inode
		row, ok := tcp[ino]
		if !ok {
			proto, ok := st.protos[ino]
			if !ok {
				var err error
				if proto, err = t.proc.SockProto(pid, sfd.num); err != nil {
					continue
				}
				st.protos[ino] = proto
			}
			s.ByKind[sockKind(proto)]++
			continue
		}
		s.ByKind["tcp"]++
		if held[ino] {
			continue
		}
		held[ino] = true
		c := Conn{Inode: ino, FD: sfd.num, Local: row.Local, Remote: row.Remote, State: row.StateName()}
		prev, ok := st.seen[ino]
		if !ok || prev.state != row.State {
			prev = seen{state: row.State, since: nowWall}
		}
		if k, ok := kernel[ino]; ok && k.State == row.State {
			prev.since = nowWall.Add(-time.Duration(nowMono - k.SinceNs))
			c.Dated = true
		}
		c.Since = prev.since
		st.seen[ino] = prev
		s.Conns = append(s.Conns, c)
	}
	for ino := range st.seen {
		if !held[ino] {
			delete(st.seen, ino)
		}
	}
	t.syncInodes(pid, st, held)
	slices.SortFunc(s.Conns, func(a, b Conn) int {
		return cmp.Or(a.Since.Compare(b.Since), cmp.Compare(a.Inode, b.Inode))
	})
	return s, nil
}

// tcpTable returns the TCP sockets of pid's network namespace, read once
// per namespace per poll (tables).
func (t *Tracker) tcpTable(pid int, tables map[string]map[uint64]procinfo.Socket) (map[uint64]procinfo.Socket, error) {
	ns, err := netns(t.procRoot, pid)
	if err != nil {
		return nil, err
	}
	if tcp := tables[ns]; tcp != nil {
		return tcp, nil
	}
	var tcp map[uint64]procinfo.Socket
	if t.diag != nil {
		tcp, err = t.diag.tcp(pid, ns)
	}
	if t.diag == nil || errors.Is(err, errCannotJoin) {
		tcp, err = t.proc.TCPSockets(pid)
	}
	if err != nil {
		return nil, err
	}
	tables[ns] = tcp
	return tcp, nil
}

// tracked reports whether tgid is tracked: a read of the socket table
// drops the sockets of the others.
func (t *Tracker) tracked(tgid uint32) bool { return t.pids[int(tgid)] != nil }

// kernelTable reads the kernel's claimed sockets of tracked processes, by
// inode.
func (t *Tracker) kernelTable() (map[uint64]sockSockInfo, error) {
	table, err := t.table.Read(t.tracked)
	if err != nil {
		return nil, fmt.Errorf("reading socket table: %w", err)
	}
	out := map[uint64]sockSockInfo{}
	for _, g := range table {
		for _, e := range g {
			if e.Val.Inode != 0 {
				out[e.Val.Inode] = e.Val
			}
		}
	}
	return out, nil
}

// syncInodes makes the kernel's sock_inodes entries of pid the TCP inodes it
// holds now.
func (t *Tracker) syncInodes(pid int, st *procState, held map[uint64]bool) {
	for ino := range st.inodes {
		if !held[ino] {
			_ = t.maps.SockInodes.Delete(ino)
			delete(st.inodes, ino)
		}
	}
	for ino := range held {
		if st.inodes[ino] {
			continue
		}
		if err := t.maps.SockInodes.Update(ino, uint32(pid), ebpf.UpdateAny); err != nil {
			t.inodesFailed++ // map full: this socket is dated by polling only
			continue
		}
		st.inodes[ino] = true
	}
}

// errorNames are the kernel error counters the socket object uses (enum
// err_kind in bpf/common.h).
var errorNames = map[sockErrKind]string{
	sockErrKindERR_TABLE_FULL:  "sock_table_full",
	sockErrKindERR_READ_KERNEL: "sock_read_kernel",
}

// Memory is the kernel memory of the object's maps and programs now.
func (t *Tracker) Memory() uint64 { return t.obj.Memory() }

// Lost returns the BPF error counters (monotonic since load), by source name,
// and the socket inodes that could not be handed to the kernel.
func (t *Tracker) Lost() (map[string]uint64, error) {
	out, err := bpfobj.Counters(t.maps.Errors, errorNames)
	if err != nil {
		return nil, fmt.Errorf("reading error counters: %w", err)
	}
	out["sock_inodes_update"] = t.inodesFailed
	return out, nil
}
