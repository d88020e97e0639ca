package nccltrack

import (
	"log/slog"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
)

// Concern is the NCCL view as the pipeline sees it.
type Concern struct {
	*Tracker
	sym *symbolize.Symbolizer
}

// New loads the NCCL BPF object.
func New(cfg Config, sym *symbolize.Symbolizer) (*Concern, error) {
	if cfg.Symbolizer == nil {
		cfg.Symbolizer = sym
	}
	t, err := NewTracker(cfg)
	if err != nil {
		return nil, err
	}
	return &Concern{Tracker: t, sym: sym}, nil
}

// Name is the concern's name in logs and `check`.
func (c *Concern) Name() string { return "nccl" }

// Track starts watching pid and remembers its mappings for symbolization.
func (c *Concern) Track(pid int) error {
	if err := c.Tracker.Track(pid); err != nil {
		return err
	}
	c.sym.Refresh(pid)
	return nil
}

// Fill hooks newly loaded libnccl files and fills the NCCL part of each
// process; it returns them all.
func (c *Concern) Fill(now time.Time, procs []*model.Process) ([]*model.Process, error) {
	pids := make([]int, len(procs))
	for i, p := range procs {
		pids[i] = p.PID
		c.stacks.Refresh(p.PID, now)
		hooked, err := c.Refresh(p.PID)
		if err != nil {
			slog.Debug("rescanning for libnccl", "pid", p.PID, "err", err)
		}
		if hooked {
			c.sym.Refresh(p.PID)
		}
	}
	comms, err := c.Poll(pids)
	if err != nil {
		return nil, err
	}
	for _, p := range procs {
		p.NCCL = model.NCCLStats{Comms: comms[p.PID]}
		if libs := c.Libraries(p.PID); len(libs) > 0 {
			p.NCCL.Library = libs[0]
		}
	}
	return procs, nil
}
