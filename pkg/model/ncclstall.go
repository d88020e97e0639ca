package model

import (
	"fmt"
	"strings"
	"time"
)

// NCCLStragglerEvidence is an nccl_straggler's evidence: the communicators
// in which the process's rank fell behind its peers on this node and
// stopped, and where its threads are.
type NCCLStragglerEvidence struct {
	Communicators []NCCLLag `json:"communicators"`
	// StacksUnavailable says why the threads have no stack (the kernel
	// gives no user registers at a switch: before 5.15); "" when they
	// were taken.
	StacksUnavailable string `json:"stacks_unavailable"`
	// StalledSeconds is how long the rank has made no collective, in the
	// communicator it stalled in longest.
	StalledSeconds float64 `json:"stalled_seconds"`
	// Threads are the process's threads as /proc shows them when the
	// finding was updated, blocked and running ones first.
	Threads []NCCLThread `json:"threads"`
}

// NCCLLag is one communicator a straggling rank lags in.
type NCCLLag struct {
	// Behind is how many collectives the rank is behind its peers'
	// maximum on this node.
	Behind       uint64 `json:"behind"`
	Collectives  uint64 `json:"collectives"`
	Communicator string `json:"communicator"`
	// LastCall is the rank's last collective; nil when it made none.
	LastCall *NCCLCall  `json:"last_call"`
	NRanks   int        `json:"nranks"`
	Peers    []NCCLRank `json:"peers"` // the communicator's other ranks on this node
	Rank     int        `json:"rank"`
}

// NCCLCall is a rank's last collective or point-to-point call.
type NCCLCall struct {
	At    time.Time `json:"at"`
	Op    string    `json:"op"`
	Stack []Frame   `json:"stack"` // its call site, innermost frame first
}

// NCCLRank is one rank of a communicator on this node.
type NCCLRank struct {
	Collectives uint64 `json:"collectives"`
	Comm        string `json:"comm"`
	// LastCall is the rank's last collective; nil when it made none.
	LastCall *NCCLCall `json:"last_call"`
	PID      int       `json:"pid"`
	Rank     int       `json:"rank"`
	// StalledSeconds is how long the rank has made no collective.
	StalledSeconds float64 `json:"stalled_seconds"`
}

// NCCLThread is a thread of a straggling rank's process.
type NCCLThread struct {
	Name string `json:"name"`
	// Stack is where the thread was when it last left the CPU since the
	// rank was suspected, innermost frame first (Python frames merged);
	// empty when not taken.
	Stack []Frame `json:"stack"`
	// State is the thread's scheduler state: running (R: on a CPU or
	// runnable, waiting for one), sleeping (S: waits for an event, a lock,
	// a timer), blocked (D: uninterruptible, mostly I/O), stopped, zombie,
	// or the letter /proc gave.
	State string `json:"state"`
	TID   int    `json:"tid"`
	// WaitChannel is the kernel function a sleeping thread waits in
	// (/proc/PID/task/TID/wchan); "" when running or not known.
	WaitChannel string `json:"wait_channel"`
}

// NCCLHangEvidence is an nccl_hang's evidence: communicators none of whose
// ranks on this node has made a collective for StalledSeconds, all at the
// same count.
type NCCLHangEvidence struct {
	Communicators []NCCLHung `json:"communicators"`
	// StalledSeconds is the shortest stall of the hung communicators'
	// ranks: how long none has progressed.
	StalledSeconds float64 `json:"stalled_seconds"`
}

// NCCLHung is one hung communicator: its ranks on this node.
type NCCLHung struct {
	Collectives  uint64     `json:"collectives"` // each rank's, all equal
	Communicator string     `json:"communicator"`
	NRanks       int        `json:"nranks"`
	Ranks        []NCCLRank `json:"ranks"`
}

func (e NCCLStragglerEvidence) EvidenceKind() string { return KindNCCLStraggler }

func (e NCCLStragglerEvidence) Card(c Card) {
	c.Duration("stalled_seconds", "no collective for", e.StalledSeconds)
	var comms []Row
	for _, l := range e.Communicators {
		var lines []string
		for _, p := range l.Peers {
			lines = append(lines, fmt.Sprintf("peer rank %d: pid %d (%s), %d collectives", p.Rank, p.PID, p.Comm, p.Collectives))
		}
		row := Row{Cells: []Cell{TextCell(l.Communicator), TextCell(fmt.Sprintf("%d of %d", l.Rank, l.NRanks)), CountCell(int(l.Collectives)), CountCell(int(l.Behind)), nil}, Lines: lines}
		if l.LastCall != nil {
			row.Cells[4] = TextCell(l.LastCall.Op)
			row.Stack = l.LastCall.Stack
		}
		comms = append(comms, row)
	}
	c.Table("communicators", "lagging in", []string{"communicator", "rank", "collectives", "behind", "last call"}, comms)
	c.Table("threads", "threads", []string{"tid", "name", "state", "waits in"}, threadRows(e.Threads))
	c.Text("stacks_unavailable", "no thread stacks", e.StacksUnavailable)
}

func threadRows(ts []NCCLThread) []Row {
	var rows []Row
	for _, t := range ts {
		rows = append(rows, Row{Cells: []Cell{CountCell(t.TID), TextCell(t.Name), TextCell(t.State), TextCell(t.WaitChannel)}, Stack: t.Stack})
	}
	return rows
}

func (e NCCLHangEvidence) EvidenceKind() string { return KindNCCLHang }

func (e NCCLHangEvidence) Card(c Card) {
	c.Duration("stalled_seconds", "no collective for", e.StalledSeconds)
	var comms []Row
	for _, h := range e.Communicators {
		var ranks []string
		var stack []Frame
		for _, r := range h.Ranks {
			ranks = append(ranks, fmt.Sprintf("%d (pid %d)", r.Rank, r.PID))
			if stack == nil && r.LastCall != nil {
				stack = r.LastCall.Stack
			}
		}
		comms = append(comms, Row{Cells: []Cell{TextCell(h.Communicator), CountCell(h.NRanks), CountCell(int(h.Collectives)), TextCell(strings.Join(ranks, ", "))}, Stack: stack})
	}
	c.Table("communicators", "hung", []string{"communicator", "ranks", "collectives", "ranks on this node"}, comms)
}

// The evidence of the NCCL view's kinds reads into their structs.
func init() {
	registerEvidence[NCCLStragglerEvidence]()
	registerEvidence[NCCLHangEvidence]()
}
