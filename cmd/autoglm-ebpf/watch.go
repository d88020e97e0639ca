package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/open-autoglm/autoglm-ebpf/pkg/daemon"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/ctxstorm"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/gpualloc"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/ncclstall"
	"github.com/open-autoglm/autoglm-ebpf/pkg/launch"
	"github.com/open-autoglm/autoglm-ebpf/pkg/metrics"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/nvml"
	"github.com/open-autoglm/autoglm-ebpf/pkg/pipeline"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/profiles"
	"github.com/open-autoglm/autoglm-ebpf/pkg/report"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tui"
)

// watchFlags are shared by attach and run.
type watchFlags struct {
	duration time.Duration
	interval time.Duration
	json     string
	html     string
	pprof    string // folder
	listen   string
	web      string // --web.config.file
	expose   bool   // --web.expose-profiles
	failOn   []string
	classic  bool // the run-queue histogram gets classic buckets too
	maxFDs   uint32
	ctxFloor float64
	nccl     time.Duration // --nccl-stall
	gpuEvery time.Duration
	maxAlloc uint32
	launches bool
	budget   gpualloc.Bytes // --gpu-memory-budget
	children bool
}

func (f *watchFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.DurationVar(&f.duration, "duration", 0, "stop after this long (default: until Ctrl-C or the targets exit)")
	fl.DurationVar(&f.interval, "interval", time.Second, "how often maps are read and detectors run")
	fl.StringVar(&f.json, "json", "", "write a JSON report to FILE at the end (- for stdout)")
	fl.StringVar(&f.html, "html", "", "write the report as a self-contained HTML page with charts to FILE at the end")
	fl.StringVar(&f.pprof, "pprof", "", "write each process's GPU memory, fd and GPU wait profiles by call site (pprof format: go tool pprof, Pyroscope) into DIR at the end, as PID-gpu.pb.gz, PID-fd.pb.gz and PID-wait.pb.gz, and the GPU memory live at each failed allocation it snapshots as PID-gpu-oom-TIME.pb.gz at once (TIME in UTC, e.g. 20261205T171620.123Z); DIR is made if missing")
	addWebFlags(fl, &f.listen, &f.web, &f.expose, "", "Prometheus metrics (/metrics) to every client, and "+profilesHelp)
	fl.BoolVar(&f.classic, "runqueue-classic-buckets", false, "give the run-queue histogram on /metrics a few classic buckets too, for scrapers without native histograms (--runqueue-classic-buckets=true)")
	fl.StringSliceVar(&f.failOn, "fail-on", nil, "exit 3 if a finding of KIND[,KIND...] is made: "+strings.Join(model.Kinds, ", "))
	fl.Uint32Var(&f.maxFDs, "max-fds", 1<<16, "capacity of the kernel's live fd table, all targets together")
	fl.BoolVar(&f.children, "children", false, "also watch the targets' child processes, like strace -f (those forked while watched are tracked from their fork)")
	fl.DurationVar(&f.gpuEvery, "gpu-interval", nvml.DefaultInterval, "how often NVML is sampled (at least "+nvml.MinInterval.String()+")")
	fl.Uint32Var(&f.maxAlloc, "max-allocs", 1<<18, "capacity of the kernel's live GPU allocation table, all targets together")
	fl.BoolVar(&f.launches, "launches", false, launchesHelp)
	fl.Var(&f.budget, "gpu-memory-budget", "device memory each process may use (e.g. 80GiB): a GPU leak's time to exhaustion is also judged against it (needed without NVML)")
	fl.Float64Var(&f.ctxFloor, "ctx-switch-floor", ctxstorm.DefaultConfig().Floor, "context switches/s below which no storm is reported, whatever the baseline")
	fl.DurationVar(&f.nccl, "nccl-stall", ncclstall.DefaultConfig().Stall, "how long an NCCL rank makes no collective before it is a straggler (behind its peers) or its communicator hung (none ahead)")
}

func (f *watchFlags) validate() error {
	if f.interval <= 0 {
		return usagef("--interval must be positive, got %s", f.interval)
	}
	if f.duration < 0 {
		return usagef("--duration must not be negative, got %s", f.duration)
	}
	if f.html == "-" {
		return usagef("--html needs a file name, not -")
	}
	for _, o := range []struct{ flag, path string }{{"--json", f.json}, {"--html", f.html}} {
		if o.path == "" || o.path == "-" {
			continue
		}
		if err := writable(o.path); err != nil {
			return usagef("%s %s: %v", o.flag, o.path, err)
		}
	}
	if f.pprof != "" {
		if err := os.MkdirAll(f.pprof, 0o755); err != nil {
			return usagef("--pprof %s: %v", f.pprof, err)
		}
		if err := writable(filepath.Join(f.pprof, profiles.FileName(1, profiles.GPU))); err != nil {
			return usagef("--pprof %s: %v", f.pprof, err)
		}
	}
	if f.maxFDs == 0 {
		return usagef("--max-fds must be positive")
	}
	if f.gpuEvery < nvml.MinInterval {
		return usagef("--gpu-interval must be at least %s, got %s", nvml.MinInterval, f.gpuEvery)
	}
	if f.maxAlloc == 0 {
		return usagef("--max-allocs must be positive")
	}
	if f.ctxFloor <= 0 {
		return usagef("--ctx-switch-floor must be positive, got %v", f.ctxFloor)
	}
	if f.nccl <= 0 {
		return usagef("--nccl-stall must be positive, got %s", f.nccl)
	}
	for _, k := range f.failOn {
		if !slices.Contains(model.Kinds, k) {
			return usagef("--fail-on: unknown kind %q (one of %s)", k, strings.Join(model.Kinds, ", "))
		}
	}
	if f.listen != "" {
		if _, _, err := net.SplitHostPort(f.listen); err != nil {
			return usagef("--web.listen-address %q: %v", f.listen, err)
		}
	}
	if f.web != "" && f.listen == "" {
		return usagef("--web.config.file needs --web.listen-address")
	}
	if f.expose && f.listen == "" {
		return usagef("--web.expose-profiles needs --web.listen-address")
	}
	return nil
}

// writable checks, before anything is attached, that a report can be
// written to path at the end: its folder exists and takes a new file (the
// report is written beside it and renamed over it), and path is no folder.
// Finding out after an hour's run would lose the report.
func writable(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return errors.New("is a directory")
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".check*")
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = fmt.Errorf("cannot create a file in %s: %w", filepath.Dir(path), pe.Err)
		}
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

func newAttach() *cobra.Command {
	var f watchFlags
	var pids string
	cmd := &cobra.Command{
		Use:   "attach --pid PID[,PID...]",
		Short: "Watch running processes until Ctrl-C, --duration or they exit",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if pids == "" {
				return usagef("--pid is required")
			}
			list, err := procinfo.ParsePIDs(pids)
			if err != nil {
				return usageError{err}
			}
			if err := f.validate(); err != nil {
				return err
			}
			fs, err := procinfo.New("/proc")
			if err != nil {
				return err
			}
			for _, pid := range list {
				if err := fs.Check(pid); err != nil {
					return err
				}
			}
			if err := requirePrivileges(); err != nil {
				return err
			}
			return watch(cmd, &f, func(p *pipeline.Pipeline) (func(), error) {
				for _, pid := range list {
					if err := p.Watch(pid); err != nil {
						return nil, err
					}
				}
				return func() {}, nil
			})
		},
	}
	cmd.Flags().StringVarP(&pids, "pid", "p", "", "process ids to watch, comma separated")
	f.register(cmd)
	return cmd
}

func newRun() *cobra.Command {
	var f watchFlags
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARGS...]",
		Short: "Start CMD and watch it from its first instruction until it exits",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.validate(); err != nil {
				return err
			}
			if err := requirePrivileges(); err != nil {
				return err
			}
			return watch(cmd, &f, func(p *pipeline.Pipeline) (func(), error) {
				g, err := launch.Start(args, os.Stdin, os.Stderr, os.Stderr)
				if err != nil {
					return nil, usageError{err}
				}
				if err := p.Watch(g.Cmd.Process.Pid); err != nil {
					g.Abort()
					return nil, err
				}
				// Every concern sees the command from its first instruction.
				p.Ready()
				if err := g.Release(); err != nil {
					g.Abort()
					return nil, err
				}
				// At the end a command still running (--duration, Ctrl-C)
				// is stopped as `timeout -k` does: SIGTERM, and SIGKILL if it
				// has not exited after a grace period; then reaped.
				return func() {
					waited := make(chan error, 1)
					go func() { waited <- g.Cmd.Wait() }()
					_ = g.Cmd.Process.Signal(syscall.SIGTERM)
					var err error
					select {
					case err = <-waited:
					case <-time.After(killAfter):
						slog.Warn("command ignored SIGTERM; killing it", "after", killAfter)
						_ = g.Cmd.Process.Kill()
						err = <-waited
					}
					if err != nil {
						slog.Info("command ended", "status", err)
					}
				}, nil
			})
		},
	}
	f.register(cmd)
	return cmd
}

// oomProfile names, for the findings' memory snapshots at failed
// allocations, the file --pprof writes each one's profile to; nil without
// --pprof. The profiles --web.listen-address serves are not named: that
// server ends with the run, the report outlives it.
func (f *watchFlags) oomProfile() func(pid int, at time.Time) string {
	if f.pprof == "" {
		return nil
	}
	dir := f.pprof
	return func(pid int, at time.Time) string { return filepath.Join(dir, profiles.OOMFileName(pid, at)) }
}

// killAfter is how long `run` waits for its command after SIGTERM.
const killAfter = 10 * time.Second

// serveProfiles adds the current profiles (profiles.Paths) to srv and
// returns the sink that keeps them current.
func serveProfiles(srv *daemon.Server) pipeline.Sink {
	live := &profiles.Live{}
	for _, kind := range profiles.Kinds {
		srv.HandlePrivate(profiles.Paths[kind], live.Handler(kind))
	}
	return live
}

// watchMemoryLimit is the Go runtime's soft memory limit for attach and run
// when GOMEMLIMIT does not set one. The tool runs beside the workload it
// diagnoses, and by default the heap may double its live size before a
// collection: symbolizing a large library's stacks briefly leaves tens of
// MiB of garbage. The live heap stays well under it (symbol indexes are
// capped at 16 MiB); past it the runtime collects more often, never fails.
const watchMemoryLimit = 32 << 20

// watch runs the pipeline shared by attach and run: sinks, signals,
// --duration, and the BPF objects unloaded on every path.
func watch(cmd *cobra.Command, f *watchFlags, start func(*pipeline.Pipeline) (func(), error)) error {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(watchMemoryLimit)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	out := os.Stdout
	if f.json == "-" {
		out = os.Stderr
	}
	sinks := []pipeline.Sink{tui.New(out, term.IsTerminal(int(out.Fd())))}
	if f.json != "" || f.html != "" {
		sinks = append(sinks, report.New(version, report.Outputs{JSON: f.json, HTML: f.html}))
	}
	if f.pprof != "" {
		sinks = append(sinks, profiles.NewWriter(f.pprof))
	}
	if f.listen != "" {
		srv, err := daemon.Listen(f.listen, f.web, f.expose)
		if err != nil {
			return err
		}
		defer srv.Close()
		reg := prometheus.NewRegistry()
		sinks = append(sinks, metrics.New(reg, version, metrics.Options{RunqueueClassicBuckets: f.classic}), serveProfiles(srv))
		srv.Serve(reg, nil, 0)
	}

	cfg := pipeline.DefaultConfig()
	cfg.Interval, cfg.MaxFDs = f.interval, f.maxFDs
	cfg.CtxStorm.Floor = f.ctxFloor
	cfg.NCCLStall.Stall = f.nccl
	cfg.GPUInterval, cfg.MaxAllocs, cfg.Launches = f.gpuEvery, f.maxAlloc, f.launches
	cfg.GPUAlloc.MemoryBudget = uint64(f.budget)
	cfg.Children = f.children
	cfg.OOMProfile = f.oomProfile()
	p, err := pipeline.New(cfg, sinks...)
	if err != nil {
		return err
	}
	defer p.Close()
	done, err := start(p)
	if err != nil {
		return err
	}
	defer done()
	if f.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.duration)
		defer cancel()
	}
	final, err := p.Run(ctx)
	// From here a second Ctrl-C ends the tool the default way, and the
	// kernel side is unloaded before waiting for a command to stop.
	stop()
	if cerr := p.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	var hit []string
	for _, fd := range final.Findings {
		if slices.Contains(f.failOn, fd.Kind) && !slices.Contains(hit, fd.Kind) {
			hit = append(hit, fd.Kind)
		}
	}
	if len(hit) > 0 {
		return failOnError{hit}
	}
	return nil
}
