package report

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/stack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Flame graph ids, the DOM's data-flame.
const (
	FlameGPUHeld  = "gpu_held"  // device memory held at the end, by stack
	FlameGPUBurst = "gpu_burst" // what the largest burst's interval allocated, by stack
	// FlameGPUFailure is device memory live when an allocation failed (a
	// gpu_alloc_failure's snapshot), by stack: one per failure finding
	// with a snapshot, the newest failureFlames.
	FlameGPUFailure = "gpu_failure"
	FlameFDOpen     = "fd_open" // fds open at the end, by stack
)

// failureFlames bounds the snapshot graphs of a process: as many as the
// agent keeps snapshots of it.
const failureFlames = model.MaxSnapshots

// Layout of a flame graph: as wide as the charts, one row per frame.
const (
	flameW        = chartW
	flameRow      = 18
	flameMaxDepth = 40
	flameCharW    = 6.6 // at 11px
)

// flame is an icicle graph drawn as SVG: the whole at the top, each frame
// a box under its caller as wide as its share of the whole.
type flame struct {
	ID     string
	Title  string
	Total  string
	W, H   int
	Boxes  []flameBox
	Hidden int // boxes too narrow to draw
}

type flameBox struct {
	X, Y, W float64
	Label   string // cut to fit; "" when nothing fits
	Title   string // the frame and its value, shown on hover
	Color   string
}

// weighted is a stack, innermost frame first, and its value.
type weighted struct {
	stack []model.Frame
	value uint64
}

type flameNode struct {
	label    string
	frame    model.Frame
	value    uint64
	children []*flameNode
}

// newFlame lays out samples; ok is false when they add up to nothing.
// Frames are merged by function (a Python frame by function, file and
// line), so that the calls of one function from one caller are one box.
func newFlame(id, title string, samples []weighted, text func(uint64) string) (flame, bool) {
	root := &flameNode{label: "all"}
	for _, s := range samples {
		if s.value == 0 {
			continue
		}
		root.value += s.value
		n := root
		for i := len(s.stack) - 1; i >= 0 && len(s.stack)-i <= flameMaxDepth; i-- {
			f := s.stack[i]
			label := stack.Function(f)
			if f.Kind == model.FramePython || f.Line > 0 {
				label = f.String()
			}
			j := slices.IndexFunc(n.children, func(c *flameNode) bool { return c.label == label })
			if j < 0 {
				n.children = append(n.children, &flameNode{label: label, frame: f})
				j = len(n.children) - 1
			}
			n = n.children[j]
			n.value += s.value
		}
	}
	if root.value == 0 {
		return flame{}, false
	}
	fl := flame{ID: id, Title: title, Total: text(root.value), W: flameW}
	depth := 0
	var lay func(n *flameNode, x float64, d int)
	lay = func(n *flameNode, x float64, d int) {
		w := float64(n.value) / float64(root.value) * flameW
		if w < 1 {
			fl.Hidden++
			return
		}
		depth = max(depth, d+1)
		share := 100 * float64(n.value) / float64(root.value)
		b := flameBox{X: x, Y: float64(d * flameRow), W: w - 0.5, Color: flameColor(n, d),
			Title: fmt.Sprintf("%s: %s (%.1f %%)", n.label, text(n.value), share)}
		if fit := int((w - 6) / flameCharW); fit >= 3 {
			b.Label = cut(n.label, fit)
		}
		fl.Boxes = append(fl.Boxes, b)
		slices.SortStableFunc(n.children, func(a, b *flameNode) int { return cmp.Compare(b.value, a.value) })
		for _, c := range n.children {
			lay(c, x, d+1)
			x += float64(c.value) / float64(root.value) * flameW
		}
	}
	lay(root, 0, 0)
	fl.H = depth * flameRow
	return fl, true
}

// flameColor tells frames apart: Python frames, native frames with source
// lines (mostly the program's own code), other native frames.
func flameColor(n *flameNode, depth int) string {
	switch {
	case depth == 0:
		return "#cbd5e1"
	case n.frame.Kind == model.FramePython:
		return "#93c5fd"
	case n.frame.Line > 0:
		return "#fdba74"
	}
	return "#e2e8f0"
}

// cut shortens s to n characters, ending in "…" when cut.
func cut(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// processFlames are the flame graphs of one process: device memory held at
// the end, what its largest burst's interval allocated (the burst
// finding's sites), what was live at its failed allocations (the failure
// findings' snapshots), open fds. findings are the process's; clock writes
// a failure's time as the page does.
func processFlames(p *Process, findings []model.Finding, clock func(time.Time) string) []flame {
	var held, open []weighted
	if s := p.Sites; s != nil {
		for _, g := range s.GPU {
			held = append(held, weighted{g.Stack, g.LiveBytes})
		}
		for _, f := range s.FD {
			open = append(open, weighted{f.Stack, uint64(f.Open)})
		}
	}
	var largest uint64
	var burst []weighted
	for _, f := range findings {
		ev, ok := f.Evidence.(model.GPUAllocBurstEvidence)
		if !ok || ev.LargestBurstBytes <= largest {
			continue
		}
		var ws []weighted
		for _, t := range ev.TopSites {
			if t.Stack != nil {
				ws = append(ws, weighted{t.Stack, t.Bytes})
			}
		}
		if len(ws) > 0 {
			largest, burst = ev.LargestBurstBytes, ws
		}
	}
	fds := func(n uint64) string { return strconv.FormatUint(n, 10) + " fds" }
	type graph struct {
		id, title string
		samples   []weighted
		text      func(uint64) string
	}
	graphs := []graph{
		{FlameGPUHeld, "GPU memory held at the end, by stack", held, bytesText},
		{FlameGPUBurst, "GPU memory allocated in the largest burst's interval, by stack", burst, bytesText},
	}
	for _, s := range failureSnapshots(findings) {
		// The sites past the kept ones weigh on the whole, under no stack.
		ws := []weighted{{nil, s.OtherSitesBytes}}
		for _, site := range s.Sites {
			ws = append(ws, weighted{site.Stack, site.Bytes})
		}
		why := ""
		if s.Why == model.SnapshotOutOfMemory {
			why = " (out of memory)"
		}
		graphs = append(graphs, graph{FlameGPUFailure, fmt.Sprintf("GPU memory live when %s failed%s at %s, by stack", s.API, why, clock(s.Time)), ws, bytesText})
	}
	graphs = append(graphs, graph{FlameFDOpen, "fds open at the end, by stack", open, fds})
	var out []flame
	for _, c := range graphs {
		if fl, ok := newFlame(c.id, c.title, c.samples, c.text); ok {
			out = append(out, fl)
		}
	}
	return out
}

// failureSnapshots are the snapshots of a process's failure findings, the
// newest failureFlames, oldest first.
func failureSnapshots(findings []model.Finding) []*model.GPUMemorySnapshot {
	var out []*model.GPUMemorySnapshot
	for _, f := range findings {
		if ev, ok := f.Evidence.(model.GPUAllocFailureEvidence); ok && ev.Snapshot != nil {
			out = append(out, ev.Snapshot)
		}
	}
	slices.SortStableFunc(out, func(a, b *model.GPUMemorySnapshot) int { return a.Time.Compare(b.Time) })
	return out[max(0, len(out)-failureFlames):]
}
