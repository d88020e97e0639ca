// Package profiles turns what the views know of each process's call sites
// into pprof profiles (github.com/google/pprof/profile), the format that
// go tool pprof, Pyroscope and Grafana read: GPU memory as Go's heap
// profile has it (what is held now, what was allocated over the run), fds
// (open now, opened over the run), and the host's waits on the GPU as Go's
// block profile has contention (calls and time waited, by call site).
// Frames come symbolized: native
// ones with their module as mapping, function, and file and line where
// the binary has line tables; Python ones with function, file and line.
package profiles

import (
	"cmp"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/google/pprof/profile"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// Kinds of profile, as file names and URLs spell them.
const (
	GPU  = "gpu"
	FD   = "fd"
	Wait = "wait" // host waits on the GPU, as Go's block profile has contention
)

// unsymbolized stands for the sites whose stacks were not symbolized (past
// the views' bound on sites per process): their values still count.
const unsymbolized = "[other call sites]"

// Builder collects the samples of one profile, from one process or many;
// locations and functions are shared between samples.
type Builder struct {
	kind  string
	p     *profile.Profile
	locs  map[model.Frame]*profile.Location
	funcs map[[3]string]*profile.Function
	maps  map[string]*profile.Mapping
}

// NewBuilder starts a profile of kind (GPU or FD) taken at now.
func NewBuilder(kind string, now time.Time) (*Builder, error) {
	p := &profile.Profile{TimeNanos: now.UnixNano(), Period: 1}
	switch kind {
	case GPU:
		p.SampleType = []*profile.ValueType{
			{Type: "alloc_objects", Unit: "count"}, {Type: "alloc_space", Unit: "bytes"},
			{Type: "inuse_objects", Unit: "count"}, {Type: "inuse_space", Unit: "bytes"},
		}
		p.PeriodType = &profile.ValueType{Type: "space", Unit: "bytes"}
		p.DefaultSampleType = "inuse_space"
	case FD:
		p.SampleType = []*profile.ValueType{{Type: "alloc_objects", Unit: "count"}, {Type: "inuse_objects", Unit: "count"}}
		p.PeriodType = &profile.ValueType{Type: "fds", Unit: "count"}
		p.DefaultSampleType = "inuse_objects"
	case Wait:
		// One sample per site, as Go's block profile has one per
		// contended stack: the calls, and the time waited in them.
		p.SampleType = []*profile.ValueType{{Type: "calls", Unit: "count"}, {Type: "wait", Unit: "nanoseconds"}}
		p.PeriodType = &profile.ValueType{Type: "calls", Unit: "count"}
		p.DefaultSampleType = "wait"
	default:
		return nil, fmt.Errorf("unknown profile kind %q (%s, %s or %s)", kind, GPU, FD, Wait)
	}
	return newBuilder(kind, p), nil
}

func newBuilder(kind string, p *profile.Profile) *Builder {
	return &Builder{kind: kind, p: p, locs: map[model.Frame]*profile.Location{}, funcs: map[[3]string]*profile.Function{}, maps: map[string]*profile.Mapping{}}
}

// Add adds the call sites of process p, each sample labelled with labels
// when given (e.g. pid and comm, for a profile of many processes).
func (b *Builder) Add(p *model.Process, labels map[string]string) {
	label := map[string][]string{}
	for k, v := range labels {
		if v != "" {
			label[k] = []string{v}
		}
	}
	if len(label) == 0 {
		label = nil
	}
	if b.kind == Wait {
		for _, s := range p.CUDA.Waits.Sites {
			// The API is the innermost frame, as the blocking call is in
			// a block profile: one line's two kinds of wait stay apart.
			stack := append([]model.Frame{{Kind: model.FrameNative, Function: s.API}}, s.Stack...)
			if len(s.Stack) == 0 {
				stack = append(stack, model.Frame{Kind: model.FrameNative, Function: unsymbolized})
			}
			b.sample(stack, []int64{int64(s.Calls), int64(math.Round(s.Seconds * 1e9))}, label)
		}
		return
	}
	if b.kind == GPU {
		for _, s := range p.CUDA.Sites {
			alloc, allocBytes := s.AllocCalls, s.AllocBytes
			if alloc == 0 {
				// No counts for the site (a source without them): what it
				// holds is what is known to have gone through it.
				alloc, allocBytes = uint64(len(s.Allocs)), s.Bytes
			}
			b.sample(s.Stack, []int64{int64(alloc), int64(allocBytes), int64(len(s.Allocs)), int64(s.Bytes)}, label)
		}
		return
	}
	for _, sites := range [][]model.FDSite{p.FD.Sites, p.FD.PastSites} {
		for _, s := range sites {
			// Fds open since before attach have no count: at least those.
			opened := max(s.OpenedTotal, uint64(len(s.Opened)))
			b.sample(s.Stack, []int64{int64(opened), int64(len(s.Opened))}, label)
		}
	}
}

// Profile returns the profile built, checked.
func (b *Builder) Profile() (*profile.Profile, error) {
	if err := b.p.CheckValid(); err != nil {
		return nil, err
	}
	return b.p, nil
}

// sample adds a sample of values at stack, and returns it; nil when every
// value is zero (nothing to show).
func (b *Builder) sample(stack []model.Frame, values []int64, label map[string][]string) *profile.Sample {
	nonzero := false
	for _, v := range values {
		nonzero = nonzero || v != 0
	}
	if !nonzero {
		return nil
	}
	if len(stack) == 0 {
		stack = []model.Frame{{Kind: model.FrameNative, Function: unsymbolized}}
	}
	s := &profile.Sample{Value: values, Label: label}
	for _, f := range stack {
		s.Location = append(s.Location, b.location(f))
	}
	b.p.Sample = append(b.p.Sample, s)
	return s
}

// location is f's, made once. A frame without a function is named by its
// text ("libfoo.so+0x1a2b"), so that a flame graph shows where it is.
func (b *Builder) location(f model.Frame) *profile.Location {
	if l, ok := b.locs[f]; ok {
		return l
	}
	l := &profile.Location{ID: uint64(len(b.p.Location) + 1)}
	name, system := f.Function, f.Symbol
	if name == "" {
		name = f.String()
	}
	if system == "" {
		system = name
	}
	if f.Kind == model.FrameNative {
		l.Mapping = b.mapping(f)
		// The ELF address: pprof shows it, and it tells two call
		// instructions of one line apart.
		l.Address = f.Offset
		if f.Module == "" {
			l.Address = f.Address
		}
	}
	l.Line = []profile.Line{{Function: b.function(name, system, f.File), Line: int64(f.Line)}}
	b.p.Location = append(b.p.Location, l)
	b.locs[f] = l
	return l
}

func (b *Builder) function(name, system, file string) *profile.Function {
	k := [3]string{name, system, file}
	if fn, ok := b.funcs[k]; ok {
		return fn
	}
	fn := &profile.Function{ID: uint64(len(b.p.Function) + 1), Name: name, SystemName: system, Filename: file}
	b.p.Function = append(b.p.Function, fn)
	b.funcs[k] = fn
	return fn
}

// mapping is the file f lies in: its path as the process names it (the
// module's base name where the path is not known, as in reports written
// before paths were kept) and its build-id; nil for frames outside any
// file. Its functions and lines come with the frames: pprof must not
// symbolize them again.
func (b *Builder) mapping(f model.Frame) *profile.Mapping {
	if f.Module == "" {
		return nil
	}
	file := cmp.Or(f.Path, f.Module)
	key := file + "\x00" + f.BuildID
	if m, ok := b.maps[key]; ok {
		return m
	}
	m := &profile.Mapping{ID: uint64(len(b.p.Mapping) + 1), File: file, BuildID: f.BuildID, HasFunctions: true, HasFilenames: true, HasLineNumbers: true, HasInlineFrames: true}
	b.p.Mapping = append(b.p.Mapping, m)
	b.maps[key] = m
	return m
}

// Labels are the per-sample labels of p in a profile of many processes:
// pid and comm, and where known its pod, namespace and container.
func Labels(p *model.Process) map[string]string {
	return map[string]string{
		"pid":       strconv.Itoa(p.PID),
		"comm":      p.Comm,
		"pod":       p.Pod.Name,
		"namespace": p.Pod.Namespace,
		"container": p.Pod.Container,
	}
}

// Of returns the profile of kind of one process.
func Of(kind string, p *model.Process, now time.Time) (*profile.Profile, error) {
	b, err := NewBuilder(kind, now)
	if err != nil {
		return nil, err
	}
	b.Add(p, nil)
	return b.Profile()
}
