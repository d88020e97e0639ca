package main

import (
	"log/slog"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Flags are spelled as Prometheus exporters spell them; the tool's older
// spellings stay accepted as aliases.
var flagAliases = map[string]string{
	"listen":     "web.listen-address",
	"log-format": "log.format",
}

func normalizeFlag(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	if to, ok := flagAliases[name]; ok {
		name = to
	}
	return pflag.NormalizedName(name)
}

// listenHelp states the bind rule every command shares.
const listenHelp = "; a bare :PORT binds every interface, as exporters do (127.0.0.1:PORT: this host only). --listen is the old spelling"

// addWebFlags registers --web.listen-address (def: its default, "" for
// off), --web.config.file and --web.expose-profiles.
func addWebFlags(fl *pflag.FlagSet, addr, webConfig *string, expose *bool, def, serves string) {
	fl.StringVar(addr, "web.listen-address", def, "serve on ADDR "+serves+listenHelp)
	fl.StringVar(webConfig, "web.config.file", "", "exporter-toolkit web config (TLS, basic auth), as node_exporter takes it; clients it authenticates (basic_auth_users, or a client certificate verified against client_ca_file) also get the profiles")
	fl.BoolVar(expose, "web.expose-profiles", false, "serve the profiles (/debug/pprof/gpu, /debug/pprof/fd, /debug/pprof/wait: the call stacks, file paths and function names of every watched process) to anyone who can reach --web.listen-address, unauthenticated; without it only loopback clients (kubectl port-forward) and those --web.config.file authenticates get them, others 403")
}

// profilesHelp is what --web.listen-address says of the profiles.
const launchesHelp = "hook CUDA kernel launches too (cudaLaunchKernel, cuLaunchKernel, cudaGraphLaunch): counts by API and each call's latency (autoglm_cuda_launches_total, autoglm_cuda_launch_seconds); off by default, as PyTorch eager issues tens of thousands a second and each launch then pays a uprobe trap at the entry and the return of each hooked function it goes through, and our programs: BENCHMARKS.md has the cost"

const profilesHelp = "the current profiles (/debug/pprof/gpu, /debug/pprof/fd, /debug/pprof/wait) to loopback and authenticated clients only (--web.expose-profiles: to every client)"

// logFlags are the exporters' --log.level and --log.format.
type logFlags struct {
	level, format string
	verbose       bool // -v, the old spelling of --log.level=debug
}

func (l *logFlags) register(fl *pflag.FlagSet) {
	fl.StringVar(&l.level, "log.level", "info", "log level on stderr: debug, info, warn or error")
	fl.StringVar(&l.format, "log.format", "logfmt", "log format on stderr: logfmt or json (--log-format is the old spelling; text means logfmt)")
	fl.BoolVarP(&l.verbose, "verbose", "v", false, "the same as --log.level=debug")
	_ = fl.MarkHidden("verbose")
}

// setup installs the logger they describe.
func (l *logFlags) setup() error {
	levels := map[string]slog.Level{"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn, "error": slog.LevelError}
	level, ok := levels[l.level]
	if !ok {
		return usagef("--log.level must be debug, info, warn or error, got %q", l.level)
	}
	if l.verbose {
		level = slog.LevelDebug
	}
	opts := &slog.HandlerOptions{Level: level}
	switch l.format {
	case "logfmt", "text":
		slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, opts)))
	case "json":
		slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, opts)))
	default:
		return usagef("--log.format must be logfmt or json, got %q", l.format)
	}
	return nil
}

// noArgs is cobra.NoArgs with a clear error for a boolean flag given its
// value after a space (`--runqueue-classic-buckets false`): pflag takes
// the flag alone as true and leaves "false" as an argument.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 && (args[0] == "true" || args[0] == "false") {
		return usagef("unexpected %q: a boolean flag takes its value after =, e.g. --runqueue-classic-buckets=false", args[0])
	}
	if len(args) > 0 {
		return usagef("unexpected argument %q (%s takes none)", args[0], cmd.CommandPath())
	}
	return nil
}
