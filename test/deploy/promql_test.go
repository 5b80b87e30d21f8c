//go:build deploytest

package deploy

import (
	"reflect"
	"regexp"
	"sort"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// grafanaInterval matches Grafana's interval variables, which stand where
// PromQL wants a duration.
var grafanaInterval = regexp.MustCompile(`\$\{?__(rate_interval|interval|range)\}?`)

// parseQuery parses a rule's or a panel's expression with Prometheus' own
// parser, Grafana's interval variables taken as 5m ($node and the like
// only stand inside label values).
func parseQuery(expr string) (parser.Expr, error) {
	return parser.NewParser(parser.Options{}).ParseExpr(grafanaInterval.ReplaceAllString(expr, "5m"))
}

// selectors returns the metric names an expression selects and the label
// names it matches on or groups by (matchers, by/without, on/ignoring,
// group_left/group_right), both sorted.
func selectors(expr string) (metrics, labelNames []string, err error) {
	e, err := parseQuery(expr)
	if err != nil {
		return nil, nil, err
	}
	ms, ls := map[string]bool{}, map[string]bool{}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			for _, m := range n.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					if m.Type == labels.MatchEqual {
						ms[m.Value] = true
					}
					continue
				}
				ls[m.Name] = true
			}
		case *parser.AggregateExpr:
			for _, l := range n.Grouping {
				ls[l] = true
			}
		case *parser.BinaryExpr:
			if vm := n.VectorMatching; vm != nil {
				for _, l := range append(append([]string{}, vm.MatchingLabels...), vm.Include...) {
					ls[l] = true
				}
			}
		}
		return nil
	})
	return sortedKeys(ms), sortedKeys(ls), nil
}

// metricNames are the metric names expr selects (nil when it does not parse;
// the callers check parsing on their own).
func metricNames(expr string) []string {
	m, _, _ := selectors(expr)
	return m
}

// labelNames are the label names expr matches on or groups by.
func labelNames(expr string) []string {
	_, l, _ := selectors(expr)
	return l
}

// TestSelectors: the names come from Prometheus' parser; these cases pin
// how the helpers read it (keywords, strings, Grafana variables).
func TestSelectors(t *testing.T) {
	for _, tc := range []struct {
		expr           string
		metrics, names []string
	}{
		{`up{job="carve-node-metrics"} == 0`, []string{"up"}, []string{"job"}},
		{`sum by (node, phase) (rate(carve_phase_duration_seconds_count{result!~"OK|ResourceExhausted"}[10m]))`,
			[]string{"carve_phase_duration_seconds_count"}, []string{"node", "phase", "result"}},
		{`histogram_quantile(0.95, sum by (le, command) (rate(carve_lvm_command_duration_seconds_bucket{node=~"$node"}[$__rate_interval])))`,
			[]string{"carve_lvm_command_duration_seconds_bucket"}, []string{"command", "le", "node"}},
		{`x * on(node) group_left(device_class) y offset 5m`, []string{"x", "y"}, []string{"device_class", "node"}},
		{`a unless on (node, device_class) b`, []string{"a", "b"}, []string{"device_class", "node"}},
		{`rate(m{a="{b}", c='d}'}[5m:1m])`, []string{"m"}, []string{"a", "c"}},
	} {
		m, l, err := selectors(tc.expr)
		if err != nil {
			t.Errorf("%q: %v", tc.expr, err)
			continue
		}
		sort.Strings(tc.names)
		if !reflect.DeepEqual(m, tc.metrics) || !reflect.DeepEqual(l, tc.names) {
			t.Errorf("selectors(%q) = %q, %q; want %q, %q", tc.expr, m, l, tc.metrics, tc.names)
		}
	}
	if _, _, err := selectors(`sum by (node (x)`); err == nil {
		t.Error("a broken expression parses")
	}
}
