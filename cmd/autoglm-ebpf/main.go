// Command autoglm-ebpf finds why a GPU inference or training process blows up
// (fd leaks, context-switch storms, socket leaks, GPU allocation bursts, leaks
// and failures), with eBPF and without touching the process.
package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/open-autoglm/autoglm-ebpf/pkg/buildinfo"
)

// version is set at build time with -ldflags "-X main.version=..."; a plain
// `go build` leaves it empty and the build's own VCS stamp names it.
var version = ""

func init() {
	if version == "" {
		version = buildVersion(debug.ReadBuildInfo())
	}
}

// buildVersion is the VCS revision the binary was built from ("+dirty" when
// the tree had changes), or "dev" when the build recorded none.
func buildVersion(info *debug.BuildInfo, ok bool) string {
	rev, dirty := buildinfo.Revision(info, ok)
	if rev == "" {
		if ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
			return info.Main.Version // go install module@version
		}
		return "dev"
	}
	if dirty {
		return rev[:min(12, len(rev))] + "+dirty"
	}
	return rev[:min(12, len(rev))]
}

// Exit codes, documented in README.
const (
	exitOK      = 0
	exitRuntime = 1
	exitUsage   = 2
	exitFailOn  = 3
)

// usageError marks bad input on the command line (exit 2).
type usageError struct{ error }

// failOnError says a --fail-on kind was found (exit 3).
type failOnError struct{ kinds []string }

func (e failOnError) Error() string { return fmt.Sprintf("found %v (--fail-on)", e.kinds) }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

func newRoot() *cobra.Command {
	var logs logFlags
	root := &cobra.Command{
		Use:               "autoglm-ebpf",
		Short:             "Find why a GPU inference or training process blows up: fd leaks, context-switch storms, socket leaks, GPU allocation bursts, leaks and failures (eBPF, no changes to the process)",
		SilenceUsage:      true,
		SilenceErrors:     true,
		PersistentPreRunE: func(*cobra.Command, []string) error { return logs.setup() },
	}
	logs.register(root.PersistentFlags())
	root.SetGlobalNormalizationFunc(normalizeFlag)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newAttach(), newRun(), newDaemon(), newCheck(), newReport(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  noArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "autoglm-ebpf", version) },
	})
	return root
}

func main() { os.Exit(execute(os.Args[1:])) }

func execute(args []string) int {
	root := newRoot()
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(os.Stderr, "autoglm-ebpf:", err)
	var ue usageError
	var fe failOnError
	switch {
	case errors.As(err, &fe):
		return exitFailOn
	case errors.As(err, &ue), isCobraUsage(err):
		return exitUsage
	}
	return exitRuntime
}
