package plugintest

import (
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

func series(labels map[string]string, m *dto.Metric) *dto.Metric {
	for k, v := range labels {
		m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(k), Value: proto.String(v)})
	}
	return m
}

// TestMetricsReadOneSeriesAndSums: Gauge and Counter read the one
// matching series (none: not ok; several: an error), HistogramCount and
// HistogramSum add up every matching series.
func TestMetricsReadOneSeriesAndSums(t *testing.T) {
	a, b := map[string]string{"vg": "a"}, map[string]string{"vg": "b"}
	gauge := func(v float64) *dto.Metric { return &dto.Metric{Gauge: &dto.Gauge{Value: proto.Float64(v)}} }
	counter := func(v float64) *dto.Metric { return &dto.Metric{Counter: &dto.Counter{Value: proto.Float64(v)}} }
	hist := func(n uint64, s float64) *dto.Metric {
		return &dto.Metric{Histogram: &dto.Histogram{SampleCount: proto.Uint64(n), SampleSum: proto.Float64(s)}}
	}
	ms := Metrics{
		"g": {Metric: []*dto.Metric{series(a, gauge(1)), series(b, gauge(2))}},
		"c": {Metric: []*dto.Metric{series(a, counter(3)), series(a, counter(4))}},
		"h": {Metric: []*dto.Metric{series(a, hist(2, 0.5)), series(b, hist(3, 1.5))}},
	}
	if v, ok, err := ms.Gauge("g", b); v != 2 || !ok || err != nil {
		t.Errorf("Gauge(g, vg=b) = %v %v %v, want 2 true nil", v, ok, err)
	}
	if v, ok, err := ms.Gauge("g", map[string]string{"vg": "c"}); v != 0 || ok || err != nil {
		t.Errorf("Gauge(g, vg=c) = %v %v %v, want 0 false nil", v, ok, err)
	}
	if _, ok, err := ms.Counter("c", a); ok || err == nil {
		t.Errorf("Counter(c, vg=a) over two series = %v %v, want an error", ok, err)
	}
	if v, ok, err := ms.Counter("c", nil); ok || err == nil {
		t.Errorf("Counter(c) over two series = %v %v %v, want an error", v, ok, err)
	}
	if n := ms.HistogramCount("h", nil); n != 5 {
		t.Errorf("HistogramCount(h) = %d, want 5", n)
	}
	if n := ms.HistogramCount("h", a); n != 2 {
		t.Errorf("HistogramCount(h, vg=a) = %d, want 2", n)
	}
	if s := ms.HistogramSum("h", nil); s != 2 {
		t.Errorf("HistogramSum(h) = %v, want 2", s)
	}
}
