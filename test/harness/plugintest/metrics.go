package plugintest

import (
	"context"
	"fmt"
	"io"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one scrape of /metrics, by metric family name.
type Metrics map[string]*dto.MetricFamily

// Scrape reads the plugin's /metrics.
func (p *Plugin) Scrape(ctx context.Context) (Metrics, error) {
	return ScrapeURL(ctx, http.DefaultClient, p.MetricsURL)
}

// ScrapeURL reads a Prometheus text endpoint (a plugin's, a kubelet's)
// with client.
func ScrapeURL(ctx context.Context, client *http.Client, url string) (_ Metrics, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	rsp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("plugintest: scraping %s: %w", url, err)
	}
	defer func() {
		if cerr := rsp.Body.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("plugintest: scraping %s: close body: %w", url, cerr)
		}
	}()
	if rsp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("plugintest: scraping %s: %s", url, rsp.Status)
	}
	ms, err := ParseMetrics(rsp.Body)
	if err != nil {
		return nil, fmt.Errorf("plugintest: %s: %w", url, err)
	}
	return ms, nil
}

// ParseMetrics reads the Prometheus text format.
func ParseMetrics(r io.Reader) (Metrics, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing metrics: %w", err)
	}
	return fams, nil
}

// matches tells whether m carries every label in want.
func matches(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// HistogramCount sums the sample counts of the histogram series of name
// that carry the labels in want (all series when want is empty).
func (ms Metrics) HistogramCount(name string, want map[string]string) uint64 {
	return sum(ms, name, want, func(m *dto.Metric) uint64 { return m.GetHistogram().GetSampleCount() })
}

// sum adds up value over the series of name that carry the labels in want.
func sum[T uint64 | float64](ms Metrics, name string, want map[string]string, value func(*dto.Metric) T) T {
	var s T
	for _, m := range ms[name].GetMetric() {
		if matches(m, want) {
			s += value(m)
		}
	}
	return s
}

// Gauge returns the value of the one gauge series of name with the labels
// in want; ok is false when there is none, and an error when there are
// several.
func (ms Metrics) Gauge(name string, want map[string]string) (v float64, ok bool, err error) {
	return ms.one(name, want, func(m *dto.Metric) float64 { return m.GetGauge().GetValue() })
}

// one returns value of the one series of name with the labels in want;
// ok is false when there is none, and an error when there are several.
func (ms Metrics) one(name string, want map[string]string, value func(*dto.Metric) float64) (v float64, ok bool, err error) {
	for _, m := range ms[name].GetMetric() {
		if !matches(m, want) {
			continue
		}
		if ok {
			return 0, false, fmt.Errorf("plugintest: several %s series match %v", name, want)
		}
		v, ok = value(m), true
	}
	return v, ok, nil
}

// Counter returns the value of the one counter series of name with the
// labels in want, as Gauge does for gauges.
func (ms Metrics) Counter(name string, want map[string]string) (v float64, ok bool, err error) {
	return ms.one(name, want, func(m *dto.Metric) float64 { return m.GetCounter().GetValue() })
}

// LabelValues lists the values of label over the series of name that carry
// the labels in want, each once.
func (ms Metrics) LabelValues(name, label string, want map[string]string) []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range ms[name].GetMetric() {
		if !matches(m, want) {
			continue
		}
		for _, l := range m.GetLabel() {
			if l.GetName() == label && !seen[l.GetValue()] {
				seen[l.GetValue()] = true
				out = append(out, l.GetValue())
			}
		}
	}
	return out
}

// HistogramSum sums the sample sums (seconds, for carve's durations) of the
// histogram series of name that carry the labels in want.
func (ms Metrics) HistogramSum(name string, want map[string]string) float64 {
	return sum(ms, name, want, func(m *dto.Metric) float64 { return m.GetHistogram().GetSampleSum() })
}
