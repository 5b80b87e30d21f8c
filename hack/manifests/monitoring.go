package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// monitoringValues turn on the chart's monitoring objects for the component
// and the plain rule file.
var monitoringValues = []string{
	"metrics.serviceMonitor.enabled=true",
	"metrics.prometheusRule.enabled=true",
	"dashboard.enabled=true",
}

// generateMonitoring writes the kustomize component (the chart's
// ServiceMonitor, PrometheusRule and dashboard ConfigMap with default
// values, in a Component with its kustomization.yaml) into componentDir,
// and the PrometheusRule's groups as a plain Prometheus rule file to
// rulesFile. Either may be empty to skip it.
func generateMonitoring(helm, chart, componentDir, rulesFile string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	argv := []string{"template", "carve", chart, "--namespace", Namespace, "--kube-version", kubeVersion,
		"--api-versions", "monitoring.coreos.com/v1", "--show-only", "templates/monitoring.yaml"}
	for _, v := range monitoringValues {
		argv = append(argv, "--set", v)
	}
	cmd := exec.CommandContext(ctx, helm, argv...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	rendered, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("helm template (monitoring): %w\n%s", err, stderr.String())
	}
	files, err := split(rendered)
	if err != nil {
		return err
	}
	objects, ok := files["monitoring.yaml"]
	if !ok {
		return fmt.Errorf("templates/monitoring.yaml rendered nothing with %v", monitoringValues)
	}
	if componentDir != "" {
		if err := os.MkdirAll(componentDir, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(componentDir, "monitoring.yaml"), objects, 0o644); err != nil {
			return err
		}
		k := header + `# carve's monitoring as a kustomize component: the ServiceMonitor (all four
# metrics Services), the PrometheusRule and the Grafana dashboard ConfigMap
# (label grafana_dashboard: "1"). Use it from an overlay:
#   components: [<path to deploy/kubernetes>/components/monitoring]
# kube-prometheus-stack selects ServiceMonitors and PrometheusRules by its
# release label: add it in the overlay (docs/operations.md, "Monitoring").
apiVersion: kustomize.config.k8s.io/v1alpha1
kind: Component
resources:
  - monitoring.yaml
`
		if err := os.WriteFile(filepath.Join(componentDir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			return err
		}
	}
	if rulesFile == "" {
		return nil
	}
	for _, doc := range strings.Split(string(objects), "\n---\n") {
		var o struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			return fmt.Errorf("the rendered monitoring objects: %w", err)
		}
		if o.Kind != "PrometheusRule" {
			continue
		}
		// The spec's lines, one level out: the chart's own layout and order.
		_, spec, ok := strings.Cut(doc, "\nspec:\n")
		if !ok {
			return fmt.Errorf("the PrometheusRule has no spec:\n%s", doc)
		}
		var groups strings.Builder
		for _, line := range strings.Split(strings.TrimRight(spec, "\n"), "\n") {
			groups.WriteString(strings.TrimPrefix(line, "  ") + "\n")
		}
		h := strings.ReplaceAll(header, "Helm chart in deploy/helm/carve", "Helm chart's templates/_rules.tpl")
		h += `# carve's Prometheus alert rules as a plain rule file (rule_files:); the
# chart's PrometheusRule and the kustomize component carry the same rules.
# They expect the scrape to add a node label (docs/operations.md,
# "Monitoring"). Thresholds: the chart's metrics.prometheusRule values.
`
		return os.WriteFile(rulesFile, []byte(h+groups.String()), 0o644)
	}
	return fmt.Errorf("no PrometheusRule among the rendered monitoring objects")
}
