package tui

import (
	"fmt"
	"strings"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// gpuState is the short CUDA state of p for the log line, or "" if p shows
// no CUDA activity.
func gpuState(p *model.Process) string {
	if !p.CUDA.Active() {
		return ""
	}
	return " gpu_live=" + strings.ReplaceAll(iec(p.CUDA.LiveBytes), " ", "")
}

// gpuLine describes p's GPU memory for the live block and the summary, or
// "" if p shows no CUDA activity.
func gpuLine(p *model.Process) string {
	c := &p.CUDA
	if !c.Active() {
		return ""
	}
	s := fmt.Sprintf("pid %d (%s) GPU memory: %s live in %d allocations", p.PID, p.Comm, iec(c.LiveBytes), c.LiveAllocs)
	if c.HasNVML {
		s += fmt.Sprintf(", %s per NVML", iec(c.NVMLUsedBytes))
	}
	if n := len(c.Failures); n > 0 {
		s += fmt.Sprintf(", %d failed allocations", n)
	}
	return s
}

// iec renders a byte count with a binary unit, e.g. "1.5 GiB".
func iec(b uint64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := uint64(unit), 0
	for n := b / unit; n >= unit && exp < 4; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTP"[exp])
}
