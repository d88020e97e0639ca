// Package deploy holds what runs autoglm-ebpf in a cluster: the image
// (image/, Dockerfile), the Kubernetes manifests (kubernetes/), the Prometheus alert
// rules (prometheus/) and the Grafana dashboard (grafana/), with the tests
// that keep them consistent (deploy_test.go).
//
// Its only API lists the dashboard's queries, so that another test (an
// end-to-end test against a live Prometheus) can run them.
package deploy

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
)

//go:embed grafana/autoglm-ebpf.json
var dashboardJSON []byte

// DashboardJSON returns the Grafana dashboard (grafana/autoglm-ebpf.json).
func DashboardJSON() []byte {
	return append([]byte(nil), dashboardJSON...)
}

// DefaultRateInterval is what DashboardQueries puts for Grafana's
// $__rate_interval and $__interval: long enough for rate() to find two
// samples at a 15 s scrape interval.
const DefaultRateInterval = "1m"

// DashboardTarget is one query of one dashboard panel.
type DashboardTarget struct {
	Panel string // the panel's title
	RefID string // the target's refId (A, B, ...)
	// Expr is the PromQL expression with every template variable
	// substituted (see SubstituteVariables); Raw is as the dashboard has it.
	Expr, Raw string
	// Instant is true for table panels that ask for the latest value only.
	Instant bool
}

// DashboardQueries returns the PromQL expression of every panel target of
// the dashboard, in panel order, with the template variables substituted
// (DefaultRateInterval for the interval variables). Rows are not queries;
// the variables' own label_values() queries are Grafana functions, not
// PromQL, and are not included.
func DashboardQueries() ([]string, error) {
	ts, err := DashboardTargets(DefaultRateInterval)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Expr
	}
	return out, nil
}

// DashboardTargets returns every panel target of the dashboard, with the
// template variables substituted and rateInterval (a PromQL duration such as
// "1m") for $__rate_interval and $__interval.
func DashboardTargets(rateInterval string) ([]DashboardTarget, error) {
	var d dashboard
	if err := json.Unmarshal(dashboardJSON, &d); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	var out []DashboardTarget
	for _, p := range flattenPanels(d.Panels) {
		for _, t := range p.Targets {
			expr, err := substitute(t.Expr, vars, rateInterval)
			if err != nil {
				return nil, fmt.Errorf("dashboard panel %q, target %s: %w", p.Title, t.RefID, err)
			}
			out = append(out, DashboardTarget{Panel: p.Title, RefID: t.RefID, Expr: expr, Raw: t.Expr, Instant: t.Instant})
		}
	}
	return out, nil
}

// SubstituteVariables replaces the Grafana variables in a query of this
// dashboard so that Prometheus can run it as it stands:
//
//   - A dashboard variable ($node, ${node}, ${node:regex}, [[node]]; likewise
//     instance, namespace, pod) becomes `.*`. The dashboard uses them only as
//     the value of a regex matcher (label=~"$node"; deploy_test.go checks
//     this), so the query becomes label=~".*", which selects every series,
//     with or without that label: what the dashboard shows with "All".
//   - $__rate_interval and $__interval become rateInterval.
//   - Any other variable is an error, so that a query using a new variable
//     is not run half-substituted.
func SubstituteVariables(expr, rateInterval string) (string, error) {
	var d dashboard
	if err := json.Unmarshal(dashboardJSON, &d); err != nil {
		return "", fmt.Errorf("dashboard: %w", err)
	}
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
	}
	return substitute(expr, vars, rateInterval)
}

// variableRef matches the three Grafana variable syntaxes: ${name} or
// ${name:format}, [[name]] or [[name:format]], and $name.
var variableRef = regexp.MustCompile(`\$\{(\w+)(?::[^}]*)?\}|\[\[(\w+)(?::[^\]]*)?\]\]|\$(\w+)`)

func substitute(expr string, vars map[string]bool, rateInterval string) (string, error) {
	var bad []string
	out := variableRef.ReplaceAllStringFunc(expr, func(ref string) string {
		m := variableRef.FindStringSubmatch(ref)
		name := m[1] + m[2] + m[3]
		switch {
		case name == "__rate_interval" || name == "__interval":
			return rateInterval
		case vars[name] && name != "datasource":
			return ".*"
		}
		bad = append(bad, ref)
		return ref
	})
	if len(bad) > 0 {
		return "", fmt.Errorf("unknown variable %s in %q", strings.Join(bad, ", "), expr)
	}
	return out, nil
}

// dashboard is the part of the Grafana dashboard model the queries need.
type dashboard struct {
	Templating struct {
		List []dashboardVariable `json:"list"`
	} `json:"templating"`
	Panels []dashboardPanel `json:"panels"`
}

type dashboardVariable struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

type dashboardPanel struct {
	ID      int               `json:"id"`
	Type    string            `json:"type"`
	Title   string            `json:"title"`
	Targets []dashboardTarget `json:"targets"`
	Panels  []dashboardPanel  `json:"panels"` // of a collapsed row
}

type dashboardTarget struct {
	RefID   string `json:"refId"`
	Expr    string `json:"expr"`
	Instant bool   `json:"instant"`
}

// flattenPanels returns the panels that query, in order: rows are left out,
// the panels inside collapsed rows are included.
func flattenPanels(ps []dashboardPanel) []dashboardPanel {
	var out []dashboardPanel
	for _, p := range ps {
		if p.Type == "row" {
			out = append(out, flattenPanels(p.Panels)...)
			continue
		}
		out = append(out, p)
	}
	return out
}
