//go:build deploytest

package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	nodeagentv1 "github.com/carve-csi/carve/api/nodeagent/v1"
	"github.com/carve-csi/carve/internal/controller/volumekey"

	"github.com/carve-csi/carve/internal/controller/objects"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/yaml"

	"github.com/carve-csi/carve/internal/controller/agents"
	"github.com/carve-csi/carve/internal/controller/audit"
	"github.com/carve-csi/carve/internal/controller/capacity"
	"github.com/carve-csi/carve/internal/controller/castore"
	"github.com/carve-csi/carve/internal/controller/mover"
	"github.com/carve-csi/carve/internal/controller/router"
	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/nodeca"
	"github.com/carve-csi/carve/test/harness/lvmtest"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// query is one PromQL expression of the dashboard or the rules, with where
// it comes from and the labels its legend or annotations print.
type query struct {
	where, expr string
	printed     []string
}

var templateLabel = regexp.MustCompile(`\{\{\s*\$?(?:labels\.)?\.?([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)

// dashboard is the part of a Grafana dashboard the checks read.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		GridPos struct{ X, Y, W, H int }
		Targets []struct {
			Expr         string `json:"expr"`
			LegendFormat string `json:"legendFormat"`
		} `json:"targets"`
		FieldConfig struct {
			Defaults struct {
				Max        *float64 `json:"max"`
				Thresholds struct {
					Steps []struct {
						Value *float64 `json:"value"`
					} `json:"steps"`
				} `json:"thresholds"`
			} `json:"defaults"`
		} `json:"fieldConfig"`
	} `json:"panels"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data := readRepoFile(t, "deploy", "grafana", "carve-dashboard.json")
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("carve-dashboard.json: %v", err)
	}
	return d
}

// ruleFile is a Prometheus rule file.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	data := readRepoFile(t, "deploy", "prometheus", "carve-rules.yaml")
	var r ruleFile
	if err := yaml.UnmarshalStrict(data, &r); err != nil {
		t.Fatalf("carve-rules.yaml: %v", err)
	}
	return r
}

// queries gathers every expression of the dashboard and the rules.
func queries(t *testing.T) []query {
	var qs []query
	d := loadDashboard(t)
	for _, p := range d.Panels {
		for i, tg := range p.Targets {
			var printed []string
			for _, m := range templateLabel.FindAllStringSubmatch(tg.LegendFormat, -1) {
				printed = append(printed, m[1])
			}
			qs = append(qs, query{where: fmt.Sprintf("dashboard panel %q target %d", p.Title, i), expr: tg.Expr, printed: printed})
		}
	}
	for _, v := range d.Templating.List {
		if q, ok := v.Query.(map[string]any); ok {
			if s, _ := q["query"].(string); strings.HasPrefix(s, "label_values(") {
				inner := strings.TrimSuffix(strings.TrimPrefix(s, "label_values("), ")")
				// The label is after the last comma: the selector has commas.
				i := strings.LastIndex(inner, ",")
				if i < 0 {
					t.Fatalf("dashboard variable %s: %q names no label", v.Name, s)
				}
				metric, label := inner[:i], inner[i+1:]
				qs = append(qs, query{where: "dashboard variable " + v.Name, expr: strings.TrimSpace(metric), printed: []string{strings.TrimSpace(label)}})
			}
		}
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			var printed []string
			for _, a := range r.Annotations {
				for _, m := range templateLabel.FindAllStringSubmatch(a, -1) {
					if m[1] != "value" {
						printed = append(printed, m[1])
					}
				}
			}
			qs = append(qs, query{where: "alert " + r.Alert, expr: r.Expr, printed: printed})
		}
	}
	return qs
}

// TestDashboardPanels: the dashboard shows what an operator looks for,
// each panel with a query, laid out on Grafana's 24-column grid.
func TestDashboardPanels(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Error("the dashboard has no uid or title")
	}
	ids := map[int]bool{}
	byTitle := map[string]string{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d is used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W <= 0 {
			t.Errorf("panel %q lies outside the grid: %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		var exprs []string
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
		byTitle[p.Title] = strings.Join(exprs, "\n")
	}
	for _, tc := range []struct {
		what    string
		pattern string
	}{
		{"rate of each phase", `rate\(carve_phase_duration_seconds_count`},
		{"p50 of each phase", `histogram_quantile\(0\.5, sum by \(le, phase\) \(rate\(carve_phase_duration_seconds_bucket`},
		{"p95 of each phase", `histogram_quantile\(0\.95, sum by \(le, phase\) \(rate\(carve_phase_duration_seconds_bucket`},
		{"p99 of each phase", `histogram_quantile\(0\.99, sum by \(le, phase\) \(rate\(carve_phase_duration_seconds_bucket`},
		{"errors by gRPC code", `by \(method_name, grpc_status_code\) \(rate\(csi_plugin_operations_seconds_count\{[^}]*grpc_status_code!="OK"`},
		{"free space per node and volume group, once per group", `^max by \(node, volume_group\) \(carve_volume_group_free_bytes\{`},
		{"reported capacity per node and device class", `^carve_capacity_available_bytes\{cluster=~"\$cluster", node=~"\$node", device_class=~"\$device_class"\}$`},
		{"node plugins that are down", `up\{job="carve-node-metrics"[^}]*\} == 0`},
		{"the controller's and sidecars' targets", `up\{job=~"carve-controller-metrics\|carve-resizer-metrics\|carve-provisioner-metrics\|carve-snapshotter-metrics"`},
		{"the versions running", `count by \(version, role\) \(carve_build_info`},
		{"container restarts", `kube_pod_container_status_restarts_total\{namespace="carve-system"`},
		{"thin pool data percent", `carve_thin_pool_data_percent`},
		{"thin pool metadata percent", `carve_thin_pool_metadata_percent`},
		{"volumes per node", `sum by \(node\) \(carve_volumes`},
		{"restore and clone copy throughput", `sum by \(node, phase, device_class\) \(rate\(carve_copy_bytes_total`},
		{"orphaned volumes per node and class", `sum by \(node, device_class\) \(carve_orphaned_volumes\{`},
		{"orphaned bytes per node and class", `sum by \(node, device_class\) \(carve_orphaned_volume_bytes\{`},
		{"volumes with missing data per node", `sum by \(node\) \(carve_volumes_missing\{`},
		{"device classes unavailable, by reason", `count by \(node, device_class, reason\) \(carve_device_class_available\{[^}]*\} == 0\)`},
		{"quarantined orphans per node and class", `sum by \(node, device_class\) \(carve_quarantined_volumes\{`},
		{"abnormal volumes per node and volume group", `sum by \(node, volume_group\) \(carve_volumes_abnormal\{`},
		{"thick snapshots' space used", `max by \(node, volume_group, snapshot\) \(carve_snapshot_cow_used_ratio\{`},
		{"volumes of deleted nodes (the controller's)", `max by \(cluster\) \(carve_lost_node_volumes\{`},
		{"claims and PVs of deleted nodes deleted", `sum by \(object, result\) \(increase\(carve_lost_node_volumes_deleted_total\{`},
		{"LVM command latency", `histogram_quantile\(0\.\d+, sum by \(le, command\) \(rate\(carve_lvm_command_duration_seconds_bucket`},
	} {
		re := regexp.MustCompile("(?m)" + tc.pattern)
		found := false
		for _, exprs := range byTitle {
			if re.MatchString(exprs) {
				found = true
			}
		}
		if !found {
			t.Errorf("no panel shows the %s (no query matches %s)", tc.what, tc.pattern)
		}
	}

	// The first row answers "is it up"; every query that picks nodes also
	// picks the cluster (a hidden variable, as in kube-prometheus' mixins,
	// for a Prometheus that holds several clusters).
	if len(d.Panels) == 0 || d.Panels[0].Type != "row" || d.Panels[0].Title != "Is it up" {
		t.Error(`the dashboard does not start with the row "Is it up"`)
	}
	hasCluster := false
	for _, v := range d.Templating.List {
		hasCluster = hasCluster || v.Name == "cluster"
	}
	if !hasCluster {
		t.Error("no cluster variable")
	}
	for title, exprs := range byTitle {
		for _, e := range strings.Split(exprs, "\n") {
			if strings.Contains(e, `node=~"$node"`) && !strings.Contains(e, `cluster=~"$cluster"`) {
				t.Errorf("panel %q picks nodes but not the cluster: %s", title, e)
			}
		}
	}
	// A routed Controller call is counted by carve controller and by the
	// node agent that served it: each query of the CSI metric counts one
	// side, the controller's calls or the kubelet's calls of the nodes.
	for title, exprs := range byTitle {
		for _, e := range strings.Split(exprs, "\n") {
			if !strings.Contains(e, "csi_plugin_operations_seconds") {
				continue
			}
			controller := strings.Contains(e, `job="carve-controller-metrics"`)
			node := strings.Contains(e, `job="carve-node-metrics", method_name=~"/csi.v1.(Node|Identity)/.*"`)
			if controller == node {
				t.Errorf("panel %q counts routed CSI calls twice or not at all (want the controller's job, or the node's job for Node and Identity calls only): %s", title, e)
			}
		}
	}
	// The fill levels show the alerts' thresholds, on a 0-100 scale.
	for _, p := range d.Panels {
		if !strings.HasPrefix(p.Title, "Thin pool") {
			continue
		}
		steps := p.FieldConfig.Defaults.Thresholds.Steps
		var levels []float64
		for _, st := range steps {
			if st.Value != nil {
				levels = append(levels, *st.Value)
			}
		}
		if p.FieldConfig.Defaults.Max == nil || *p.FieldConfig.Defaults.Max != 100 || !slices.Equal(levels, []float64{80, 95}) {
			t.Errorf("panel %q: max %v, thresholds %v; want max 100, thresholds at 80 and 95", p.Title, p.FieldConfig.Defaults.Max, levels)
		}
	}
}

// TestAlertRules: each alert has a severity, a summary, a description and a
// runbook_url, a duration, and the situations operators meet are covered
// (their behaviour: TestAlertRulesBehave).
func TestAlertRules(t *testing.T) {
	rf := loadRules(t)
	alerts := map[string]string{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s has a rule without an alert name", g.Name)
				continue
			}
			alerts[r.Alert] = r.Expr
			if !slices.Contains([]string{"info", "warning", "critical"}, r.Labels["severity"]) {
				t.Errorf("%s: severity %q", r.Alert, r.Labels["severity"])
			}
			if r.Annotations["summary"] == "" || r.Annotations["description"] == "" || r.Annotations["runbook_url"] == "" {
				t.Errorf("%s: no summary, description or runbook_url", r.Alert)
			}
			if _, err := time.ParseDuration(r.For); err != nil {
				t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
			}
		}
	}
	for _, tc := range []struct{ alert, metric string }{
		{"CarveVolumeGroupAlmostFull", "carve_volume_group_free_bytes"},
		{"CarveThinPoolDataHigh", "carve_thin_pool_data_percent"},
		{"CarveThinPoolMetadataHigh", "carve_thin_pool_metadata_percent"},
		{"CarveThinPoolNotZeroing", "carve_thin_pool_zeroing"},
		{"CarveVolumeGroupMetadataAlmostFull", "carve_volume_group_metadata_free_bytes"},
		{"CarveThinPoolMetadataCritical", "carve_thin_pool_metadata_percent"},
		{"CarveThinPoolFillingUp", "carve_thin_pool_data_percent"},
		{"CarvePVCPendingTooLong", "kube_persistentvolumeclaim_status_phase"},
		{"CarvePhaseErrorRateHigh", "carve_phase_duration_seconds_count"},
		{"CarvePluginDown", "up"},
		{"CarvePluginAbsent", "up"},
		{"CarveStateRefreshStale", "carve_state_refresh_timestamp_seconds"},
		{"CarveOrphanedVolumes", "carve_orphaned_volumes"},
		{"CarveVolumeDataMissing", "carve_volumes_missing"},
		{"CarveAuditStale", "carve_audit_timestamp_seconds"},
		{"CarveLostNodeVolumes", "carve_lost_node_volumes"},
		{"CarveMoveParked", "carve_moves_parked"},
		{"CarveCapacityDeletionsHeld", "carve_capacity_deletions_held"},
		{"CarveIOLimitsNotApplied", "carve_io_limit_applications_total"},
		{"CarveVolumeKeyRefused", "carve_volume_key_refusals_total"},
		{"CarveEncryptedVolumeNotOpened", "carve_encrypted_volume_opens_total"},
	} {
		expr, ok := alerts[tc.alert]
		if !ok {
			t.Errorf("no alert %s", tc.alert)
			continue
		}
		if !slices.Contains(metricNames(expr), tc.metric) {
			t.Errorf("%s does not use %s: %s", tc.alert, tc.metric, expr)
		}
	}
}

// promSynthesized are series Prometheus makes itself for every target.
var promSynthesized = map[string]bool{"up": true}

// kubeStateMetrics are kube-state-metrics' series some rules join with
// (documented as a dependency in docs/operations.md), with their labels.
var kubeStateMetrics = map[string][]string{
	"kube_persistentvolumeclaim_status_phase":           {"namespace", "persistentvolumeclaim", "phase"},
	"kube_persistentvolumeclaim_info":                   {"namespace", "persistentvolumeclaim", "storageclass", "volumename"},
	"kube_pod_spec_volumes_persistentvolumeclaims_info": {"namespace", "pod", "volume", "persistentvolumeclaim"},
	"kube_storageclass_info":                            {"storageclass", "provisioner", "reclaim_policy", "volume_binding_mode"},
	"kube_pod_container_status_restarts_total":          {"namespace", "pod", "container"},
}

// sidecarMetrics are the series of csi-provisioner, csi-snapshotter and
// csi-resizer (scraped through carve-provisioner-metrics,
// carve-snapshotter-metrics and carve-resizer-metrics) the dashboard's
// "CSI sidecars" row charts, with their labels; the e2e
// tier's TestPrometheus sees each of them from the real sidecars.
var sidecarMetrics = map[string][]string{
	"csi_sidecar_operations_seconds_count":                               {"driver_name", "method_name", "grpc_status_code"},
	"csi_sidecar_operations_seconds_bucket":                              {"driver_name", "method_name", "grpc_status_code"},
	"controller_persistentvolumeclaim_provision_total":                   {"class", "source"},
	"controller_persistentvolumeclaim_provision_failed_total":            {"class", "source"},
	"controller_persistentvolumeclaim_provision_duration_seconds_bucket": {"class", "source"},
	"controller_persistentvolume_delete_total":                           {"class"},
	"workqueue_depth":                         {"name"},
	"workqueue_queue_duration_seconds_bucket": {"name"},
	"workqueue_retries_total":                 {"name"},
	"leader_election_master_status":           {"name"},
}

// targetLabels are labels that come from the scrape, not from the plugin:
// the ServiceMonitor adds node; Prometheus adds job and instance, and a
// multi-cluster setup cluster (an external label); le is a
// histogram bucket's bound.
var targetLabels = map[string]bool{"node": true, "job": true, "instance": true, "le": true, "cluster": true}

// makeMetadataThinPool turns two thick LVs into a thin pool by rewriting the
// VG's metadata: the host has no device-mapper, so lvcreate cannot make a
// thin pool, but LVM takes one through vgcfgrestore, and the plugin then
// serves (and reports gauges for) a thin class on it. Its usage percents
// read as unknown without a kernel, so the gauges are present but zero.
func makeMetadataThinPool(t *testing.T, vg *lvmtest.LoopVG, pool string) {
	t.Helper()
	ctx := context.Background()
	for _, lv := range []struct{ name, size string }{{"tpdata", "256m"}, {"tpmeta", "8m"}} {
		if out, err := vg.LVM(ctx, "lvcreate", "-q", "-an", "-Zn", "-L", lv.size, "-n", lv.name, vg.Name); err != nil {
			t.Fatalf("lvcreate %s: %v\n%s", lv.name, err, out)
		}
	}
	backup := filepath.Join(t.TempDir(), "vg.txt")
	if out, err := vg.LVM(ctx, "vgcfgbackup", "-q", "-f", backup, vg.Name); err != nil {
		t.Fatalf("vgcfgbackup: %v\n%s", err, out)
	}
	data, err := os.ReadFile(backup)
	if err != nil {
		t.Fatal(err)
	}
	meta := string(data)
	extents := regexp.MustCompile(`(?s)\ttpdata \{.*?extent_count = (\d+)`).FindStringSubmatch(meta)
	if extents == nil {
		t.Fatalf("no tpdata LV in the metadata:\n%s", meta)
	}
	meta = strings.Replace(meta, "\t\ttpdata {", "\t\t"+pool+"_tdata {", 1)
	meta = strings.Replace(meta, "\t\ttpmeta {", "\t\t"+pool+"_tmeta {", 1)
	meta = strings.ReplaceAll(meta, `status = ["READ", "WRITE", "VISIBLE"]`, `status = ["READ", "WRITE"]`)
	poolLV := fmt.Sprintf(`
		%[1]s {
			id = "carve0-test-pool-meta-only-0000-000000"
			status = ["READ", "WRITE", "VISIBLE"]
			flags = []
			segment_count = 1

			segment1 {
				start_extent = 0
				extent_count = %[2]s
				type = "thin-pool"
				metadata = "%[1]s_tmeta"
				pool = "%[1]s_tdata"
				transaction_id = 0
				chunk_size = 128
				discards = "passdown"
				zero_new_blocks = 1
			}
		}
`, pool, extents[1])
	i := strings.Index(meta, "logical_volumes {")
	if i < 0 {
		t.Fatal("no logical_volumes section in the metadata")
	}
	i += len("logical_volumes {")
	meta = meta[:i] + poolLV + meta[i:]
	if err := os.WriteFile(backup, []byte(meta), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := vg.LVM(ctx, "vgcfgrestore", "--force", "-f", backup, vg.Name); err != nil {
		t.Fatalf("vgcfgrestore of a thin pool: %v\n%s", err, out)
	}
	out, err := vg.LVM(ctx, "lvs", "--noheadings", "-o", "segtype", vg.Name+"/"+pool)
	if err != nil || strings.TrimSpace(string(out)) != "thin-pool" {
		t.Fatalf("%s/%s is not a thin pool after the restore: %v %q", vg.Name, pool, err, out)
	}
}

// auditMetrics are the series of carve controller's audit after one pass
// over one node: the audit exports a node's series once it has audited
// it, over the node channel, which the controller above (no API server)
// does not open. The audit's own code makes them, over a node agent's
// inventory given here.
func auditMetrics(t *testing.T) plugintest.Metrics {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	a := audit.New(audit.Config{Driver: "lvm.carve.dev", TopologyKey: "topology.carve.dev/node", Client: fake.NewClientset(),
		Nodes: oneNode{}, Grace: time.Minute, Interval: time.Minute, Registerer: reg, Events: record.NewFakeRecorder(10)})
	a.Pass(t.Context(), time.Now(), nil)
	return gather(t, reg)
}

// moverMetrics are the mover's: carve controller runs it only with the
// node channel, which the controller here does not have.
func moverMetrics(t *testing.T) plugintest.Metrics {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	r := router.New(router.Config{})
	client := fake.NewClientset()
	if _, err := mover.New(mover.Config{Client: client, Objects: objects.New(client, "lvm.carve.dev", nil), Driver: "lvm.carve.dev", TopologyKey: "topology.carve.dev/node",
		Volumes: r, CatchUp: r, Events: record.NewFakeRecorder(10), Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	return gather(t, reg)
}

// gather is what reg holds, by family name.
func gather(t *testing.T, reg *prometheus.Registry) plugintest.Metrics {
	t.Helper()
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	m := plugintest.Metrics{}
	for _, f := range got {
		m[f.GetName()] = f
	}
	return m
}

// refusalMetrics are the router's counts of refused node answers: a
// controller exports a series only once a node has lied, which no
// running controller here does.
func refusalMetrics(t *testing.T) plugintest.Metrics {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	r, err := router.NewRefusals(reg)
	if err != nil {
		t.Fatal(err)
	}
	r.Count("n1", "topology")
	return gather(t, reg)
}

// volumeKeyMetrics are the volume keys' releaser's; its refusals by node
// and reason show once one is counted (here a request naming no volume).
func volumeKeyMetrics(t *testing.T) plugintest.Metrics {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	r, err := volumekey.NewReleaser(nil, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	if ans := r.Answer(t.Context(), "n1", &nodeagentv1.VolumeKeyRequest{}); ans.GetRefused() == "" {
		t.Fatal("a request for the key of no volume was not refused")
	}
	return gather(t, reg)
}

// capacityMetrics are the capacity writer's: a controller registers them
// only with --node-channel-service, which the controller above (no API
// server, no node agents) runs without. The writer exports both from its
// start.
func capacityMetrics(t *testing.T) plugintest.Metrics {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if _, err := capacity.New(capacity.Config{Client: fake.NewClientset(), Namespace: "carve-system",
		Driver: "lvm.carve.dev", TopologyKey: "topology.carve.dev/node", Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	m := gather(t, reg)
	if m["carve_capacity_deletions_held"] == nil {
		t.Fatal("the capacity writer does not export carve_capacity_deletions_held from its start")
	}
	return m
}

// nodeChannelMetrics are the CA store's and the agent pool's: a
// controller registers them only with --node-channel-service, and the
// pool exports a node's certificate expiry only once it has enrolled it.
func nodeChannelMetrics(t *testing.T) plugintest.Metrics {
	t.Helper()
	ctx := context.Background()
	reg := prometheus.NewPedanticRegistry()
	client := fake.NewClientset()
	store, err := castore.New(castore.Config{Client: client, Namespace: "carve-system", Name: "carve-node-channel-ca", Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	iss, err := nodeca.NewIssuer(st.Active, nodeca.IssuerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	own, err := iss.IssueController()
	if err != nil {
		t.Fatal(err)
	}
	pool, err := agents.New(agents.Config{Client: client, Namespace: "carve-system", Service: "carve-node", PortName: "node-channel",
		ServiceAccount: "carve-node", Audience: "carve-controller", Issuer: iss, Identity: nodeca.NewKeypair(own),
		Trust: nodeca.NewPool(st.Trusted()...), Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := pool.Reissue(ctx); err != nil { // the controller's own certificate's series
		t.Fatal(err)
	}
	return gather(t, reg)
}

// snapshotMetrics are the per-snapshot series of a plugin with one thick
// snapshot: a plugin exports them only for snapshots that exist, and a
// copy-on-write snapshot needs device-mapper, which the plugin above
// (activation disabled) does not have. The recorder the plugin uses makes
// them, from the state its volume-group view hands it.
func snapshotMetrics(t *testing.T) plugintest.Metrics {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	metrics.NewRecorder(reg).SetSnapshotStates([]metrics.SnapshotState{
		{DeviceClass: "thick", VolumeGroup: "vg", Snapshot: "carvesnap-1", COWUsedRatio: 0.5}})
	m := gather(t, reg)
	for name := range m {
		if !strings.HasPrefix(name, "carve_snapshot_") {
			delete(m, name)
		}
	}
	if len(m) != 2 {
		t.Fatalf("the recorder made %d carve_snapshot_* families, want 2", len(m))
	}
	return m
}

// oneNode is one node agent with one device class and no LV.
type oneNode struct{}

func (oneNode) Names() []string { return []string{"node-a"} }

func (oneNode) Inventory(context.Context, string) (*audit.Inventory, error) {
	return &audit.Inventory{Classes: []audit.Class{{Name: "thick", VolumeGroup: "vg"}}}, nil
}

func (oneNode) QuarantineOrphan(context.Context, string, string, string, time.Time) (string, error) {
	return "", nil
}

func (oneNode) RemoveOrphan(context.Context, string, string, string, string) error { return nil }

func (oneNode) VolumeHealth(context.Context, string) ([]audit.VolumeHealth, error) {
	return nil, nil
}

func (oneNode) InvalidSnapshots(context.Context, string) ([]string, error) { return nil, nil }

// TestDashboardAndRulesUseExportedMetrics starts a real `carve node` on a
// loop-device volume group (activation disabled: metadata only), with a
// thick and a thin class, drives the phases that work without a kernel
// device (capacity, create, delete, and a create that does not fit), scrapes
// /metrics, scrapes a real `carve controller` too (and takes the audit's
// series from one pass of the controller's audit), and checks every metric
// and label the dashboard and the alert rules use against what the two
// export: a name neither exports fails.
func TestDashboardAndRulesUseExportedMetrics(t *testing.T) {
	lvmtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	vg := lvmtest.New(t, lvmtest.Options{Dir: dir, Name: lvmtest.UniqueName("carvedeploy"), Size: 1 << 30})
	makeMetadataThinPool(t, vg, "pool0")

	bin := filepath.Join(dir, "carve")
	if out, err := runErr(repoRoot(t), "go", "build", "-o", bin, "./cmd/carve"); err != nil {
		t.Fatalf("building carve: %v\n%s", err, out)
	}
	// carve controller's lost-node watch runs against an API server that
	// is not there: nothing listens on port 1.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
`), 0o600); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	p, err := plugintest.Start(ctx, plugintest.Options{
		Binary:   bin,
		Dir:      dir,
		NodeName: "node-a",
		Config: fmt.Sprintf(`deviceClasses:
  - name: thick
    volumeGroup: %[1]s
    default: true
    spare: 64Mi
  - name: thin
    volumeGroup: %[1]s
    thinPool: pool0
    overprovisionRatio: 2
`, vg.Name),
		Env: vg.Env(),
		Log: &log,
	})
	if err != nil {
		t.Fatalf("%v\nplugin log:\n%s", err, log.String())
	}
	defer func() {
		if err := p.Stop(10 * time.Second); err != nil {
			t.Errorf("stopping the plugin: %v", err)
		}
	}()

	ctrl := csi.NewControllerClient(p.Conn)
	topo := &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{"topology.carve.dev/node": "node-a"}}}}
	for _, class := range []string{"thick", "thin"} {
		if _, err := ctrl.GetCapacity(ctx, &csi.GetCapacityRequest{
			Parameters:         map[string]string{"carve.dev/device-class": class},
			AccessibleTopology: topo.Requisite[0],
			VolumeCapabilities: []*csi.VolumeCapability{plugintest.MountCapability("ext4")},
		}); err != nil {
			t.Errorf("GetCapacity %s: %v", class, err)
		}
	}
	vol, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:                      "pvc-deploy-metrics",
		CapacityRange:             &csi.CapacityRange{RequiredBytes: 16 << 20},
		VolumeCapabilities:        []*csi.VolumeCapability{plugintest.MountCapability("ext4")},
		Parameters:                map[string]string{"carve.dev/device-class": "thick"},
		AccessibilityRequirements: topo,
	})
	if err != nil {
		t.Fatalf("CreateVolume: %v\nplugin log:\n%s", err, log.String())
	}
	if _, err := ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolume().GetVolumeId()}); err != nil {
		t.Errorf("DeleteVolume: %v", err)
	}
	// Too big for the VG: ResourceExhausted, so errors show up too.
	if _, err := ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:                      "pvc-deploy-too-big",
		CapacityRange:             &csi.CapacityRange{RequiredBytes: 64 << 30},
		VolumeCapabilities:        []*csi.VolumeCapability{plugintest.MountCapability("ext4")},
		Parameters:                map[string]string{"carve.dev/device-class": "thick"},
		AccessibilityRequirements: topo,
	}); err == nil {
		t.Error("CreateVolume of 64 GiB on a 1 GiB VG succeeded")
	}

	pluginFams, err := p.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// carve controller, beside it, exports the lost-node watch's metrics
	// (registered at start, before it leads): with the same unreachable
	// API server it serves them while it tries for the Lease.
	var ctrlLog strings.Builder
	c, err := plugintest.StartController(ctx, plugintest.ControllerOptions{
		Binary:     bin,
		Dir:        dir,
		Kubeconfig: kubeconfig,
		ExtraArgs:  []string{"--leader-election-namespace=carve-system"},
		Log:        &ctrlLog,
	})
	if err != nil {
		t.Fatalf("%v\ncontroller log:\n%s", err, ctrlLog.String())
	}
	defer func() {
		if err := c.Stop(10 * time.Second); err != nil {
			t.Errorf("stopping the controller: %v", err)
		}
	}()
	ctrlFams, err := c.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// A name counts as exported when the plugin or the controller exports
	// it, with the labels either gives it.
	fams := plugintest.Metrics{}
	labelSets := map[string]map[string]bool{} // series name -> label names
	for _, scraped := range []plugintest.Metrics{pluginFams, ctrlFams, auditMetrics(t), snapshotMetrics(t), refusalMetrics(t), volumeKeyMetrics(t), moverMetrics(t), capacityMetrics(t), nodeChannelMetrics(t)} {
		for name, f := range scraped {
			fams[name] = f
			names := []string{name}
			if f.GetType() == dto.MetricType_HISTOGRAM {
				names = append(names, name+"_bucket", name+"_count", name+"_sum")
			}
			for _, n := range names {
				if labelSets[n] == nil {
					labelSets[n] = map[string]bool{}
				}
				for _, m := range f.GetMetric() {
					for _, l := range m.GetLabel() {
						labelSets[n][l.GetName()] = true
					}
				}
			}
		}
	}
	exported := map[string][]string{} // series name -> label names
	for n, labels := range labelSets {
		exported[n] = sortedKeys(labels)
	}

	used := map[string]bool{}
	for _, q := range queries(t) {
		if _, err := parseQuery(q.expr); err != nil {
			t.Errorf("%s does not parse: %v", q.where, err)
			continue
		}
		metrics := metricNames(q.expr)
		if len(metrics) == 0 {
			t.Errorf("%s: no metric in %q", q.where, q.expr)
		}
		labelsOf := map[string]bool{}
		for _, m := range metrics {
			used[m] = true
			labels, ok := exported[m]
			switch {
			case promSynthesized[m]:
				labelsOf["job"], labelsOf["instance"] = true, true
			case kubeStateMetrics[m] != nil:
				labels = kubeStateMetrics[m]
			case sidecarMetrics[m] != nil:
				labels = sidecarMetrics[m]
			case !ok:
				t.Errorf("%s uses %s, which neither the running plugin nor the running controller exports", q.where, m)
			}
			for _, l := range labels {
				labelsOf[l] = true
			}
		}
		for _, l := range append(labelNames(q.expr), q.printed...) {
			if !labelsOf[l] && !targetLabels[l] {
				t.Errorf("%s uses label %q, which none of %v carries", q.where, l, metrics)
			}
		}
	}
	var carveExported []string
	for name := range fams {
		if strings.HasPrefix(name, "carve_") {
			carveExported = append(carveExported, name)
		}
	}
	for _, name := range carveExported {
		if !used[name] && !used[name+"_bucket"] && !used[name+"_count"] {
			t.Logf("note: %s is exported but neither charted nor alerted on", name)
		}
	}
	t.Logf("the dashboard and the rules use %d metrics; the plugin and the controller export %d families (%d carve_*; the controller %d)", len(used), len(fams), len(carveExported), len(ctrlFams))
}
