package tui

import (
	"fmt"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// switchRate is p's context switches per second since the previous
// snapshot.
func (v *View) switchRate(p *model.Process, now time.Time) string {
	prev, ok := v.prev[p.PID]
	dt := now.Sub(prev.at).Seconds()
	n := p.Sched.Voluntary + p.Sched.Involuntary
	if !ok || dt <= 0 || p.Exited || n < prev.switches {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(n-prev.switches)/dt)
}
