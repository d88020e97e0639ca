package fdtrack

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/symbolize"
	"github.com/open-autoglm/autoglm-ebpf/pkg/testutil"
)

// opener opens and closes /dev/null N times at a Python stack DEPTH frames
// deep, once SIGUSR1 comes, and prints the wall time per pair.
const opener = `
import os, signal, sys, time
n, depth = int(sys.argv[1]), int(sys.argv[2])
def work(d):
    if d > 1:
        return work(d - 1)
    t = time.perf_counter_ns()
    for _ in range(n):
        os.close(os.open("/dev/null", os.O_RDONLY))
    return (time.perf_counter_ns() - t) / n
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
print("ready", flush=True)
signal.sigwait([signal.SIGUSR1])
print("ns_per_op", work(depth), flush=True)
time.sleep(60)
`

// BenchmarkPythonFrames measures what the Python frames cost per tracked
// open, from the kernel's BPF statistics (run_time_ns / run_cnt of the
// sys_exit program, the one that records an open): a Python process whose
// interpreter is known (frames recorded, at several stack depths) and the
// same with its py_procs entry removed (one hash lookup).
//
//	go test -run '^$' -bench PythonFrames ./pkg/fdtrack
func BenchmarkPythonFrames(b *testing.B) {
	testutil.RequireRoot(b)
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatal(err)
	}
	defer stats.Close()
	first := lastProgramID()
	c, err := NewConcern(Config{ProcRoot: "/proc"}, symbolize.New("/proc"), 64)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	prog := exitProgram(b, first)
	const n = 200000
	for _, tc := range []struct {
		name   string
		depth  int
		frames bool
	}{
		{"no-frames/depth-10", 10, false},
		{"frames/depth-2", 2, true},
		{"frames/depth-10", 10, true},
		{"frames/depth-30", 30, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var best float64
			for try := 0; try < 3; try++ {
				p := testutil.StartProc(b, nil, testutil.DebianPython, "-c", opener, strconv.Itoa(n), strconv.Itoa(tc.depth))
				pid := p.Cmd.Process.Pid
				if err := c.Track(pid); err != nil {
					b.Fatal(err)
				}
				if !tc.frames {
					c.view.Untrack(pid) // no Python frames: the interpreter is not followed
				}
				cnt0, ns0 := runStats(b, prog)
				p.Signal(b)
				line := p.Wait(b, "ns_per_op", time.Minute)
				cnt1, ns1 := runStats(b, prog)
				wall, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
				perOpen := float64(ns1-ns0) / n
				if best == 0 || perOpen < best {
					best = perOpen
				}
				fmt.Fprintf(os.Stderr, "%s: sys_exit %.0f ns per open (%d runs, %.0f ns per run), wall %.0f ns per open+close\n",
					tc.name, perOpen, cnt1-cnt0, float64(ns1-ns0)/float64(cnt1-cnt0), wall)
				c.Untrack(pid)
				_ = p.Cmd.Process.Kill()
			}
			b.ReportMetric(best, "bpf-ns/open")
		})
	}
	_ = model.KindFDLeak
}

// lastProgramID is the highest id of a loaded BPF program.
func lastProgramID() ebpf.ProgramID {
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			return id
		}
		id = next
	}
}

// exitProgram is the sys_exit program of the fd object loaded after id
// after (other processes may have their own loaded).
func exitProgram(b *testing.B, after ebpf.ProgramID) *ebpf.Program {
	id := after
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			b.Fatal("no sys_exit program loaded")
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		info, err := p.Info()
		if err == nil && (info.Name == "sys_exit_btf" || info.Name == "sys_exit_tp") {
			b.Cleanup(func() { p.Close() })
			return p
		}
		p.Close()
	}
}

func runStats(b *testing.B, p *ebpf.Program) (count uint64, ns uint64) {
	st, err := p.Stats()
	if err != nil {
		b.Fatal(err)
	}
	return st.RunCount, uint64(st.Runtime)
}
