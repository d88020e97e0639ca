package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/open-autoglm/autoglm-ebpf/pkg/bpfobj"
	"github.com/open-autoglm/autoglm-ebpf/pkg/features"
	"github.com/open-autoglm/autoglm-ebpf/pkg/gpunode"
	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/pipeline"
)

func newCheck() *cobra.Command {
	var programs bool
	cmd := &cobra.Command{
		Use:   "check",
		Short: "Report what this kernel and machine offer, and whether the tool can run",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			devs := gpunode.Find("/proc")
			rs := features.Check(devs)
			var done func() []bpfobj.ProgramCost
			if programs {
				done = bpfobj.RecordCosts()
			}
			viewResults, finds, absent := pipeline.Checks(devs)
			err := printCheck(cmd.OutOrStdout(), append(rs, viewResults...), finds, absent)
			if programs {
				printCosts(cmd.OutOrStdout(), done())
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&programs, "programs", false,
		"also list each BPF program loaded: its instructions after the kernel's rewrites, the instructions the verifier processed (kernel 5.16+) and its machine code's size")
	return cmd
}

// printCosts lists what the kernel made of each program the checks loaded:
// the figures that compare across kernels and architectures.
func printCosts(out io.Writer, cs []bpfobj.ProgramCost) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "OBJECT\tPROGRAM\tINSNS\tVERIFIED\tJIT BYTES")
	for _, c := range cs {
		verified := "-" // the kernel does not say (before 5.16)
		if c.Verified > 0 {
			verified = strconv.FormatUint(uint64(c.Verified), 10)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%d\n", c.Object, c.Program, c.Translated, verified, c.JITed)
	}
	w.Flush()
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
