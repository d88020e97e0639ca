package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/open-autoglm/autoglm-ebpf/pkg/features"
)

func newCheck() *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Report what this kernel and machine offer, and whether the tool can run",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rs := features.Check()
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "CHECK\tRESULT\tDETAIL")
			for _, r := range rs {
				status := "ok"
				switch {
				case !r.OK && r.Required:
					status = "MISSING"
				case !r.OK:
					status = "no"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\n", r.Name, status, r.Detail)
			}
			w.Flush()
			if !features.Ready(rs) {
				fmt.Fprintln(cmd.OutOrStdout(), "verdict: NOT READY: a required feature is missing (see MISSING above)")
				return errors.New("this machine cannot run autoglm-ebpf")
			}
			views := []string{"fd leaks"}
			for _, v := range []struct{ probe, view string }{
				{"view sched: sched_switch", "context-switch storms"},
				{"view sock (TCP socket states)", "socket leaks"},
				{"view cuda (allocation hooks)", "GPU allocations"},
				{"NVML (GPU metrics)", "GPU metrics (NVML)"},
			} {
				for _, r := range rs {
					if r.Name == v.probe && r.OK {
						views = append(views, v.view)
					}
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "verdict: ready: %s\n", strings.Join(views, ", "))
			return nil
		},
	}
}
