package pyframes

import (
	"strings"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// evalFrame is the native function that runs Python frames (3.10-3.13).
const evalFrame = "_PyEval_EvalFrameDefault"

// Merge places the Python frames py among the native frames (both innermost
// first), as py-spy --native does: each _PyEval_EvalFrameDefault frame of
// the native stack is replaced by the Python frames of that call of the
// evaluation loop (a group of py ending at an EvalEnd frame). Where the
// native stack has fewer such frames than there are groups (its unwind
// stopped early: interpreters built without frame pointers, as Debian's,
// cannot be walked through), the remaining groups follow the native
// frames; so without any, every Python frame comes after the native ones.
// Between two groups, the interpreter's own frames (a Python call through
// C: _PyEval_Vector, function_code_fastcall, ... in 3.10) are left out, so
// that a Python frame's caller is the next Python frame, as py-spy shows it.
func Merge(native []model.Frame, py []Frame) []model.Frame {
	if len(py) == 0 {
		return native
	}
	var groups [][]Frame
	start := 0
	for i, f := range py {
		if f.EvalEnd || i == len(py)-1 {
			groups = append(groups, py[start:i+1])
			start = i + 1
		}
	}
	out := make([]model.Frame, 0, len(native)+len(py))
	g := 0
	interp := "" // the evaluation loop's module once a group is placed
	for _, f := range native {
		if g < len(groups) && strings.HasPrefix(f.Function, evalFrame) {
			for _, p := range groups[g] {
				out = append(out, p.Frame)
			}
			g++
			interp = f.Module
			continue
		}
		if interp != "" && g < len(groups) && f.Module == interp {
			continue
		}
		out = append(out, f)
	}
	for ; g < len(groups); g++ {
		for _, p := range groups[g] {
			out = append(out, p.Frame)
		}
	}
	return out
}
