//go:build deploytest

package deploy

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestAlertRulesBehave runs Prometheus' own rule checks on carve's rules:
// `promtool check rules` (syntax, templates) and `promtool test rules` on
// testdata/carve-rules.test.yaml (which alerts fire in each situation).
// A control renders the rules with a changed chart threshold and expects
// the same tests to fail, so the tests read the thresholds and the chart
// really sets them.
func TestAlertRulesBehave(t *testing.T) {
	root := repoRoot(t)
	promtool := tool(t, "promtool")
	rules := filepath.Join(root, "deploy", "prometheus", "carve-rules.yaml")
	if out, err := runErr(root, promtool, "check", "rules", rules); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	tests := filepath.Join(root, "test", "deploy", "testdata", "carve-rules.test.yaml")
	if out, err := runErr(root, promtool, "test", "rules", tests); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}

	// The control: CarveVolumeGroupAlmostFull at 2% free instead of 10%
	// no longer fires for a thick volume group at 5%.
	dir := t.TempDir()
	objs := renderChart(t, "--api-versions=monitoring.coreos.com/v1", "metrics.prometheusRule.enabled=true",
		"--set-json=metrics.prometheusRule.thresholds.volumeGroupFreeRatio=0.02", "--show-only=templates/monitoring.yaml")
	if len(objs) != 1 || objs[0].kind() != "PrometheusRule" {
		t.Fatalf("rendered %d objects, want the PrometheusRule", len(objs))
	}
	spec, err := yaml.Marshal(objs[0]["spec"])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), spec, 0o600); err != nil {
		t.Fatal(err)
	}
	testData, err := os.ReadFile(tests)
	if err != nil {
		t.Fatal(err)
	}
	changed := strings.Replace(string(testData), "../../../deploy/prometheus/carve-rules.yaml", "rules.yaml", 1)
	if err := os.WriteFile(filepath.Join(dir, "test.yaml"), []byte(changed), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runErr(dir, promtool, "test", "rules", "test.yaml")
	if err == nil || !strings.Contains(err.Error()+string(out), "CarveVolumeGroupAlmostFull") {
		t.Errorf("rules with volumeGroupFreeRatio=0.02 pass the tests written for 0.1 (err %v):\n%s", err, out)
	}
}

// TestRunbookAnchors: every alert has a runbook_url into docs/operations.md
// whose anchor is a heading there (GitHub's anchor for a heading: lower
// case, punctuation dropped, spaces as hyphens).
func TestRunbookAnchors(t *testing.T) {
	root := repoRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := mdAnchors(string(doc))
	n := 0
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			n++
			u, err := url.Parse(r.Annotations["runbook_url"])
			if err != nil || !strings.HasSuffix(u.Path, "/docs/operations.md") || u.Fragment == "" {
				t.Errorf("%s: runbook_url %q does not point into docs/operations.md", r.Alert, r.Annotations["runbook_url"])
				continue
			}
			if !anchors[u.Fragment] {
				t.Errorf("%s: docs/operations.md has no heading with anchor #%s", r.Alert, u.Fragment)
			}
		}
	}
	if n == 0 {
		t.Fatal("no rules")
	}
}
