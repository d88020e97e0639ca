package main

import (
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/open-autoglm/autoglm-ebpf/pkg/features"
	"github.com/open-autoglm/autoglm-ebpf/pkg/pipeline"
)

func newCheck() *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Report what this kernel and machine offer, and whether the tool can run",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rs := features.Check()
			viewResults, finds := pipeline.Checks()
			rs = append(rs, viewResults...)
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
			for _, r := range rs {
				if r.Name == features.NVML && r.OK {
					finds = append(finds, "GPU metrics (NVML)")
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "verdict: ready: %s\n", strings.Join(finds, ", "))
			return nil
		},
	}
}
