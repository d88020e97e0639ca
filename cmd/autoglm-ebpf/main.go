// Command autoglm-ebpf finds why a GPU inference or training process blows up
// (fd leaks now; GPU allocations, scheduler storms and socket leaks next),
// with eBPF and without touching the process.
package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

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
	var verbose bool
	root := &cobra.Command{
		Use:           "autoglm-ebpf",
		Short:         "Find fd leaks (and soon GPU allocation bursts and leaks) in running processes with eBPF",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRun: func(cmd *cobra.Command, args []string) {
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
		},
	}
	root.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "debug logging")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newAttach(), newRun(), newCheck(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
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
