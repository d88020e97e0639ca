package schedtrack

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// benchSeconds is the measured window of each run; benchRounds how many runs
// of each setup alternate.
const (
	benchSeconds = 3
	benchRounds  = 5
)

// setup is what watches the storm during one run.
type setup struct {
	name   string
	attach func(b *testing.B, pid int) (detach func())
}

// BenchmarkSchedOverhead runs the 4-pair pipe ping-pong (the worst case for
// a sched_switch hook: every message is two switches) untraced, traced by
// this package, with the tracker loaded but not tracking it (the cost every
// other process pays), and the same two ways with a bpftrace one-liner
// counting the same sched_switch events by thread and state. Setups
// alternate within each round, in a rotating order, so that machine drift
// hits all alike. It reports the median messages/s of each and the ratios
// to untraced.
func BenchmarkSchedOverhead(b *testing.B) {
	testutil.RequireRoot(b)
	bin := testutil.Fixture(b, "schedwork", "-pthread")
	setups := []setup{
		{"untraced", func(*testing.B, int) func() { return func() {} }},
		{"traced", attachTracker(true)},
		{"loaded-untracked", attachTracker(false)},
	}
	if bt, err := exec.LookPath("bpftrace"); err == nil {
		setups = append(setups, setup{"bpftrace", attachBpftrace(bt, true)}, setup{"bpftrace-untracked", attachBpftrace(bt, false)})
	} else {
		b.Log("bpftrace not installed: no side-by-side run (scripts/bench-sched.sh installs it)")
	}
	msgs := map[string][]float64{}
	switches := map[string][]float64{}
	for round := range benchRounds {
		for i := range setups {
			s := setups[(i+round)%len(setups)]
			m, sw := runStorm(b, bin, s)
			msgs[s.name] = append(msgs[s.name], m)
			switches[s.name] = append(switches[s.name], sw)
		}
	}
	base := median(msgs["untraced"])
	b.ReportMetric(base, "msgs/s-untraced")
	b.ReportMetric(median(switches["untraced"]), "switches/s-untraced")
	b.ReportMetric(median(switches["traced"]), "switches/s-traced")
	for _, s := range setups[1:] {
		b.ReportMetric(median(msgs[s.name])/base, s.name+"/untraced")
	}
	for _, s := range setups {
		fmt.Fprintf(os.Stderr, "%-18s msgs/s median %8.0f  switches/s median %8.0f  runs %v\n",
			s.name, median(msgs[s.name]), median(switches[s.name]), msgs[s.name])
	}
}

// attachTracker loads the tracker for one run (so that untraced runs have
// nothing attached) and, with track, tracks the storm.
func attachTracker(track bool) func(*testing.B, int) func() {
	return func(b *testing.B, pid int) func() {
		tr, err := New(Config{ProcRoot: "/proc"})
		if err != nil {
			b.Fatal(err)
		}
		if track {
			if err := tr.Track(pid); err != nil {
				b.Fatal(err)
			}
		}
		return func() {
			if track {
				if lost, err := tr.Lost(); err == nil {
					for src, n := range lost {
						if n > 0 {
							b.Logf("%s = %d", src, n)
						}
					}
				}
			}
			tr.Close()
		}
	}
}

// attachBpftrace starts a bpftrace script doing what the tracker's hot path
// does on a switch-out: one per-thread count, filtered by process. Without
// track it filters on a pid above any pid_max, to show what it costs others.
func attachBpftrace(bt string, track bool) func(*testing.B, int) func() {
	return func(b *testing.B, pid int) func() {
		if !track {
			pid = 1<<22 + 1
		}
		prog := fmt.Sprintf(`tracepoint:sched:sched_switch /pid == %d/ { @[tid, args->prev_state] = count(); } BEGIN { printf("attached\n"); }`, pid)
		cmd := exec.Command(bt, "-e", prog)
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		cmd.Stderr = io.Discard // it warns about RLIMIT_MEMLOCK, which it does not need
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		sc := bufio.NewScanner(out)
		for sc.Text() != "attached" {
			if !sc.Scan() {
				_ = cmd.Wait()
				b.Fatalf("bpftrace exited before attaching: %v", cmd.ProcessState)
			}
		}
		return func() {
			_ = cmd.Process.Signal(syscall.SIGINT)
			// Drain the map dump so that bpftrace can exit.
			for sc.Scan() {
			}
			_ = cmd.Wait()
		}
	}
}

// runStorm runs the storm once under s and returns the messages/s and
// switches/s it measured. The storm's window starts only once s is attached.
func runStorm(b *testing.B, bin string, s setup) (msgs, switches float64) {
	b.Helper()
	cmd := exec.Command(bin, "storm", "4", strconv.Itoa(benchSeconds))
	cmd.Env = append(os.Environ(), "SCHEDWORK_WAIT_SIGNAL=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || sc.Text() != "ready" {
		b.Fatalf("schedwork: %q, want ready", sc.Text())
	}
	detach := s.attach(b, cmd.Process.Pid)
	defer detach()
	// Let a tracer that attached asynchronously settle before the window.
	time.Sleep(200 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		b.Fatal(err)
	}
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), " ")
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			continue
		}
		switch k {
		case "messages_per_sec":
			msgs = f
		case "switches_per_sec":
			switches = f
		}
	}
	if msgs == 0 {
		b.Fatalf("%s: schedwork printed no messages_per_sec", s.name)
	}
	return msgs, switches
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
