//go:build hosttest

package deploy

import (
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// promqlWords are PromQL's keywords and the words that are not metric names
// wherever they stand.
var promqlWords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "and": true, "or": true, "unless": true, "offset": true, "atan2": true,
	"inf": true, "nan": true,
	// Aggregations, which may stand before "by (...)" instead of "(".
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// metricNames returns the metric names a PromQL expression selects. It is a
// small tokenizer, not a full parser: it skips strings, label matchers in
// braces, range/subquery brackets, grouping label lists after by/without/
// on/ignoring/group_left/group_right, function and aggregation names (an
// identifier followed by "("), keywords, numbers and durations, and Grafana
// variables ($node, ${datasource}, $__rate_interval).
func metricNames(expr string) []string {
	seen := map[string]bool{}
	rs := []rune(expr)
	isIdentStart := func(r rune) bool { return r == '_' || r == ':' || unicode.IsLetter(r) }
	isIdent := func(r rune) bool { return isIdentStart(r) || unicode.IsDigit(r) }
	skipSpace := func(i int) int {
		for i < len(rs) && unicode.IsSpace(rs[i]) {
			i++
		}
		return i
	}
	// skipTo returns the index after the matching close of the open rune at i.
	skipTo := func(i int, opening, closing rune) int {
		depth := 0
		for ; i < len(rs); i++ {
			switch rs[i] {
			case '"', '\'', '`':
				q := rs[i]
				for i++; i < len(rs) && rs[i] != q; i++ {
					if rs[i] == '\\' {
						i++
					}
				}
			case opening:
				depth++
			case closing:
				depth--
				if depth == 0 {
					return i + 1
				}
			}
		}
		return i
	}
	for i := 0; i < len(rs); {
		r := rs[i]
		switch {
		case r == '"' || r == '\'' || r == '`':
			q := r
			for i++; i < len(rs) && rs[i] != q; i++ {
				if rs[i] == '\\' {
					i++
				}
			}
			i++
		case r == '{':
			i = skipTo(i, '{', '}')
		case r == '[':
			i = skipTo(i, '[', ']')
		case r == '$':
			i++
			if i < len(rs) && rs[i] == '{' {
				i = skipTo(i, '{', '}')
				continue
			}
			for i < len(rs) && isIdent(rs[i]) {
				i++
			}
		case unicode.IsDigit(r) || r == '.':
			for i < len(rs) && (isIdent(rs[i]) || rs[i] == '.') {
				i++
			}
		case isIdentStart(r):
			start := i
			for i < len(rs) && isIdent(rs[i]) {
				i++
			}
			word := string(rs[start:i])
			next := skipSpace(i)
			lower := strings.ToLower(word)
			switch {
			case lower == "by" || lower == "without" || lower == "on" || lower == "ignoring" ||
				lower == "group_left" || lower == "group_right":
				if next < len(rs) && rs[next] == '(' {
					i = skipTo(next, '(', ')')
				}
			case promqlWords[lower]:
			case next < len(rs) && rs[next] == '(':
				// A function or an aggregation; its argument list is
				// scanned on.
			default:
				seen[word] = true
			}
		default:
			i++
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{"up"}},
		{`up{job="carve-node-metrics"} == 0`, []string{"up"}},
		{`absent(up{job="x"})`, []string{"up"}},
		{`sum by (node, phase) (rate(carve_phase_duration_seconds_count{result!~"OK|ResourceExhausted"}[10m]))`, []string{"carve_phase_duration_seconds_count"}},
		{`histogram_quantile(0.95, sum by (le, command) (rate(carve_lvm_command_duration_seconds_bucket{node=~"$node"}[$__rate_interval])))`, []string{"carve_lvm_command_duration_seconds_bucket"}},
		{`max by (node, volume_group) (a_free) / max by (node, volume_group) (a_size) < 0.10`, []string{"a_free", "a_size"}},
		{`time() - max by (node) (carve_state_refresh_timestamp_seconds{result="success", node=~"$node"}) > 600`, []string{"carve_state_refresh_timestamp_seconds"}},
		{`a and on (node) b unless ignoring(x) c`, []string{"a", "b", "c"}},
		{`x * on(node) group_left(device_class) y offset 5m`, []string{"x", "y"}},
		{`rate(m{a="{b}", c='d}'}[5m:1m])`, []string{"m"}},
		{`sum(rate(m[${__range}]))`, []string{"m"}},
		{`1e3 * m_total + 0x1F`, []string{"m_total"}},
	} {
		if got := metricNames(tc.expr); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

// labelNames returns the label names an expression matches on or groups by:
// the names in {...} matchers and in the lists after by/without/on/
// ignoring/group_left/group_right.
func labelNames(expr string) []string {
	seen := map[string]bool{}
	matcher := regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')`)
	for _, block := range regexp.MustCompile(`\{[^{}]*\}`).FindAllString(expr, -1) {
		if strings.HasPrefix(block, "{__") || !matcher.MatchString(block) {
			continue // ${datasource}-like Grafana variables hold no matchers
		}
		for _, m := range matcher.FindAllStringSubmatch(block, -1) {
			seen[m[1]] = true
		}
	}
	grouping := regexp.MustCompile(`(?i)\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)`)
	for _, m := range grouping.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[2], ",") {
			if l = strings.TrimSpace(l); l != "" {
				seen[l] = true
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func TestLabelNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up`, []string{}},
		{`up{job="carve-node-metrics"} == 0`, []string{"job"}},
		{`sum by (node, phase) (rate(m{result!~"OK|ResourceExhausted"}[10m]))`, []string{"node", "phase", "result"}},
		{`rate(m{node=~"$node", device_class=~"$device_class"}[${__rate_interval}])`, []string{"device_class", "node"}},
		{`a * on(node) group_left(device_class) b`, []string{"device_class", "node"}},
		{`m{a="x,y=z"}`, []string{"a"}},
	} {
		if got := labelNames(tc.expr); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("labelNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}
