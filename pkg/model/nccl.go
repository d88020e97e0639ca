package model

import "time"

// Finding kinds of the NCCL view.
const (
	// KindNCCLStraggler is a rank of a communicator whose collectives
	// fell behind its peers' and stopped while they wait.
	KindNCCLStraggler = "nccl_straggler"
	// KindNCCLHang is a communicator none of whose ranks progresses.
	KindNCCLHang = "nccl_hang"
)

// NCCLStats is the collectives view of one process: the communicators it is a
// rank of, from the hooks on libnccl.so.2.
type NCCLStats struct {
	Library string     // the libnccl hooked in this process; "" when none
	Comms   []NCCLComm // by ID, then rank
}

// NCCLComm is one communicator as one of its ranks sees it.
type NCCLComm struct {
	// ID names the communicator alike in every rank, on every node: a
	// hash of its ncclUniqueId (for ncclCommSplit, of the parent's and
	// the colour), in hex.
	ID           string
	Rank, NRanks int
	// Calls and Bytes by operation (allreduce, allgather, send, ...)
	// since tracking began (monotonic).
	Calls map[string]uint64
	Bytes map[string]uint64
	// The last collective or point-to-point call: its entry time,
	// operation and call site. Zero time: none yet.
	LastTime  time.Time
	LastOp    string
	LastStack []Frame
	Destroyed bool // ncclCommDestroy or ncclCommAbort was called
}

// Collectives is the communicator's calls of every operation.
func (c *NCCLComm) Collectives() uint64 {
	var n uint64
	for _, v := range c.Calls {
		n += v
	}
	return n
}
