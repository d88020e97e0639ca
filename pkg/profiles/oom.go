package profiles

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/pprof/profile"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
)

// smallerSites stands for a snapshot's sites past its bound
// (model.MaxSnapshotSites), summed: the ones holding least.
const smallerSites = "[smaller call sites]"

// OOMTimeLayout is how a snapshot's time is written in its profile's file
// name and URL: UTC, to the millisecond, without the colons some file
// systems refuse, sorting as it reads (20261205T171620.123Z). Two
// snapshots of a process are at least model.SnapshotEvery apart: the
// millisecond tells them apart.
const OOMTimeLayout = "20060102T150405.000Z"

// AtFailure is the value of the at parameter that asks Live's GPU handler
// for a snapshot's profile rather than the current one.
const AtFailure = "failure"

// OfSnapshot returns the profile of the memory snapshot s of process pid
// (comm): what it held live, by call site, at the instant an allocation
// failed. Only what was known then is in it: inuse_objects and
// inuse_space, as Go's heap profile names them, one sample a site (each
// site's bytes freed after the failure as the numeric label
// freed_after_failure; one without a stack under "[other call sites]"),
// and the sites past the snapshot's bound as one, "[smaller call sites]".
// The failed call, and NVML's figures where known, are comments.
func OfSnapshot(pid int, comm string, s *model.GPUMemorySnapshot) (*profile.Profile, error) {
	if s == nil {
		return nil, errors.New("no snapshot")
	}
	p := &profile.Profile{
		TimeNanos:         s.Time.UnixNano(),
		Period:            1,
		SampleType:        []*profile.ValueType{{Type: "inuse_objects", Unit: "count"}, {Type: "inuse_space", Unit: "bytes"}},
		PeriodType:        &profile.ValueType{Type: "space", Unit: "bytes"},
		DefaultSampleType: "inuse_space",
		Comments:          snapshotComments(pid, comm, s),
	}
	b := newBuilder(GPU, p)
	objects := s.LiveAllocations
	for _, site := range s.Sites {
		objects -= site.Allocations
		sample := b.sample(site.Stack, []int64{int64(site.Allocations), int64(site.Bytes)}, nil)
		if sample != nil && site.FreedAfterBytes > 0 {
			sample.NumLabel = map[string][]int64{"freed_after_failure": {int64(site.FreedAfterBytes)}}
			sample.NumUnit = map[string][]string{"freed_after_failure": {"bytes"}}
		}
	}
	if s.OtherSitesBytes > 0 {
		b.sample([]model.Frame{{Kind: model.FrameNative, Function: smallerSites}}, []int64{int64(max(objects, 0)), int64(s.OtherSitesBytes)}, nil)
	}
	return b.Profile()
}

// snapshotComments say what failed, and what the sites do not: the
// memory NVML sees that the hooks do not, and what the kernel could not
// keep.
func snapshotComments(pid int, comm string, s *model.GPUMemorySnapshot) []string {
	c := []string{
		fmt.Sprintf("GPU memory of pid %d (%s) at its failed allocation, %s: %s of %s failed with %s (%d), %s",
			pid, comm, s.Time.UTC().Format(time.RFC3339Nano), s.API, model.IEC(s.SizeBytes), s.Error, s.Code, s.Why),
		fmt.Sprintf("live at the failure (hooked device memory): %s in %d allocations", model.IEC(s.LiveBytes), s.LiveAllocations),
	}
	if len(s.Stack) > 0 {
		var fr []string
		for _, f := range s.Stack[:min(len(s.Stack), 8)] {
			fr = append(fr, f.String())
		}
		c = append(c, "failed call from: "+strings.Join(fr, " < "))
	}
	if s.FreedAfterBytes > 0 {
		c = append(c, fmt.Sprintf("freed after the failure, before it was read (in the samples): %s", model.IEC(s.FreedAfterBytes)))
	}
	if s.MissedFrees > 0 {
		c = append(c, fmt.Sprintf("frees after the failure the kernel could not keep: %d (as many allocations may be missing)", s.MissedFrees))
	}
	if s.NVMLUsedBytes != nil && s.GapBytes != nil {
		gap := model.IEC(uint64(max(*s.GapBytes, -*s.GapBytes)))
		if *s.GapBytes < 0 {
			gap = "-" + gap
		}
		c = append(c, fmt.Sprintf("NVML: %s used by the process; %s of it not seen by the hooks (CUDA context, libraries' workspaces, unhooked paths), not in the samples",
			model.IEC(*s.NVMLUsedBytes), gap))
	}
	return c
}

// OOMFileName is the name of the profile of pid's snapshot taken at at in
// --pprof's folder: PID-gpu-oom-TIME.pb.gz, TIME as OOMTimeLayout.
func OOMFileName(pid int, at time.Time) string {
	return strconv.Itoa(pid) + "-" + GPU + "-oom-" + at.UTC().Format(OOMTimeLayout) + ".pb.gz"
}

// OOMPath is the URL path, query included, at which Live serves the
// profile of pid's snapshot taken at at:
// /debug/pprof/gpu?pid=PID&at=failure&time=TIME, TIME as OOMTimeLayout.
func OOMPath(pid int, at time.Time) string {
	// None of the values needs escaping.
	return Paths[GPU] + "?pid=" + strconv.Itoa(pid) + "&at=" + AtFailure + "&time=" + at.UTC().Format(OOMTimeLayout)
}

// parseSnapshotTime reads a time parameter: as OOMTimeLayout, or RFC
// 3339. It returns the instant and how precise it is (a millisecond,
// or to the fraction RFC 3339 gave: a second without one): a snapshot
// taken in [at, at+precision) is the one meant.
func parseSnapshotTime(v string) (at time.Time, precision time.Duration, err error) {
	if t, err := time.Parse(OOMTimeLayout, v); err == nil {
		return t, time.Millisecond, nil
	}
	// An unescaped + in a query reads as a space; a time has none.
	v = strings.ReplaceAll(v, " ", "+")
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("time %q: neither %s (as in the profile's file name) nor RFC 3339", v, OOMTimeLayout)
	}
	precision = time.Second
	if i := strings.IndexByte(v, '.'); i >= 0 {
		digits := len(v[i+1:]) - len(strings.TrimLeft(v[i+1:], "0123456789"))
		for range digits {
			precision /= 10
		}
	}
	return t, max(precision, time.Nanosecond), nil
}
