package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/open-autoglm/autoglm-ebpf/pkg/model"
	"github.com/open-autoglm/autoglm-ebpf/pkg/profiles"
	"github.com/open-autoglm/autoglm-ebpf/pkg/report"
)

// newReport renders a saved JSON report as HTML, or writes its profiles:
// for a report from CI or another machine, or written before --html or
// --pprof was given.
func newReport() *cobra.Command {
	var html, pprof string
	cmd := &cobra.Command{
		Use:   "report REPORT.json [--html FILE] [--pprof DIR]",
		Short: "Render a JSON report (from --json) as a self-contained HTML page with charts, or write its profiles",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case html == "" && pprof == "":
				return usagef("--html FILE or --pprof DIR is required")
			case html == "-":
				return usagef("--html needs a file name, not -")
			}
			if pprof != "" {
				if err := os.MkdirAll(pprof, 0o755); err != nil {
					return usagef("--pprof %s: %v", pprof, err)
				}
			}
			r, err := report.Read(args[0])
			if err != nil {
				return err
			}
			if html != "" {
				if err := report.WriteHTMLFile(html, r); err != nil {
					return fmt.Errorf("writing %s: %w", html, err)
				}
			}
			if pprof != "" {
				return writeProfiles(pprof, r)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&html, "html", "", "write the HTML page to FILE")
	cmd.Flags().StringVar(&pprof, "pprof", "", "write each process's profiles (as run --pprof does) into DIR, from the call sites the report carries, and those of the memory snapshots its gpu_alloc_failure findings carry (PID-gpu-oom-TIME.pb.gz)")
	return cmd
}

// writeProfiles writes the profiles of the report's processes into dir.
func writeProfiles(dir string, r *report.Report) error {
	w := profiles.NewWriter(dir)
	for _, p := range r.Processes {
		if p.Sites == nil {
			continue
		}
		mp := p.Sites.Model()
		mp.PID, mp.Comm, mp.Started = p.PID, p.Comm, p.Started
		w.Update(&model.Snapshot{Time: r.End, Processes: []*model.Process{mp}})
	}
	// The memory snapshots at failures the report keeps: each
	// gpu_alloc_failure's first.
	for _, f := range r.Findings {
		if ev, ok := f.Evidence.(model.GPUAllocFailureEvidence); ok && ev.Snapshot != nil {
			mp := &model.Process{PID: f.PID, Comm: f.Comm, CUDA: model.CUDAStats{Snapshots: []*model.GPUMemorySnapshot{ev.Snapshot}}}
			w.Update(&model.Snapshot{Time: r.End, Processes: []*model.Process{mp}})
		}
	}
	if err := w.Close(&model.Snapshot{Time: r.End}); err != nil {
		return err
	}
	if len(w.Written) == 0 {
		return errors.New("the report has no call sites to profile (written by an autoglm-ebpf without them?): nothing written to " + filepath.Clean(dir))
	}
	return nil
}
