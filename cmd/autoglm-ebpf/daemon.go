package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/open-autoglm/autoglm-ebpf/pkg/cgroupmem"
	"github.com/open-autoglm/autoglm-ebpf/pkg/daemon"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/ctxstorm"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/gpualloc"
	"github.com/open-autoglm/autoglm-ebpf/pkg/detect/ncclstall"
	"github.com/open-autoglm/autoglm-ebpf/pkg/discover"
	"github.com/open-autoglm/autoglm-ebpf/pkg/fdtrack"
	"github.com/open-autoglm/autoglm-ebpf/pkg/kubeevents"
	"github.com/open-autoglm/autoglm-ebpf/pkg/metrics"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/nvml"
	"github.com/open-autoglm/autoglm-ebpf/pkg/pipeline"
	"github.com/open-autoglm/autoglm-ebpf/pkg/podinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/procinfo"
	"github.com/open-autoglm/autoglm-ebpf/pkg/profiles"
	"github.com/open-autoglm/autoglm-ebpf/pkg/tracked"
)

type daemonFlags struct {
	listen      string
	webConfig   string
	expose      bool // --web.expose-profiles
	interval    time.Duration
	resync      time.Duration
	matchComm   string
	matchCgroup string
	all         bool
	maxProcs    int
	findingsLog bool
	kubeEvents  bool
	node        string
	maxFDs      uint32
	fdReads     int
	maxAllocs   uint32
	launches    bool
	gpuEvery    time.Duration
	ctxFloor    float64
	ncclStall   time.Duration
	gpuBudget   gpualloc.Bytes
	classic     bool
	granularity string
	hold        time.Duration
	requireList string
	require     []string // parsed from requireList
}

func newDaemon() *cobra.Command {
	var f daemonFlags
	cmd := &cobra.Command{
		Use:   "daemon",
		Short: "Watch every process on this node that uses CUDA (or --all), export findings to Prometheus",
		Long: `Watches the node without being told pids: every process that maps a CUDA
library (or has the runtime linked in), found as it execs or loads the library
(kernel events) and by a slow resync of /proc. Serves /metrics, /healthz and
/readyz. In a Kubernetes pod with hostPID, processes are labelled with their
pod (from their cgroup, and names from the API server). The current
profiles (/debug/pprof/gpu, /debug/pprof/fd, /debug/pprof/wait), and the GPU
memory live at a process's last failed allocations
(/debug/pprof/gpu?pid=N&at=failure), are served to loopback and
authenticated clients only, unless --web.expose-profiles. SIGTERM detaches
everything and exits 0.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rules, err := f.rules()
			if err != nil {
				return err
			}
			if _, err := f.granularityOption(); err != nil {
				return err
			}
			if err := requirePrivileges(); err != nil {
				return err
			}
			return runDaemon(&f, rules)
		},
	}
	fl := cmd.Flags()
	addWebFlags(fl, &f.listen, &f.webConfig, &f.expose, ":9464", "/metrics, /healthz and /readyz to every client, and "+profilesHelp)
	fl.DurationVar(&f.interval, "interval", time.Second, "how often maps are read, detectors run and new processes are watched")
	fl.DurationVar(&f.resync, "resync", time.Minute, "how often /proc is walked for processes the kernel events missed")
	fl.StringVar(&f.matchComm, "match-comm", "", "watch only processes whose name (comm) matches REGEX")
	fl.StringVar(&f.matchCgroup, "match-cgroup", "", "watch only processes whose cgroup path matches GLOB (* matches across /), e.g. '*kubepods*'")
	fl.BoolVar(&f.all, "all", false, "watch every user process (fd, sched, sock views), not only those using CUDA")
	fl.IntVar(&f.maxProcs, "max-processes", 256, "most processes watched at once; more are counted in autoglm_processes_over_cap_total")
	fl.BoolVar(&f.findingsLog, "findings-log", false, "also write each finding state change as a JSON line on stdout")
	fl.BoolVar(&f.kubeEvents, "kubernetes.events", false, "report each finding that becomes active, escalates or ends as a Kubernetes event on its pod, as the kubelet reports its own (needs create and patch on events)")
	fl.StringVar(&f.node, "node-name", os.Getenv("NODE_NAME"), "this node's name, to ask the API server for its pods (default $NODE_NAME, from the downward API)")
	fl.Uint32Var(&f.maxFDs, "max-fds", 1<<18, "capacity of the kernel's live fd table, all processes together")
	fl.IntVar(&f.fdReads, "fd-reads-per-poll", fdtrack.DefaultReadsPerPoll, "most fds described from /proc (a readlink each) per interval, all processes together; a larger table is filled over several intervals (autoglm_fd_descriptions_deferred_total)")
	fl.Uint32Var(&f.maxAllocs, "max-allocs", 1<<18, "capacity of the kernel's live GPU allocation table, all processes together")
	fl.BoolVar(&f.launches, "launches", false, launchesHelp)
	fl.DurationVar(&f.gpuEvery, "gpu-interval", nvml.DefaultInterval, "how often NVML is sampled (at least "+nvml.MinInterval.String()+")")
	fl.Float64Var(&f.ctxFloor, "ctx-switch-floor", ctxstorm.DefaultConfig().Floor, "context switches/s below which no storm is reported")
	fl.DurationVar(&f.ncclStall, "nccl-stall", ncclstall.DefaultConfig().Stall, "how long an NCCL rank makes no collective before it is a straggler (behind its peers) or its communicator hung (none ahead)")
	// On by default here, unlike attach: the shipped dashboard and many
	// Prometheus servers (native histograms need a feature flag before 3.0)
	// read the classic buckets.
	fl.StringVar(&f.granularity, "metrics.granularity", "container", "container: series per container (its processes of one comm summed), and of its own for a process only while it has an active finding or holds half of a limit; process: every watched process has its own too (20-60 series each)")
	fl.DurationVar(&f.hold, "metrics.process-hold", metrics.DefaultHold, "with --metrics.granularity=container, how long a process keeps its own series after it was last interesting")
	fl.BoolVar(&f.classic, "runqueue-classic-buckets", true, "give the run-queue histogram a few classic buckets besides the native ones (--runqueue-classic-buckets=false: native only)")
	fl.StringVar(&f.requireList, "require-views", "fd,cuda", "views that must be up for /readyz to answer 200, comma-separated (of "+strings.Join(model.Views, ", ")+"; empty: none). autoglm_view_up shows each")
	fl.Var(&f.gpuBudget, "gpu-memory-budget", "device memory each process may use (e.g. 80GiB): a GPU leak's time to exhaustion is also judged against it (needed without NVML)")
	return cmd
}

// rules validates the flags: bad input is a usage error (exit 2).
func (f *daemonFlags) rules() (daemon.Rules, error) {
	r := daemon.Rules{All: f.all, Max: f.maxProcs}
	if f.maxProcs <= 0 {
		return r, usagef("--max-processes must be positive, got %d", f.maxProcs)
	}
	if f.maxProcs > tracked.Capacity {
		return r, usagef("--max-processes %d is over what the kernel maps hold (%d processes)", f.maxProcs, tracked.Capacity)
	}
	if f.interval <= 0 || f.resync <= 0 {
		return r, usagef("--interval and --resync must be positive")
	}
	var err error
	if f.require, err = daemon.ParseViews(f.requireList); err != nil {
		return r, usagef("--require-views: %v", err)
	}
	if f.gpuEvery < nvml.MinInterval {
		return r, usagef("--gpu-interval must be at least %s, got %s", nvml.MinInterval, f.gpuEvery)
	}
	if f.maxFDs == 0 || f.maxAllocs == 0 || f.ctxFloor <= 0 || f.fdReads <= 0 || f.ncclStall <= 0 {
		return r, usagef("--max-fds, --max-allocs, --ctx-switch-floor, --nccl-stall and --fd-reads-per-poll must be positive")
	}
	if f.matchComm != "" {
		re, err := regexp.Compile(f.matchComm)
		if err != nil {
			return r, usagef("--match-comm: %v", err)
		}
		r.Comm = re
	}
	if f.matchCgroup != "" {
		re, err := daemon.CompileGlob(f.matchCgroup)
		if err != nil {
			return r, usagef("--match-cgroup: %v", err)
		}
		r.Cgroup = re
	}
	return r, nil
}

func runDaemon(f *daemonFlags, rules daemon.Rules) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	srv, err := daemon.Listen(f.listen, f.webConfig, f.expose)
	if err != nil {
		return err
	}
	defer srv.Close()

	proc, err := procinfo.New("/proc")
	if err != nil {
		return err
	}
	var resolver *podinfo.Resolver
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		resolver = podinfo.NewInClusterResolver(ctx, f.node)
	}
	events, err := discover.New(false)
	if err != nil {
		// Without the discovery programs every resync walks /proc: slower
		// to notice a new process, not blind.
		slog.Warn("process discovery from kernel events unavailable; relying on the /proc resync", "err", err)
		events = nil
	} else {
		defer events.Close()
	}
	// The finder's reads of /proc/PID/maps (does it map CUDA?) serve the
	// views that track what it picks within the same poll.
	maps := procinfo.NewPollCache()
	finder := daemon.NewFinder(rules, proc.WithPollCache(maps), events, f.resync)

	reg := prometheus.NewRegistry()
	gran, err := f.granularityOption()
	if err != nil {
		return err
	}
	sink := metrics.New(reg, version, metrics.Options{Pods: true, Granularity: gran, Hold: f.hold, RunqueueClassicBuckets: f.classic})
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "autoglm_watched_processes",
			Help: "Processes the daemon watches now."}, func() float64 { return float64(finder.Watched()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "autoglm_processes_over_cap_total",
			Help: "Processes that matched but were not watched because --max-processes was reached."},
			func() float64 { return float64(finder.OverCap.Load()) }),
	)
	// The agent's own memory limit, which AutoglmEbpfMemoryNearLimit
	// compares its RSS and BPF maps with.
	if limit, err := cgroupmem.Find(); err != nil {
		slog.Warn("the agent's memory cgroup not found; autoglm_memory_limit_bytes not exported", "err", err)
	} else {
		reg.MustRegister(limit)
		if n, ok := limit.Read(); ok {
			slog.Info("memory limit of the agent's cgroup", "cgroup", limit.Dir(), "bytes", n)
		} else {
			slog.Info("no memory limit on the agent's cgroup; autoglm_memory_limit_bytes not exported", "cgroup", limit.Dir())
		}
	}
	health := &daemon.Health{Require: f.require}
	sinks := []pipeline.Sink{sink, health}
	if f.findingsLog {
		sinks = append(sinks, daemon.NewFindingsLog(os.Stdout))
	}
	if f.kubeEvents {
		// As without pod names: one warning, and the daemon goes on.
		if podEvents, err := kubeevents.NewInCluster(f.node); err != nil {
			slog.Warn("findings not reported as Kubernetes events", "err", err)
		} else {
			sinks = append(sinks, podEvents)
		}
	}
	sinks = append(sinks, serveProfiles(srv))
	srv.Serve(reg, health, 3*f.interval+5*time.Second)

	cfg := pipeline.DefaultConfig()
	cfg.Interval, cfg.MaxFDs, cfg.MaxAllocs, cfg.GPUInterval, cfg.Launches = f.interval, f.maxFDs, f.maxAllocs, f.gpuEvery, f.launches
	cfg.FDReadsPerPoll, cfg.MaxProcesses = f.fdReads, f.maxProcs
	cfg.CtxStorm.Floor = f.ctxFloor
	cfg.NCCLStall.Stall = f.ncclStall
	cfg.GPUAlloc.MemoryBudget = uint64(f.gpuBudget)
	cfg.Daemon, cfg.Source, cfg.Cache = true, finder, maps
	// The findings name where the profile of their memory snapshot at a
	// failure is served (serveProfiles), kept past the process's exit.
	cfg.OOMProfile = profiles.OOMPath
	cfg.Pod = func(pid int, known model.Pod) model.Pod {
		if known.UID != "" {
			// The cgroup does not change: only the names may have come
			// (a pause container's never does; a lookup is cheap).
			known.Namespace, known.Name, known.Container, _ = resolver.Lookup(known.UID, known.ContainerID)
			return known
		}
		pod, err := resolver.ForPID(proc, pid)
		if err != nil {
			return model.Pod{}
		}
		return model.Pod{UID: pod.UID, ContainerID: pod.ContainerID, Namespace: pod.Namespace, Name: pod.Name, Container: pod.Container, Cgroup: pod.Cgroup}
	}
	p, err := pipeline.New(cfg, sinks...)
	if err != nil {
		return err
	}
	defer p.Close()
	p.Ready()
	slog.Info("daemon started", "max_processes", rules.Max, "all", rules.All, "node", f.node)
	if _, err := p.Run(ctx); err != nil {
		return err
	}
	stop()
	return p.Close()
}

// granularityOption is --metrics.granularity as metrics take it.
func (f *daemonFlags) granularityOption() (metrics.Granularity, error) {
	switch f.granularity {
	case "container":
		if f.hold <= 0 {
			return 0, usagef("--metrics.process-hold must be positive, not %s", f.hold)
		}
		return metrics.PerContainer, nil
	case "process":
		return metrics.PerProcess, nil
	}
	return 0, usagef("--metrics.granularity must be container or process, not %q", f.granularity)
}
