package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/klog/v2"
	streamhttp "k8s.io/streaming/pkg/httpstream"
	"sigs.k8s.io/yaml"
)

// The jobs of the test bed's metrics endpoints: the names of the chart's
// metrics Services, which its ServiceMonitor makes the job label.
const (
	JobNode        = "carve-node-metrics"
	JobController  = "carve-controller-metrics"
	JobProvisioner = "carve-provisioner-metrics"
	JobResizer     = "carve-resizer-metrics"
	JobSnapshotter = "carve-snapshotter-metrics"
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
// this bed, where the controller Deployment runs as processes: every node
// agent (with its node) and the controller Deployment's carve controller,
// csi-provisioner, csi-resizer and, when snapshots are on, csi-snapshotter.
// A bed whose carve runs in pods has PodScrapeTargets.
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
		if c.Central.SnapshotterMetricsURL != "" {
			ts = append(ts, ScrapeTarget{Job: JobSnapshotter, URL: c.Central.SnapshotterMetricsURL})
		}
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

// PodScrapeTargets are the endpoints the chart's ServiceMonitor scrapes on
// a bed whose carve runs in pods (a guest node's): every pod behind each
// of carve's Services (label app.kubernetes.io/name=carve in its
// namespace) that has a port named metrics, as job the Service's name and
// with the pod's node as node. A pod's port is reached through a port
// forward of the API server (the pods' addresses exist only inside the
// guest), on this host's loopback. ctx bounds the setup; the forwards
// last until stop is called.
func (c *Cluster) PodScrapeTargets(ctx context.Context) (targets []ScrapeTarget, stop func(), err error) {
	services, err := c.Client.CoreV1().Services(c.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{"app.kubernetes.io/name": "carve"}.String()})
	if err != nil {
		return nil, nil, fmt.Errorf("carve's Services: %w", err)
	}
	var stops []func()
	stop = func() {
		for _, s := range stops {
			s()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	for _, svc := range services.Items {
		i := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "metrics" })
		if i < 0 {
			continue
		}
		target := svc.Spec.Ports[i].TargetPort
		pods, err := c.Client.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: labels.SelectorFromSet(svc.Spec.Selector).String()})
		if err != nil {
			return nil, nil, fmt.Errorf("the pods of Service %s: %w", svc.Name, err)
		}
		for _, pod := range pods.Items {
			if pod.Status.Phase != corev1.PodRunning || pod.DeletionTimestamp != nil {
				continue
			}
			port, err := podPort(&pod, target)
			if err != nil {
				return nil, nil, fmt.Errorf("metrics Service %s: %w", svc.Name, err)
			}
			local, end, err := c.forwardPort(ctx, pod.Namespace, pod.Name, port)
			if err != nil {
				return nil, nil, err
			}
			stops = append(stops, end)
			targets = append(targets, ScrapeTarget{
				Job:    svc.Name,
				URL:    fmt.Sprintf("http://127.0.0.1:%d/metrics", local),
				Labels: map[string]string{"node": pod.Spec.NodeName},
			})
		}
	}
	if len(targets) == 0 {
		return nil, nil, fmt.Errorf("no running pod behind a metrics Service of carve in namespace %s", c.Namespace)
	}
	return targets, stop, nil
}

// podPort resolves a Service's targetPort on one of its pods.
func podPort(pod *corev1.Pod, target intstr.IntOrString) (int, error) {
	if target.Type == intstr.Int {
		return target.IntValue(), nil
	}
	for _, ct := range pod.Spec.Containers {
		for _, p := range ct.Ports {
			if p.Name == target.StrVal {
				return int(p.ContainerPort), nil
			}
		}
	}
	return 0, fmt.Errorf("pod %s/%s has no port named %s", pod.Namespace, pod.Name, target.StrVal)
}

// forwardPort forwards a loopback port of this host to the pod's port,
// through the API server and the pod's kubelet (websockets first, SPDY
// if the server refuses them, as kubectl port-forward does), and returns
// the loopback port and what ends the forward.
func (c *Cluster) forwardPort(ctx context.Context, ns, pod string, port int) (int, func(), error) {
	cfg := c.Control.Config
	u := c.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return 0, nil, err
	}
	dialer := spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	tunnel, err := portforward.NewSPDYOverWebsocketDialerForStreaming(u, cfg)
	if err != nil {
		return 0, nil, err
	}
	dialer = portforward.NewFallbackDialerForStreaming(tunnel, dialer, func(err error) bool {
		return streamhttp.IsUpgradeFailure(err) || streamhttp.IsHTTPSProxyError(err)
	})
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ready := make(chan struct{})
	fw, err := portforward.NewOnAddressesForStreamingWithContext(fctx, dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, ready, io.Discard, forwardLog{pod: ns + "/" + pod})
	if err != nil {
		cancel()
		return 0, nil, fmt.Errorf("port forward to %s/%s:%d: %w", ns, pod, port, err)
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		return 0, nil, fmt.Errorf("port forward to %s/%s:%d: %w", ns, pod, port, err)
	case <-ctx.Done():
		cancel()
		return 0, nil, fmt.Errorf("port forward to %s/%s:%d not ready: %w", ns, pod, port, ctx.Err())
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		cancel()
		return 0, nil, fmt.Errorf("port forward to %s/%s:%d: ports %v: %w", ns, pod, port, ports, err)
	}
	return int(ports[0].Local), func() {
		cancel()
		if err := <-done; err != nil {
			klog.InfoS("Port forward ended", "pod", ns+"/"+pod, "err", err)
		}
	}, nil
}

// forwardLog logs what the port forwarder reports of its connections
// (a scrape whose connection failed).
type forwardLog struct{ pod string }

func (l forwardLog) Write(p []byte) (int, error) {
	klog.InfoS("Port forward", "pod", l.pod, "message", strings.TrimSpace(string(p)))
	return len(p), nil
}

// StartPrometheusFor is StartPrometheus for test t: its data in a
// temporary directory of t, stopped when t ends, the tail of its log
// logged when t failed; a failed start fails t.
func StartPrometheusFor(t testing.TB, ctx context.Context, bin string, targets []ScrapeTarget, interval, lifetime time.Duration) *Prometheus {
	t.Helper()
	prom, err := StartPrometheus(ctx, bin, t.TempDir(), targets, interval, lifetime)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("prometheus log:\n%s", prom.Tail(30))
		}
		prom.Stop()
	})
	return prom
}
