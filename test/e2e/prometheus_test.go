//go:build e2e

package e2e

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

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// scrapeInterval is how often the test's Prometheus scrapes the bed.
const scrapeInterval = time.Second

// notOnBed are the series the e2e bed cannot have, each a selector with
// why. A dashboard query or an alert expression with no series is excused
// only when a selector of it that has none carries every matcher of one of
// these; and each of these must have no series on the bed, so the list
// cannot go stale.
var notOnBed = []struct{ selector, reason string }{
	{`kube_pod_container_status_restarts_total`, noKubeStateMetrics},
	{`kube_persistentvolumeclaim_status_phase`, noKubeStateMetrics},
	{`kube_pod_spec_volumes_persistentvolumeclaims_info`, noKubeStateMetrics},
	{`kube_persistentvolumeclaim_info`, noKubeStateMetrics},
	{`kube_storageclass_info`, noKubeStateMetrics},
	{`carve_thin_pool_data_percent`, noThinPool},
	{`carve_thin_pool_metadata_percent`, noThinPool},
	{`carve_thin_pool_zeroing`, noThinPool},
	{`carve_snapshot_cow_used_ratio`, noThickSnapshot},
	{`carve_snapshot_invalid`, noThickSnapshot},
}

const (
	noKubeStateMetrics = "kube-state-metrics does not run on the e2e bed"
	noThinPool         = "no thin class on the e2e bed: a thin pool needs device-mapper, which the host lacks"
	noThickSnapshot    = "no thick snapshot on the e2e bed: lvcreate --snapshot needs device-mapper"
)

// TestPrometheus: a real Prometheus (the release promtool comes from)
// scrapes every metrics endpoint the chart's ServiceMonitor scrapes on
// this bed, every second; once the bed has created, expanded, snapshotted,
// restored and deleted a volume, every query of the dashboard (Grafana's
// variables at their "All" values) and every alert rule's expression
// (with its threshold comparisons taken off, each side of an and/unless
// on its own, absent()'s argument for absent()) returns series, but for
// the metrics the bed cannot have (notOnBed). No kubelet runs on the bed,
// so there is no stage or publish (the real-node tier has them); the
// queries select no phase, so any phase feeds them.
func TestPrometheus(t *testing.T) {
	bin := prometheusBin(t)
	ctx := testCtx(t, 8*time.Minute)
	targets := bed.ScrapeTargets()
	prom, err := cluster.StartPrometheus(ctx, bin, t.TempDir(), targets, scrapeInterval, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("prometheus log:\n%s", prom.Tail(30))
		}
		prom.Stop()
	})

	start := time.Now()
	driveEveryPhase(t, ctx)
	driven := time.Now()
	t.Logf("create, expand, snapshot, restore, delete driven in %s", driven.Sub(start).Round(time.Millisecond))

	// Two scrapes of every target after the drive, so that every series
	// it made has the two samples rate() needs. (Prometheus applies its
	// targets about 5 s after it starts; the drive may well end before.)
	waitFor(t, settle, fmt.Sprintf("every one of the %d targets up and scraped twice after the drive", len(targets)), func(ctx context.Context) (bool, string, error) {
		up, err := instant(ctx, prom, "up == 1")
		if err != nil {
			return false, "", err
		}
		since := time.Since(driven).Milliseconds()
		scrapes, err := instant(ctx, prom, fmt.Sprintf("count_over_time(up[%dms]) >= 2", since))
		if err != nil {
			return false, "", err
		}
		return len(up) == len(targets) && len(scrapes) == len(targets),
			fmt.Sprintf("%d targets up, %d scraped twice in the %d ms since the drive", len(up), len(scrapes), since), nil
	})
	t.Logf("scraped %s after the drive", time.Since(driven).Round(time.Millisecond))

	qs := append(dashboardQueries(t), alertQueries(t)...)
	var evaluated, excused int
	for _, q := range qs {
		n, err := seriesOf(ctx, prom, q.expr)
		if err != nil {
			t.Errorf("%s: %s: %v", q.where, q.expr, err)
			continue
		}
		evaluated++
		if n > 0 {
			continue
		}
		if why, ok := emptyWhenHealthy[q.panel]; ok {
			if err := probesHaveSeries(ctx, prom, q.expr); err != nil {
				t.Errorf("%s: %v", q.where, err)
				continue
			}
			excused++
			t.Logf("%s: no series, as expected: %s; without its comparison it has series", q.where, why)
			continue
		}
		reason, err := excuse(ctx, prom, q.expr)
		if err != nil {
			t.Errorf("%s: no series for %s: %v", q.where, q.expr, err)
			continue
		}
		excused++
		t.Logf("%s: no series, as expected: %s", q.where, reason)
	}
	for _, e := range notOnBed {
		if n, err := seriesOf(ctx, prom, e.selector); err != nil || n > 0 {
			t.Errorf("%s has %d series on the bed (%v), though notOnBed says %q: drop the exception", e.selector, n, err, e.reason)
		}
	}
	t.Logf("%d queries evaluated, %d of them excused for metrics the bed cannot have, %s after the drive", evaluated, excused, time.Since(driven).Round(time.Millisecond))
}

// prometheusBin is the Prometheus server make deploy-tools installs in
// $CARVE_CACHE/bin.
func prometheusBin(t *testing.T) string {
	t.Helper()
	cache := os.Getenv("CARVE_CACHE")
	if cache == "" {
		t.Fatal("CARVE_CACHE is not set: run `make test-e2e`, which installs prometheus into $CARVE_CACHE/bin (make deploy-tools)")
	}
	bin := filepath.Join(cache, "bin", "prometheus")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: run `make deploy-tools`", err)
	}
	return bin
}

// driveEveryPhase runs one volume through what the bed can do: create,
// expand, a snapshot (carve's lvcreate of it fails on the bed, which has
// no device-mapper: the failure is what csi-snapshotter records), a
// restore (of a tagged LV; it fails at the copy for the same reason) and
// delete.
func driveEveryPhase(t *testing.T, ctx context.Context) {
	t.Helper()
	ns := newNamespace(t, "prom")
	createPVCAndPod(t, ctx, newPVC(ns, "data", thickSC, "1Gi"), newPod(ns, "app", "data"))
	pvName := waitBound(t, ns, "data", settle).Spec.VolumeName

	patch := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":"%s"}}}}`, resource.NewQuantity(gib(2), resource.BinarySI))
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "data", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("raise the claim to 2 GiB: %v", err)
	}
	waitFor(t, settle, "csi-resizer to record 2 GiB on the PV", func(ctx context.Context) (bool, string, error) {
		pv, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		size := pv.Spec.Capacity[corev1.ResourceStorage]
		return size.Value() == gib(2), "PV capacity " + size.String(), nil
	})

	snapshotOnce(t, ctx, ns, "data")

	// What a kubelet asks a node agent it registers (none runs here), so
	// that the node agents' Node and Identity series exist as on a real
	// node.
	for _, n := range bed.Nodes {
		conn, err := grpc.NewClient("unix://"+n.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}); err != nil {
			t.Errorf("GetPluginInfo of %s: %v", n.Name, err)
		}
		if _, err := csi.NewNodeClient(conn).NodeGetInfo(ctx, &csi.NodeGetInfoRequest{}); err != nil {
			t.Errorf("NodeGetInfo of %s: %v", n.Name, err)
		}
		// And one it refuses, for the errors panel's Node series.
		if _, err := csi.NewNodeClient(conn).NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("NodeGetVolumeStats without a volume ID of %s: %v, want InvalidArgument", n.Name, err)
		}
		_ = conn.Close()
	}

	holder := bed.Nodes[1] // not node-large, whose agent removes orphans
	size := taggedSnapshot(t, ctx, ns, "tagged", holder)
	group := "snapshot.storage.k8s.io"
	restore := newPVC(ns, "restored", thickSC, size)
	restore.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "tagged"}
	checkPlaced(t, ctx, restore, holder, "restore")

	zero := int64(0)
	if err := bed.Client.CoreV1().Pods(ns).Delete(ctx, "app", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatalf("delete pod app: %v", err)
	}
	if err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete claim data: %v", err)
	}
	waitFor(t, settle, "PV "+pvName+" deleted", func(ctx context.Context) (bool, string, error) {
		_, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		return false, fmt.Sprint(err), nil
	})
}

// snapshotOnce takes a VolumeSnapshot of claim, waits until
// csi-snapshotter records carve's answer, and deletes it again (a
// snapshot not ready keeps its source claim from being deleted).
func snapshotOnce(t *testing.T, ctx context.Context, ns, claim string) {
	t.Helper()
	dc := dynamicClient(t)
	class := "e2e-" + ns
	if _, err := dc.Resource(kubetest.VolumeSnapshotClasses).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
		"metadata":       map[string]any{"name": class},
		"driver":         cluster.DriverName,
		"deletionPolicy": "Retain",
	}}, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		t.Fatalf("create VolumeSnapshotClass: %v", err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			deleteSnapshotObjects(t, dc, ns, "snap", class)
		}
	})
	if err := kubetest.CreateVolumeSnapshot(ctx, dc, ns, "snap", class, claim); err != nil {
		t.Fatal(err)
	}
	waitFor(t, settle, "csi-snapshotter to record carve's answer to CreateSnapshot", func(ctx context.Context) (bool, string, error) {
		vs, err := dc.Resource(kubetest.VolumeSnapshots).Namespace(ns).Get(ctx, "snap", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		name, _, _ := unstructured.NestedString(vs.Object, "status", "boundVolumeSnapshotContentName")
		if name == "" {
			return false, "no content bound yet", nil
		}
		c, err := dc.Resource(kubetest.VolumeSnapshotContents).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		msg, _, _ := unstructured.NestedString(c.Object, "status", "error", "message")
		ready, _, _ := unstructured.NestedBool(c.Object, "status", "readyToUse")
		return msg != "" || ready, fmt.Sprintf("status %v", c.Object["status"]), nil
	})
	deleteSnapshotObjects(t, dc, ns, "snap", class)
	deleted = true
}

// promQuery is one expression of the dashboard or the rules, with where it
// comes from.
type promQuery struct {
	where, expr string
	// panel is the dashboard panel's title (empty for an alert).
	panel string
}

// emptyWhenHealthy are the dashboard panels that show only what is wrong,
// through a comparison a healthy bed never meets, with why: their queries
// must have series once the comparison is taken off (probes).
var emptyWhenHealthy = map[string]string{
	"Device classes unavailable": "it counts the device classes that are unavailable (carve_device_class_available == 0), and every class of the bed is available",
}

// grafanaVariable is a Grafana variable in a label matcher's value, as
// node=~"$node": the test sets each at its "All" value.
var grafanaVariable = regexp.MustCompile(`=~"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?"`)

// grafanaIntervalVar is an interval variable of Grafana, where PromQL wants
// a duration.
var grafanaIntervalVar = regexp.MustCompile(`\$\{?__(rate_interval|interval|range)\}?`)

// dashboardQueries are the dashboard's panel queries, each variable at its
// "All" value and the intervals at 5m (every series the drive made has two
// samples in that window).
func dashboardQueries(t *testing.T) []promQuery {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "grafana", "carve-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name     string `json:"name"`
				AllValue string `json:"allValue"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("carve-dashboard.json: %v", err)
	}
	all := map[string]string{}
	for _, v := range d.Templating.List {
		all[v.Name] = v.AllValue
	}
	var qs []promQuery
	var add func(p panel)
	add = func(p panel) {
		for i, tg := range p.Targets {
			expr := grafanaIntervalVar.ReplaceAllString(tg.Expr, "5m")
			expr = grafanaVariable.ReplaceAllStringFunc(expr, func(m string) string {
				name := grafanaVariable.FindStringSubmatch(m)[1]
				v, ok := all[name]
				if !ok || v == "" {
					t.Errorf("panel %q: variable $%s has no All value", p.Title, name)
				}
				return fmt.Sprintf("=~%q", v)
			})
			if strings.Contains(expr, "$") {
				t.Errorf("panel %q: a Grafana variable the test cannot set: %s", p.Title, tg.Expr)
				continue
			}
			qs = append(qs, promQuery{where: fmt.Sprintf("panel %q, query %d", p.Title, i+1), expr: expr, panel: p.Title})
		}
		// A collapsed row holds its panels.
		for _, raw := range p.Panels {
			var inner panel
			if err := json.Unmarshal(raw, &inner); err != nil {
				t.Fatalf("panel %q: %v", p.Title, err)
			}
			add(inner)
		}
	}
	for _, p := range d.Panels {
		add(p)
	}
	if len(qs) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return qs
}

// alertQueries are what each alert rule's expression is made of, each
// without its threshold: see probes.
func alertQueries(t *testing.T) []promQuery {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deploy", "prometheus", "carve-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rf struct {
		Groups []struct {
			Rules []struct {
				Alert, Record, Expr string
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(data, &rf); err != nil {
		t.Fatalf("carve-rules.yaml: %v", err)
	}
	var qs []promQuery
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = "record " + r.Record
			}
			e, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			for i, p := range probes(e) {
				qs = append(qs, promQuery{where: fmt.Sprintf("alert %s, part %d", name, i+1), expr: p.String()})
			}
		}
	}
	if len(qs) == 0 {
		t.Fatal("the rules have no expressions")
	}
	return qs
}

// probes are the parts of an alert expression that must have series on a
// healthy bed for the alert to be able to fire: a comparison with a
// number gives its other side; and, or and unless give each side; absent()
// gives its argument; an aggregation, the aggregation of each probe of
// what it aggregates; anything else is itself.
func probes(e parser.Expr) []parser.Expr {
	switch e := e.(type) {
	case *parser.ParenExpr:
		return probes(e.Expr)
	case *parser.AggregateExpr:
		var out []parser.Expr
		for _, p := range probes(e.Expr) {
			agg := *e
			agg.Expr = p
			out = append(out, &agg)
		}
		return out
	case *parser.BinaryExpr:
		switch {
		case e.Op == parser.LAND || e.Op == parser.LOR || e.Op == parser.LUNLESS:
			return append(probes(e.LHS), probes(e.RHS)...)
		case e.Op.IsComparisonOperator() && isNumber(e.RHS):
			return probes(e.LHS)
		case e.Op.IsComparisonOperator() && isNumber(e.LHS):
			return probes(e.RHS)
		}
	case *parser.Call:
		if e.Func.Name == "absent" || e.Func.Name == "absent_over_time" {
			return probes(e.Args[0])
		}
	}
	return []parser.Expr{e}
}

func isNumber(e parser.Expr) bool {
	for {
		switch x := e.(type) {
		case *parser.ParenExpr:
			e = x.Expr
		case *parser.NumberLiteral:
			return true
		default:
			return false
		}
	}
}

// instant evaluates expr now and returns its vector.
func instant(ctx context.Context, prom *cluster.Prometheus, expr string) (model.Vector, error) {
	v, _, _, err := prom.API.Query(ctx, expr, time.Now())
	if err != nil {
		return nil, fmt.Errorf("query %s: %w", expr, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("query %s: a %s, not a vector", expr, v.Type())
	}
	return vec, nil
}

// seriesOf is how many series expr returns now.
func seriesOf(ctx context.Context, prom *cluster.Prometheus, expr string) (int, error) {
	v, err := instant(ctx, prom, expr)
	return len(v), err
}

// probesHaveSeries checks that each probe of expr has series, or is
// excused (see excuse).
func probesHaveSeries(ctx context.Context, prom *cluster.Prometheus, expr string) error {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return err
	}
	for _, p := range probes(e) {
		n, err := seriesOf(ctx, prom, p.String())
		if err != nil {
			return err
		}
		if n > 0 {
			continue
		}
		if _, err := excuse(ctx, prom, p.String()); err != nil {
			return fmt.Errorf("no series for %s, without its comparison: %w", p, err)
		}
	}
	return nil
}

// excuse returns why expr may have no series on the bed: a metric it
// selects is in notOnBed and has no series. Otherwise it names the
// selectors of expr that have none.
func excuse(ctx context.Context, prom *cluster.Prometheus, expr string) (string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return "", err
	}
	var empty []string
	var reasons []string
	for _, vs := range vectorSelectors(e) {
		n, err := seriesOf(ctx, prom, vs.String())
		if err != nil {
			return "", err
		}
		if n > 0 {
			continue
		}
		if r, ok := excusedSelector(vs); ok {
			reasons = append(reasons, r)
			continue
		}
		empty = append(empty, vs.String())
	}
	switch {
	case len(reasons) > 0:
		slices.Sort(reasons)
		return strings.Join(slices.Compact(reasons), "; "), nil
	case len(empty) > 0:
		return "", fmt.Errorf("these selectors have no series on the bed: %s", strings.Join(empty, ", "))
	default:
		return "", fmt.Errorf("each selector has series, the expression has none")
	}
}

// excusedSelector tells whether vs carries every matcher of an entry of
// notOnBed, and that entry's reason.
func excusedSelector(vs *parser.VectorSelector) (string, bool) {
	has := map[string]bool{}
	for _, m := range vs.LabelMatchers {
		has[m.String()] = true
	}
	for _, e := range notOnBed {
		ms, err := parser.NewParser(parser.Options{}).ParseMetricSelector(e.selector)
		if err != nil {
			return fmt.Sprintf("notOnBed selector %s: %v", e.selector, err), false
		}
		if !slices.ContainsFunc(ms, func(m *labels.Matcher) bool { return !has[m.String()] }) {
			return e.selector + ": " + e.reason, true
		}
	}
	return "", false
}

// vectorSelectors are the vector selectors in e, with their metric name
// as Name.
func vectorSelectors(e parser.Expr) []*parser.VectorSelector {
	var out []*parser.VectorSelector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			if vs.Name == "" {
				for _, m := range vs.LabelMatchers {
					if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
						vs.Name = m.Value
					}
				}
			}
			out = append(out, vs)
		}
		return nil
	})
	return out
}
