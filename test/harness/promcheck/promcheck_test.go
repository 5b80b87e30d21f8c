package promcheck

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

func TestProbes(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`max by (node) (a) > 80`, []string{`max by (node) (a)`}},
		{`0.5 < b`, []string{`b`}},
		{`(a > 1) and (b < 2)`, []string{`a`, `b`}},
		{`a unless on (node) b == 0`, []string{`a`, `b`}},
		{`max by (node) (c == 0)`, []string{`max by (node) (c)`}},
		{`absent(up{job="x"})`, []string{`up{job="x"}`}},
		{`a / b < 0.1`, []string{`a / b`}},
		{`a > b`, []string{`a > b`}},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			e, err := parser.NewParser(parser.Options{}).ParseExpr(tt.expr)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range Probes(e) {
				got = append(got, p.String())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("Probes(%s) = %q, want %q", tt.expr, got, tt.want)
			}
		})
	}
}

func TestSelects(t *testing.T) {
	ms := []Missing{{Selector: `carve_thin_pool_data_percent`}, {Selector: `up{job="carve-x"}`}}
	tests := []struct {
		expr string
		want bool
	}{
		{`max(carve_thin_pool_data_percent{node=~".*"}) > 80`, true},
		{`carve_volume_group_free_bytes unless on (node) carve_thin_pool_data_percent`, true},
		{`up{job="carve-x", cluster=~".*"} == 1`, true},
		{`up{job="carve-y"}`, false},
		{`carve_thin_pool_metadata_percent`, false},
	}
	for _, tt := range tests {
		t.Run(tt.expr, func(t *testing.T) {
			got, err := Selects(tt.expr, ms)
			if err != nil || got != tt.want {
				t.Errorf("Selects(%s) = %v, %v; want %v", tt.expr, got, err, tt.want)
			}
		})
	}
}

// TestShipped: the shipped dashboard and rules turn into PromQL, every
// Grafana variable set, and some of their queries select each
// device-mapper series (else the real-node tier would prove nothing).
func TestShipped(t *testing.T) {
	qs, err := Shipped(filepath.Join("..", "..", "..", "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	var dash, alerts int
	for _, q := range qs {
		if strings.Contains(q.Expr, "$") {
			t.Errorf("%s: a Grafana variable left: %s", q.Where, q.Expr)
		}
		if _, err := parser.NewParser(parser.Options{}).ParseExpr(q.Expr); err != nil {
			t.Errorf("%s: %v", q.Where, err)
		}
		if q.Panel != "" {
			dash++
		} else {
			alerts++
		}
	}
	if dash == 0 || alerts == 0 {
		t.Errorf("%d dashboard queries, %d alert parts", dash, alerts)
	}
	for _, m := range DeviceMapperSeries() {
		n := 0
		for _, q := range qs {
			if ok, err := Selects(q.Expr, []Missing{m}); err != nil {
				t.Fatal(err)
			} else if ok {
				n++
			}
		}
		if n == 0 {
			t.Errorf("no shipped query selects %s", m.Selector)
		}
	}
}
