// Package promcheck evaluates the shipped dashboard's queries and alert
// expressions against a Prometheus server that scrapes a test bed: it
// reads them from deploy/, takes the alert expressions apart into what
// must have series for the alert to be able to fire (Probes), and tells
// which selectors of an expression a bed cannot have (Excuse). The e2e
// tier's TestPrometheus and the real-node tier's share it.
package promcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// Query is one expression of the dashboard or the rules, with where it
// comes from.
type Query struct {
	Where, Expr string
	// Panel is the dashboard panel's title (empty for an alert).
	Panel string
}

// Missing is a series a bed cannot have: a selector, and why.
type Missing struct{ Selector, Reason string }

// The series only a node with device-mapper has (a thin pool, a thick
// snapshot): the e2e bed's host has none, the real-node tier's guest has.
var (
	noThinPool      = "a thin pool needs device-mapper, which the e2e bed's host lacks (test/nodes TestPrometheus evaluates it on real-1)"
	noThickSnapshot = "a thick snapshot (lvcreate --snapshot) needs device-mapper, which the e2e bed's host lacks (test/nodes TestPrometheus evaluates it on real-1)"
)

// DeviceMapperSeries are the series that need device-mapper on the node.
func DeviceMapperSeries() []Missing {
	return []Missing{
		{`carve_thin_pool_data_percent`, noThinPool},
		{`carve_thin_pool_metadata_percent`, noThinPool},
		{`carve_thin_pool_zeroing`, noThinPool},
		{`carve_snapshot_cow_used_ratio`, noThickSnapshot},
		{`carve_snapshot_invalid`, noThickSnapshot},
	}
}

// Server is the Prometheus server `make deploy-tools` builds into
// $CARVE_CACHE/bin (the release promtool comes from).
func Server() (string, error) {
	cache := os.Getenv("CARVE_CACHE")
	if cache == "" {
		return "", errors.New("CARVE_CACHE is not set: run the tier through make, which installs prometheus into $CARVE_CACHE/bin (make deploy-tools)")
	}
	bin := filepath.Join(cache, "bin", "prometheus")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("%w: run `make deploy-tools`", err)
	}
	return bin, nil
}

// grafanaVariable is a Grafana variable in a label matcher's value, as
// node=~"$node": each is set at its "All" value.
var grafanaVariable = regexp.MustCompile(`=~"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?"`)

// grafanaIntervalVar is an interval variable of Grafana, where PromQL wants
// a duration.
var grafanaIntervalVar = regexp.MustCompile(`\$\{?__(rate_interval|interval|range)\}?`)

// DashboardQueries are the panel queries of the dashboard at path, each
// variable at its "All" value and the intervals at 5m. A query it cannot
// turn into PromQL is left out and named in the error, beside the
// queries it could.
func DashboardQueries(path string) ([]Query, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name     string `json:"name"`
				AllValue string `json:"allValue"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	all := map[string]string{}
	for _, v := range d.Templating.List {
		all[v.Name] = v.AllValue
	}
	var qs []Query
	var errs []string
	var add func(p panel) error
	add = func(p panel) error {
		for i, tg := range p.Targets {
			expr := grafanaIntervalVar.ReplaceAllString(tg.Expr, "5m")
			expr = grafanaVariable.ReplaceAllStringFunc(expr, func(m string) string {
				name := grafanaVariable.FindStringSubmatch(m)[1]
				v, ok := all[name]
				if !ok || v == "" {
					errs = append(errs, fmt.Sprintf("panel %q: variable $%s has no All value", p.Title, name))
				}
				return fmt.Sprintf("=~%q", v)
			})
			if strings.Contains(expr, "$") {
				errs = append(errs, fmt.Sprintf("panel %q: a Grafana variable the test cannot set: %s", p.Title, tg.Expr))
				continue
			}
			qs = append(qs, Query{Where: fmt.Sprintf("panel %q, query %d", p.Title, i+1), Expr: expr, Panel: p.Title})
		}
		// A collapsed row holds its panels.
		for _, raw := range p.Panels {
			var inner panel
			if err := json.Unmarshal(raw, &inner); err != nil {
				return fmt.Errorf("panel %q: %w", p.Title, err)
			}
			if err := add(inner); err != nil {
				return err
			}
		}
		return nil
	}
	for _, p := range d.Panels {
		if err := add(p); err != nil {
			return nil, err
		}
	}
	return collected(qs, errs, "the dashboard has no queries")
}

// collected is what DashboardQueries and AlertQueries return: qs, with
// the errors gathered joined in one, and none among them when qs is
// empty.
func collected(qs []Query, errs []string, none string) ([]Query, error) {
	if len(qs) == 0 {
		errs = append(errs, none)
	}
	if len(errs) > 0 {
		return qs, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return qs, nil
}

// AlertQueries are what each alert rule's expression of the rule file at
// path is made of, each without its threshold: see Probes. A rule whose
// expression does not parse is left out and named in the error.
func AlertQueries(path string) ([]Query, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rf struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(data, &rf); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	var qs []Query
	var errs []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = "record " + r.Record
			}
			e, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", name, err))
				continue
			}
			for i, p := range Probes(e) {
				qs = append(qs, Query{Where: fmt.Sprintf("alert %s, part %d", name, i+1), Expr: p.String()})
			}
		}
	}
	return collected(qs, errs, "the rules have no expressions")
}

// Shipped are the queries of deploy/grafana/carve-dashboard.json and
// the parts of deploy/prometheus/carve-rules.yaml's alert expressions, in
// the deploy directory dir; with an error naming what it could not read
// or turn into PromQL (and left out).
func Shipped(dir string) ([]Query, error) {
	dash, derr := DashboardQueries(filepath.Join(dir, "grafana", "carve-dashboard.json"))
	alerts, aerr := AlertQueries(filepath.Join(dir, "prometheus", "carve-rules.yaml"))
	return append(dash, alerts...), errors.Join(derr, aerr)
}

// Probes are the parts of an alert expression that must have series on a
// healthy bed for the alert to be able to fire: a comparison with a
// number gives its other side; and, or and unless give each side; absent()
// gives its argument; an aggregation, the aggregation of each probe of
// what it aggregates; anything else is itself.
func Probes(e parser.Expr) []parser.Expr {
	switch e := e.(type) {
	case *parser.ParenExpr:
		return Probes(e.Expr)
	case *parser.AggregateExpr:
		var out []parser.Expr
		for _, p := range Probes(e.Expr) {
			agg := *e
			agg.Expr = p
			out = append(out, &agg)
		}
		return out
	case *parser.BinaryExpr:
		switch {
		case e.Op == parser.LAND || e.Op == parser.LOR || e.Op == parser.LUNLESS:
			return append(Probes(e.LHS), Probes(e.RHS)...)
		case e.Op.IsComparisonOperator() && isNumber(e.RHS):
			return Probes(e.LHS)
		case e.Op.IsComparisonOperator() && isNumber(e.LHS):
			return Probes(e.RHS)
		}
	case *parser.Call:
		if e.Func.Name == "absent" || e.Func.Name == "absent_over_time" {
			return Probes(e.Args[0])
		}
	}
	return []parser.Expr{e}
}

func isNumber(e parser.Expr) bool {
	for {
		switch x := e.(type) {
		case *parser.ParenExpr:
			e = x.Expr
		case *parser.NumberLiteral:
			return true
		default:
			return false
		}
	}
}

// Instant evaluates expr now and returns its vector.
func Instant(ctx context.Context, api promv1.API, expr string) (model.Vector, error) {
	v, _, _, err := api.Query(ctx, expr, time.Now())
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", expr, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("query %s: a %s, not a vector", expr, v.Type())
	}
	return vec, nil
}

// SeriesOf is how many series expr returns now.
func SeriesOf(ctx context.Context, api promv1.API, expr string) (int, error) {
	v, err := Instant(ctx, api, expr)
	return len(v), err
}

// ScrapedTwiceSince is a condition to poll until every one of n targets
// is up and has been scraped at least twice since since (so that every
// series made before since has the two samples rate() needs), with what
// it saw.
func ScrapedTwiceSince(ctx context.Context, api promv1.API, since time.Time, n int) (bool, string, error) {
	up, err := Instant(ctx, api, "up == 1")
	if err != nil {
		return false, "", err
	}
	ms := time.Since(since).Milliseconds()
	scrapes, err := Instant(ctx, api, fmt.Sprintf("count_over_time(up[%dms]) >= 2", ms))
	if err != nil {
		return false, "", err
	}
	status := fmt.Sprintf("%d of %d targets up, %d scraped twice in the %d ms since", len(up), n, len(scrapes), ms)
	if down, err := Instant(ctx, api, "up == 0"); err == nil && len(down) > 0 {
		var names []string
		for _, d := range down {
			names = append(names, fmt.Sprintf("%s %s", d.Metric[model.JobLabel], d.Metric[model.InstanceLabel]))
		}
		status += "; down: " + strings.Join(names, ", ")
	}
	return len(up) == n && len(scrapes) == n, status, nil
}

// ProbesHaveSeries checks that each probe of expr has series, or is
// excused by missing (see Excuse).
func ProbesHaveSeries(ctx context.Context, api promv1.API, expr string, missing []Missing) error {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return err
	}
	for _, p := range Probes(e) {
		n, err := SeriesOf(ctx, api, p.String())
		if err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		if _, err := Excuse(ctx, api, p.String(), missing); err != nil {
			return fmt.Errorf("no series for %s, without its comparison: %w", p, err)
		}
	}
	return nil
}

// Excuse returns why expr may have no series on the bed: a selector of it
// that has no series carries every matcher of an entry of missing.
// Otherwise it names the selectors of expr that have none.
func Excuse(ctx context.Context, api promv1.API, expr string, missing []Missing) (string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return "", err
	}
	var empty []string
	var reasons []string
	for _, vs := range VectorSelectors(e) {
		n, err := SeriesOf(ctx, api, vs.String())
		if err != nil {
			return "", err
		}
		if n > 0 {
			continue
		}
		m, ok, err := Matching(vs, missing)
		if err != nil {
			return "", err
		}
		if ok {
			reasons = append(reasons, m.Selector+": "+m.Reason)
			continue
		}
		empty = append(empty, vs.String())
	}
	switch {
	case len(reasons) > 0:
		slices.Sort(reasons)
		return strings.Join(slices.Compact(reasons), "; "), nil
	case len(empty) > 0:
		return "", fmt.Errorf("these selectors have no series on the bed: %s", strings.Join(empty, ", "))
	default:
		return "", fmt.Errorf("each selector has series, the expression has none")
	}
}

// Matching returns the first entry of ms whose selector's matchers vs
// all carries.
func Matching(vs *parser.VectorSelector, ms []Missing) (Missing, bool, error) {
	has := map[string]bool{}
	for _, m := range vs.LabelMatchers {
		has[m.String()] = true
	}
	for _, e := range ms {
		want, err := parser.NewParser(parser.Options{}).ParseMetricSelector(e.Selector)
		if err != nil {
			return Missing{}, false, fmt.Errorf("selector %s: %w", e.Selector, err)
		}
		if !slices.ContainsFunc(want, func(m *labels.Matcher) bool { return !has[m.String()] }) {
			return e, true, nil
		}
	}
	return Missing{}, false, nil
}

// Selects tells whether expr has a selector that carries every matcher of
// an entry of ms.
func Selects(expr string, ms []Missing) (bool, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return false, err
	}
	for _, vs := range VectorSelectors(e) {
		_, ok, err := Matching(vs, ms)
		if err != nil || ok {
			return ok, err
		}
	}
	return false, nil
}

// VectorSelectors are the vector selectors in e, with their metric name
// as Name.
func VectorSelectors(e parser.Expr) []*parser.VectorSelector {
	var out []*parser.VectorSelector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			if vs.Name == "" {
				for _, m := range vs.LabelMatchers {
					if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
						vs.Name = m.Value
					}
				}
			}
			out = append(out, vs)
		}
		return nil
	})
	return out
}
