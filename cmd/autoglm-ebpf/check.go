package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/open-autoglm/autoglm-ebpf/pkg/features"
	"github.com/open-autoglm/autoglm-ebpf/pkg/gpunode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/pipeline"
)

func newCheck() *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Report what this kernel and machine offer, and whether the tool can run",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			devs := gpunode.Find("/proc")
			rs := features.Check(devs)
			viewResults, finds, absent := pipeline.Checks(devs)
			return printCheck(cmd.OutOrStdout(), append(rs, viewResults...), finds, absent)
		},
	}
}

// printCheck writes the table of results and the verdict: what the views
// that would run find, and the views absent here (not expected on this
// node, so no fault) with why.
func printCheck(out io.Writer, rs []features.Result, finds []string, absent map[string]model.Absence) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CHECK\tRESULT\tDETAIL")
	for _, r := range rs {
		status := "ok"
		switch {
		case !r.OK && r.Required:
			status = "MISSING"
		case !r.OK && r.Absent != "":
			status = "absent"
		case !r.OK:
			status = "no"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", r.Name, status, r.Detail)
	}
	w.Flush()
	if !features.Ready(rs) {
		fmt.Fprintln(out, "verdict: NOT READY: a required feature is missing (see MISSING above)")
		return errors.New("this machine cannot run autoglm-ebpf")
	}
	// NVML is the machine's line, not a view's.
	all := map[string]model.Absence{}
	maps.Copy(all, absent)
	for _, r := range rs {
		if r.Name != features.NVML {
			continue
		}
		if r.OK {
			finds = append(finds, "GPU metrics (NVML)")
		} else if r.Absent != "" {
			all["nvml"] = r.Absent
		}
	}
	verdict := "verdict: ready: " + strings.Join(finds, ", ")
	var views []string
	for _, v := range model.Views {
		if a, ok := all[v]; ok {
			views = append(views, fmt.Sprintf("%s (%s)", v, a.Meaning()))
		}
	}
	if len(views) > 0 {
		verdict += "; absent, not expected on this node: " + strings.Join(views, ", ")
	}
	fmt.Fprintln(out, verdict)
	return nil
}
