package socktrack

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

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
}

type seen struct {
	state uint8
	since time.Time
}

// Track starts tracking pid: the filter first, so that its connect, listen
// and accept calls are seen, then its TCP socket inodes, so that the kernel
// recognises sockets it already held.
func (t *Tracker) Track(pid int) error {
	if err := t.maps.TrackedPids.Update(uint32(pid), uint8(1), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	st := &procState{seen: map[uint64]seen{}, inodes: map[uint64]bool{}}
	t.pids[pid] = st
	kernel, err := t.kernelTable()
	if err == nil {
		_, err = t.sample(pid, st, kernel, map[string]map[uint64]procinfo.Socket{})
	}
	if err != nil {
		t.Untrack(pid)
		return fmt.Errorf("tracking pid %d: %w", pid, err)
	}
	return nil
}

// Untrack stops tracking pid and drops all its kernel state.
func (t *Tracker) Untrack(pid int) {
	_ = t.maps.TrackedPids.Delete(uint32(pid))
	if st := t.pids[pid]; st != nil {
		for ino := range st.inodes {
			_ = t.maps.SockInodes.Delete(ino)
		}
	}
	delete(t.pids, pid)
	_ = bpfobj.DeleteWhere(t.maps.SockTable, func(_ uint64, info sockSockInfo) bool { return info.Tgid == uint32(pid) })
}

// Poll returns a sample for each pid in pids that is tracked and could be
// read; a process that cannot be read (it exited) is left out. It also hands
// the kernel the TCP socket inodes each process holds now.
func (t *Tracker) Poll(pids []int) (map[int]*Sample, error) {
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
		if s, err := t.sample(pid, st, kernel, tables); err == nil {
			out[pid] = s
		}
	}
	if t.diag != nil {
		t.diag.sweep()
	}
	return out, nil
}

// sample reads the sockets of pid, dates its TCP sockets from the
// kernel table where it has them, and updates what user space remembers.
func (t *Tracker) sample(pid int, st *procState, kernel map[uint64]sockSockInfo, tables map[string]map[uint64]procinfo.Socket) (*Sample, error) {
	fds, err := t.proc.FDs(pid)
	if err != nil {
		return nil, err
	}
	ns, err := netns(t.procRoot, pid)
	if err != nil {
		return nil, err
	}
	tcp := tables[ns]
	if tcp == nil {
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
	}
	nowWall, nowMono := time.Now(), monoNow()
	s := &Sample{ByKind: map[string]int{}}
	held := map[uint64]bool{}
	for _, sfd := range sockets(fds) {
		ino := sfd.inode
		row, ok := tcp[ino]
		if !ok {
			if proto, err := t.proc.SockProto(pid, sfd.num); err == nil {
				s.ByKind[sockKind(proto)]++
			}
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

// kernelTable reads the kernel's claimed sockets, by inode.
func (t *Tracker) kernelTable() (map[uint64]sockSockInfo, error) {
	out := map[uint64]sockSockInfo{}
	var (
		key  uint64
		info sockSockInfo
	)
	it := t.maps.SockTable.Iterate()
	for it.Next(&key, &info) {
		if info.Inode != 0 {
			out[info.Inode] = info
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading socket table: %w", err)
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

// monoNow reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
func monoNow() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}
