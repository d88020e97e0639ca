package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/open-autoglm/autoglm-ebpf/pkg/report"
)

// newReport renders a saved JSON report as HTML: for a report from CI or
// another machine, or written before --html was given.
func newReport() *cobra.Command {
	var html string
	cmd := &cobra.Command{
		Use:   "report REPORT.json --html FILE",
		Short: "Render a JSON report (from --json) as a self-contained HTML page with charts",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch html {
			case "":
				return usagef("--html FILE is required")
			case "-":
				return usagef("--html needs a file name, not -")
			}
			r, err := report.Read(args[0])
			if err != nil {
				return err
			}
			if err := report.WriteHTMLFile(html, r); err != nil {
				return fmt.Errorf("writing %s: %w", html, err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&html, "html", "", "write the HTML page to FILE")
	return cmd
}
