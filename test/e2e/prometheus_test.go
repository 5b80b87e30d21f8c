//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
	"github.com/carve-csi/carve/test/harness/promcheck"
)

// scrapeInterval is how often the test's Prometheus scrapes the bed.
const scrapeInterval = time.Second

// notOnBed are the series the e2e bed cannot have, each a selector with
// why. A dashboard query or an alert expression with no series is excused
// only when a selector of it that has none carries every matcher of one of
// these; and each of these must have no series on the bed, so the list
// cannot go stale. The device-mapper ones have series on the real-node
// tier's bed, where its TestPrometheus evaluates them.
var notOnBed = append([]promcheck.Missing{
	{Selector: `kube_pod_container_status_restarts_total`, Reason: noKubeStateMetrics},
	{Selector: `kube_persistentvolumeclaim_status_phase`, Reason: noKubeStateMetrics},
	{Selector: `kube_pod_spec_volumes_persistentvolumeclaims_info`, Reason: noKubeStateMetrics},
	{Selector: `kube_persistentvolumeclaim_info`, Reason: noKubeStateMetrics},
	{Selector: `kube_storageclass_info`, Reason: noKubeStateMetrics},
	{Selector: `carve_node_answers_refused_total`, Reason: noLyingNode},
	{Selector: `carve_volume_key_refusals_total`, Reason: noKeyRefused},
}, promcheck.DeviceMapperSeries()...)

// noKeyRefused: the counter of refused volume-key requests has a series
// only once carve controller refused one; no node of the bed asks for a
// key that is not its own.
const noKeyRefused = "no node agent of the e2e bed asks for another volume's key: carve_volume_key_refusals_total has a series only once carve controller refused a request (internal/controller/volumekey's TestReleaseOnlyToTheVolumesNode and the guest tier's TestEncryptedVolume drive refusals)"

// noLyingNode: the counter of refused node answers has a series only once
// a node's answer was refused; the bed's one lying agent (TestLyingNode,
// which counts them) leaves behind a restarted controller.
const noLyingNode = "no node agent lies to the controller TestPrometheus scrapes: carve_node_answers_refused_total has a series only once carve controller refused an answer, and TestLyingNode, which drives a lying agent and checks the counter, restarts the controller when it ends"

// noKubeStateMetrics: kube-state-metrics is not built like the Prometheus
// server because the Go module proxy refuses it (tried 2026-11-27:
// k8s.io/kube-state-metrics/v2's version list, @latest and @v2.17.0 all
// answer 403 "This module version is not available").
const noKubeStateMetrics = "kube-state-metrics does not run on the e2e bed: the Go module proxy refuses k8s.io/kube-state-metrics/v2 (403 \"This module version is not available\" for its version list, @latest and @v2.17.0), so it cannot be built like the Prometheus server"

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
	prom := cluster.StartPrometheusFor(t, ctx, bin, targets, scrapeInterval, 10*time.Minute)

	start := time.Now()
	driveEveryPhase(t, ctx)
	driven := time.Now()
	t.Logf("create, expand, snapshot, restore, delete driven in %s", driven.Sub(start).Round(time.Millisecond))

	// Two scrapes of every target after the drive, so that every series
	// it made has the two samples rate() needs. (Prometheus applies its
	// targets about 5 s after it starts; the drive may well end before.)
	waitFor(t, settle, fmt.Sprintf("every one of the %d targets up and scraped twice after the drive", len(targets)), func(ctx context.Context) (bool, string, error) {
		return promcheck.ScrapedTwiceSince(ctx, prom.API, driven, len(targets))
	})
	t.Logf("scraped %s after the drive", time.Since(driven).Round(time.Millisecond))

	qs := shippedQueries(t)
	var evaluated, excused int
	for _, q := range qs {
		n, err := promcheck.SeriesOf(ctx, prom.API, q.Expr)
		if err != nil {
			t.Errorf("%s: %s: %v", q.Where, q.Expr, err)
			continue
		}
		evaluated++
		if n > 0 {
			continue
		}
		if why, ok := emptyWhenHealthy[q.Panel]; ok {
			if err := promcheck.ProbesHaveSeries(ctx, prom.API, q.Expr, notOnBed); err != nil {
				t.Errorf("%s: %v", q.Where, err)
				continue
			}
			excused++
			t.Logf("%s: no series, as expected: %s; without its comparison it has series", q.Where, why)
			continue
		}
		reason, err := promcheck.Excuse(ctx, prom.API, q.Expr, notOnBed)
		if err != nil {
			t.Errorf("%s: no series for %s: %v", q.Where, q.Expr, err)
			continue
		}
		excused++
		t.Logf("%s: no series, as expected: %s", q.Where, reason)
	}
	for _, e := range notOnBed {
		if n, err := promcheck.SeriesOf(ctx, prom.API, e.Selector); err != nil || n > 0 {
			t.Errorf("%s has %d series on the bed (%v), though notOnBed says %q: drop the exception", e.Selector, n, err, e.Reason)
		}
	}
	t.Logf("%d queries evaluated, %d of them excused for metrics the bed cannot have, %s after the drive", evaluated, excused, time.Since(driven).Round(time.Millisecond))
}

// prometheusBin is the Prometheus server make deploy-tools installs in
// $CARVE_CACHE/bin.
func prometheusBin(t *testing.T) string {
	t.Helper()
	bin, err := promcheck.Server()
	if err != nil {
		t.Fatal(err)
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

	raiseClaim(t, ctx, ns, "data", gib(2))
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
	class := retainSnapshotClass(t, ctx, dc, ns)
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
		c, _, err := kubetest.BoundSnapshotContent(ctx, dc, ns, "snap")
		if err != nil {
			return false, "", err
		}
		if c == nil {
			return false, "no content bound yet", nil
		}
		msg, _, _ := unstructured.NestedString(c.Object, "status", "error", "message")
		ready, _, _ := unstructured.NestedBool(c.Object, "status", "readyToUse")
		return msg != "" || ready, fmt.Sprintf("status %v", c.Object["status"]), nil
	})
	deleteSnapshotObjects(t, dc, ns, "snap", class)
	deleted = true
}

// emptyWhenHealthy are the dashboard panels that show only what is wrong,
// through a comparison a healthy bed never meets, with why: their queries
// must have series once the comparison is taken off (probes).
var emptyWhenHealthy = map[string]string{
	"Device classes unavailable": "it counts the device classes that are unavailable (carve_device_class_available == 0), and every class of the bed is available",
}

// shippedQueries are the dashboard's queries and the alert expressions'
// parts (promcheck.Shipped).
func shippedQueries(t *testing.T) []promcheck.Query {
	t.Helper()
	qs, err := promcheck.Shipped(filepath.Join("..", "..", "deploy"))
	if err != nil {
		t.Error(err)
	}
	if len(qs) == 0 {
		t.FailNow()
	}
	return qs
}
