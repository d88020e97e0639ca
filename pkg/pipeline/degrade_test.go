package pipeline

import (
	"cmp"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/causes"
	"github.com/open-autoglm/autoglm-ebpf/pkg/gpuoom"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/nvml"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
)

// fakeView is a concern that refuses the pids in refuse, and fails a poll
// that asks it about a process it does not track, as the real ones do.
type fakeView struct {
	name     string
	refuse   map[int]error
	all      error // refuses every process
	tracked  map[int]bool
	observed []int
}

func (v *fakeView) Name() string { return v.name }

func (v *fakeView) Track(pid int) error {
	if err := cmp.Or(v.all, v.refuse[pid]); err != nil {
		return err
	}
	v.tracked[pid] = true
	return nil
}

func (v *fakeView) Untrack(pid int) { delete(v.tracked, pid) }

func (v *fakeView) Fill(_ time.Time, procs []*model.Process) ([]*model.Process, error) {
	for _, pr := range procs {
		if !v.tracked[pr.PID] {
			return nil, errors.New("asked about an untracked process")
		}
		v.observed = append(v.observed, pr.PID)
	}
	return procs, nil
}

func (v *fakeView) Lost() (map[string]uint64, error) { return nil, nil }
func (v *fakeView) Memory() uint64                   { return 0 }
func (v *fakeView) Close() error                     { return nil }

func pipelineOf(t *testing.T, views ...*fakeView) *Pipeline {
	t.Helper()
	proc, err := procinfo.New("/proc")
	if err != nil {
		t.Fatal(err)
	}
	gpu := nvml.New(gonvml.New())
	p := &Pipeline{proc: proc, sym: symbolize.New("/proc"), cache: procinfo.NewPollCache(), gpu: gpu, oom: gpuoom.New(gpuoom.Config{NVML: gpu, Proc: proc}),
		procs: map[int]*model.Process{}, starts: map[int]uint64{}, identified: map[int]bool{}, link: causes.New(causes.DefaultGrace),
		untracked: map[string]map[int]bool{}, trackFailures: map[model.TrackFailure]uint64{}, required: []string{"fd"}}
	for i, v := range views {
		p.concerns = append(p.concerns, ranked{v, i})
	}
	return p
}

// A view that cannot follow a process gives up that process only: the
// others watch it on, the refusal is counted by view and errno, and the
// view is not asked about the process. A refusal by fd, the view the tool
// cannot do without, still refuses the process.
func TestViewRefusalLeavesOthersWatching(t *testing.T) {
	me := os.Getpid()
	fd := &fakeView{name: "fd", tracked: map[int]bool{}}
	sock := &fakeView{name: "sock", tracked: map[int]bool{}, refuse: map[int]error{me: unix.EPERM}}
	p := pipelineOf(t, fd, sock)
	if err := p.Watch(me); err != nil {
		t.Fatalf("a socket view's refusal refused the process: %v", err)
	}
	s, err := p.poll(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fd.observed, []int{me}) || len(sock.observed) != 0 {
		t.Errorf("observed: fd %v, sock %v; want fd [%d], sock none", fd.observed, sock.observed, me)
	}
	if got := s.TrackFailures[model.TrackFailure{View: "sock", Reason: "EPERM"}]; got != 1 || len(s.TrackFailures) != 1 {
		t.Errorf("track failures %v, want sock/EPERM 1", s.TrackFailures)
	}

	fd.refuse = map[int]error{1: unix.EACCES}
	if err := p.Watch(1); err == nil || !strings.HasPrefix(err.Error(), "fd: ") {
		t.Errorf("a process the fd view refuses: %v", err)
	}
	if sock.tracked[1] {
		t.Error("a refused process left tracked in another view")
	}
}
