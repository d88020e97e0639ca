package model

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

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

// Active says whether the process is a rank of a communicator the hooks saw.
func (s *NCCLStats) Active() bool { return len(s.Comms) > 0 }

// ncclRank is the labels of a communicator's series: a handle set up before
// tracking began has no id, rank or size to name, and no series.
func ncclRank(c *NCCLComm) ([]string, bool) {
	if c.ID == "" {
		return nil, false
	}
	return []string{c.ID, strconv.Itoa(c.Rank), strconv.Itoa(c.NRanks)}, true
}

var ncclShown = Shown{
	View: "nccl",
	// Per rank, every process, never summed: the cross-node rule finds
	// the rank whose count lags its communicator's while the others
	// stand still.
	Metrics: []Metric{
		{Name: "autoglm_nccl_collectives_total", Help: "NCCL collective and point-to-point calls of this rank of the communicator since attach, by operation; communicator is a hash of its ncclUniqueId, the same in every rank on every node (rank and nranks -1: a communicator from ncclCommSplit).",
			Type: CounterMetric, Labels: []string{"communicator", "rank", "nranks", "op"}, EveryProcess: true,
			Samples: func(p *Process, add func(float64, ...string)) {
				for i := range p.NCCL.Comms {
					c := &p.NCCL.Comms[i]
					if l, ok := ncclRank(c); ok {
						for op, n := range c.Calls {
							add(float64(n), append(l, op)...)
						}
					}
				}
			}},
		{Name: "autoglm_nccl_last_collective_timestamp_seconds", Help: "When this rank of the communicator last entered an NCCL collective or point-to-point call (Unix time); labels as for autoglm_nccl_collectives_total.",
			Type: GaugeMetric, Labels: []string{"communicator", "rank", "nranks"}, EveryProcess: true,
			Samples: func(p *Process, add func(float64, ...string)) {
				for i := range p.NCCL.Comms {
					c := &p.NCCL.Comms[i]
					if l, ok := ncclRank(c); ok && !c.LastTime.IsZero() {
						add(float64(c.LastTime.UnixNano())/1e9, l...)
					}
				}
			}},
	},
	Columns: []Column{{Head: "NCCL/S", Count: func(p *Process) uint64 {
		var n uint64
		for i := range p.NCCL.Comms {
			n += p.NCCL.Comms[i].Collectives()
		}
		return n
	}}},
	Line: func(p *Process) string {
		if !p.NCCL.Active() {
			return ""
		}
		var parts []string
		for _, c := range p.NCCL.Comms {
			id, rank := c.ID, fmt.Sprintf("rank %d/%d", c.Rank, c.NRanks)
			if id == "" {
				id, rank = "(set up before tracking)", "rank unknown"
			} else if c.NRanks < 0 {
				rank = "rank unknown (split)"
			}
			s := fmt.Sprintf("%s %s: %d collectives", id, rank, c.Collectives())
			if c.LastOp != "" {
				s += fmt.Sprintf(", last %s at %s", c.LastOp, c.LastTime.Format("15:04:05.000"))
			}
			if c.Destroyed {
				s += " (destroyed)"
			}
			parts = append(parts, s)
		}
		return fmt.Sprintf("pid %d (%s) NCCL: %s", p.PID, p.Comm, strings.Join(parts, "; "))
	},
}
