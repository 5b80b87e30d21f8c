package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"sigs.k8s.io/yaml"
)

// The jobs of the test bed's metrics endpoints: the names of the chart's
// metrics Services, which its ServiceMonitor makes the job label.
const (
	JobNode        = "carve-node-metrics"
	JobController  = "carve-controller-metrics"
	JobProvisioner = "carve-provisioner-metrics"
	JobResizer     = "carve-resizer-metrics"
)

// ScrapeTarget is one metrics endpoint of the test bed as the chart's
// ServiceMonitor scrapes it.
type ScrapeTarget struct {
	Job string
	// URL is the endpoint's /metrics.
	URL string
	// Labels are the target's own labels (node, as the ServiceMonitor's
	// relabeling sets it from the pod's node).
	Labels map[string]string
}

// ScrapeTargets are the endpoints the chart's ServiceMonitor scrapes on
// this bed: every node agent (with its node) and the controller
// Deployment's carve controller, csi-provisioner and csi-resizer. The
// chart gives csi-snapshotter no metrics Service, so neither does this.
func (c *Cluster) ScrapeTargets() []ScrapeTarget {
	var ts []ScrapeTarget
	for _, n := range c.Nodes {
		ts = append(ts, ScrapeTarget{Job: JobNode, URL: n.MetricsURL, Labels: map[string]string{"node": n.Name}})
	}
	if c.Central != nil {
		ts = append(ts,
			ScrapeTarget{Job: JobController, URL: c.Central.MetricsURL},
			ScrapeTarget{Job: JobProvisioner, URL: c.Central.ProvisionerMetricsURL},
			ScrapeTarget{Job: JobResizer, URL: c.Central.ResizerMetricsURL})
	}
	return ts
}

// Prometheus is a Prometheus server scraping the test bed.
type Prometheus struct {
	// URL is its HTTP API's base.
	URL string
	// API queries it.
	API     promv1.API
	process *Process
}

// StartPrometheus runs the Prometheus server bin with its data and log in
// dir, scraping targets every interval with honor_labels (as the chart's
// ServiceMonitor does), and waits until it is ready. ctx bounds the wait
// and the process; Stop ends it.
func StartPrometheus(ctx context.Context, bin, dir string, targets []ScrapeTarget, interval, lifetime time.Duration) (*Prometheus, error) {
	cfg, err := scrapeConfig(targets, interval)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return nil, fmt.Errorf("write the Prometheus config: %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	p, err := startProcess(ctx, dir, "prometheus", bin, []string{
		"--config.file=" + cfgPath,
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr,
		"--log.level=warn",
	}, nil, lifetime)
	if err != nil {
		return nil, err
	}
	prom := &Prometheus{URL: "http://" + addr, process: p}
	client, err := api.NewClient(api.Config{Address: prom.URL})
	if err != nil {
		p.Stop()
		return nil, fmt.Errorf("Prometheus API client: %w", err)
	}
	prom.API = promv1.NewAPI(client)
	if err := prom.waitReady(ctx, time.Minute); err != nil {
		p.Stop()
		return nil, err
	}
	return prom, nil
}

// Stop ends the server.
func (p *Prometheus) Stop() { p.process.Stop() }

// Tail is the last n lines of the server's log.
func (p *Prometheus) Tail(n int) string { return p.process.Tail(n) }

// waitReady polls /-/ready until the server answers 200.
func (p *Prometheus) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if ended, err := p.process.Exited(); ended {
			if err == nil {
				err = errors.New("exit status 0")
			}
			return fmt.Errorf("prometheus ended before it was ready: %w; log: %s", err, p.Tail(20))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/-/ready", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			err = resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = errors.New(resp.Status)
			}
			if err == nil {
				return nil
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("prometheus not ready in %s: %w; log: %s", timeout, last, p.Tail(20))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// scrapeConfig renders a Prometheus configuration with one scrape job per
// job name of targets, each target a static config with its labels.
func scrapeConfig(targets []ScrapeTarget, interval time.Duration) ([]byte, error) {
	type static struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels,omitempty"`
	}
	type job struct {
		Name          string   `json:"job_name"`
		MetricsPath   string   `json:"metrics_path"`
		HonorLabels   bool     `json:"honor_labels"`
		StaticConfigs []static `json:"static_configs"`
	}
	var jobs []*job
	for _, t := range targets {
		u, err := url.Parse(t.URL)
		if err != nil {
			return nil, fmt.Errorf("metrics URL of job %s: %w", t.Job, err)
		}
		if u.Host == "" {
			return nil, fmt.Errorf("metrics URL %q of job %s has no host", t.URL, t.Job)
		}
		i := slices.IndexFunc(jobs, func(j *job) bool { return j.Name == t.Job })
		if i >= 0 && jobs[i].MetricsPath != u.Path {
			return nil, fmt.Errorf("job %s scrapes both %s and %s", t.Job, jobs[i].MetricsPath, u.Path)
		}
		if i < 0 {
			jobs = append(jobs, &job{Name: t.Job, MetricsPath: u.Path, HonorLabels: true})
			i = len(jobs) - 1
		}
		jobs[i].StaticConfigs = append(jobs[i].StaticConfigs, static{Targets: []string{u.Host}, Labels: t.Labels})
	}
	every := fmt.Sprintf("%dms", interval.Milliseconds())
	return yaml.Marshal(map[string]any{
		"global":         map[string]string{"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
		"scrape_configs": jobs,
	})
}
