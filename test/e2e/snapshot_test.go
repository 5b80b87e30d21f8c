//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// managedByLabel is the label snapshot-controller puts on a
// VolumeSnapshotContent, with --enable-distributed-snapshotting, naming
// the node whose csi-snapshotter is to act on it. The shipped layout runs
// one csi-snapshotter beside carve controller and no longer sets it: a
// content carrying it must still work.
const managedByLabel = "snapshot.storage.kubernetes.io/managed-by"

// dynamicClient is a dynamic client of the bed's API server (for the
// snapshot API).
func dynamicClient(t *testing.T) dynamic.Interface {
	t.Helper()
	return kubetest.DynamicClient(t, bed.Control.Config)
}

// retainSnapshotClass creates VolumeSnapshotClass "e2e-"+ns of carve
// with deletionPolicy Retain, with strict field validation, and returns
// its name.
func retainSnapshotClass(t *testing.T, ctx context.Context, dc dynamic.Interface, ns string) string {
	t.Helper()
	class := "e2e-" + ns
	if _, err := dc.Resource(kubetest.VolumeSnapshotClasses).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
		"metadata":       map[string]any{"name": class},
		"driver":         cluster.DriverName,
		"deletionPolicy": "Retain",
	}}, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		t.Fatalf("create VolumeSnapshotClass: %v", err)
	}
	return class
}

// TestSnapshotControllerAccepted: every object of
// deploy/kubernetes/snapshot-controller (the snapshot CRDs of the pinned
// release, RBAC, Deployment) was accepted by the apiserver with strict
// field validation, and snapshot-controller, run with the Deployment's
// flags as its service account, holds its leader-election Lease.
func TestSnapshotControllerAccepted(t *testing.T) {
	ctx := testCtx(t, time.Minute)
	sc := bed.SnapshotController
	missing, err := sc.Manifests.Missing(ctx, bed.Control.Config)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) > 0 {
		t.Errorf("objects of deploy/kubernetes/snapshot-controller the apiserver does not hold: %v", missing)
	}
	ns := sc.Deployment.Namespace
	waitFor(t, settle, "snapshot-controller to hold its Lease in "+ns, func(ctx context.Context) (bool, string, error) {
		l, err := bed.Client.CoordinationV1().Leases(ns).Get(ctx, "snapshot-controller-leader", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "no Lease yet", nil
		}
		if err != nil {
			return false, "", err
		}
		return holder(l) != "", "holder " + holder(l), nil
	})
}

func holder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// TestSnapshotHandedToItsNode: a VolumeSnapshot of a carve volume gets a
// VolumeSnapshotContent for carve's driver and that volume; the controller
// Deployment's csi-snapshotter (run with its flags and service account)
// calls carve controller's CreateSnapshot, which the node channel hands to
// the carve of the node that holds the volume and to no other, and
// records the answer in the content's status.
func TestSnapshotHandedToItsNode(t *testing.T) {
	ns := newNamespace(t, "snapshot")
	ctx := testCtx(t, 3*time.Minute)
	dc := dynamicClient(t)
	createPVCAndPod(t, ctx, newPVC(ns, "data", thickSC, "1Gi"), newPod(ns, "app", "data"))
	pvc := waitBound(t, ns, "data", settle)
	pv := getPV(t, ctx, pvc.Spec.VolumeName)
	node := pvNode(pv)
	if node == "" || pv.Spec.CSI == nil {
		t.Fatalf("precondition: PV %s has no node affinity on %s or no CSI source", pv.Name, cluster.TopologyKey)
	}

	// Retain: with no snapshot made, nothing is deleted on a node when the
	// test's objects go.
	class := retainSnapshotClass(t, ctx, dc, ns)
	t.Cleanup(func() { deleteSnapshotObjects(t, dc, ns, "snap", class) })
	// Calls counted before, so that earlier tests' snapshots on other
	// nodes do not count.
	before := map[string]float64{}
	var err error
	for _, n := range bed.Nodes {
		if before[n.Name], err = scrape(ctx, n.MetricsURL, "carve_phase_duration_seconds_count", `phase="snapshot"`); err != nil {
			before[n.Name] = 0 // no series yet
		}
	}
	if err := kubetest.CreateVolumeSnapshot(ctx, dc, ns, "snap", class, "data"); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	waitFor(t, settle, "a VolumeSnapshotContent for the snapshot", func(ctx context.Context) (bool, string, error) {
		c, name, err := kubetest.BoundSnapshotContent(ctx, dc, ns, "snap")
		if err != nil {
			return false, "", err
		}
		if c == nil {
			return false, "no content bound yet", nil
		}
		driver, _, _ := unstructured.NestedString(c.Object, "spec", "driver")
		handle, _, _ := unstructured.NestedString(c.Object, "spec", "source", "volumeHandle")
		ok := driver == cluster.DriverName && handle == pv.Spec.CSI.VolumeHandle
		return ok, fmt.Sprintf("content %s: driver %q, volume %q (want %q)", name, driver, handle, pv.Spec.CSI.VolumeHandle), nil
	})
	t.Logf("VolumeSnapshotContent for a volume of node %s %s after the VolumeSnapshot", node, time.Since(start).Round(time.Millisecond))
	if !centralSnapshotter() {
		t.Fatal("the controller Deployment runs no csi-snapshotter")
	}

	// csi-snapshotter asks carve controller for the snapshot, which asks
	// the carve of that node and of no other, and records the answer in
	// the content's status. The
	// simulated nodes have no device-mapper, so carve's lvcreate of the
	// snapshot fails there: the status carries that error (the guest and
	// real-node tiers make real ones).
	waitFor(t, settle, "csi-snapshotter to record carve's answer in the content's status", func(ctx context.Context) (bool, string, error) {
		vs, err := dc.Resource(kubetest.VolumeSnapshots).Namespace(ns).Get(ctx, "snap", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		name, _, _ := unstructured.NestedString(vs.Object, "status", "boundVolumeSnapshotContentName")
		c, err := dc.Resource(kubetest.VolumeSnapshotContents).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		msg, _, _ := unstructured.NestedString(c.Object, "status", "error", "message")
		ready, _, _ := unstructured.NestedBool(c.Object, "status", "readyToUse")
		if msg != "" {
			t.Logf("content status error: %s", msg)
		}
		return msg != "" || ready, fmt.Sprintf("status %v", c.Object["status"]), nil
	})
	for _, n := range bed.Nodes {
		calls, err := scrape(ctx, n.MetricsURL, "carve_phase_duration_seconds_count", `phase="snapshot"`)
		if err != nil && n.Name == node {
			t.Fatal(err)
		}
		calls -= before[n.Name]
		switch {
		case n.Name == node && calls == 0:
			t.Errorf("carve on %s, the volume's node, got no CreateSnapshot", n.Name)
		case n.Name != node && calls != 0:
			t.Errorf("carve on %s got %v CreateSnapshot calls for a volume of %s", n.Name, calls, node)
		}
	}
}

// centralSnapshotter tells whether the controller Deployment runs
// csi-snapshotter.
func centralSnapshotter() bool {
	return bed.Central != nil && bed.Central.Snapshotter() != nil
}

// deleteSnapshotObjects deletes a test's VolumeSnapshot, its content and
// its class, and waits until they are gone.
func deleteSnapshotObjects(t *testing.T, dc dynamic.Interface, ns, name, class string) {
	t.Helper()
	kubetest.DeleteVolumeSnapshot(t, dc, ns, name, kubetest.DeleteSnapshotOptions{
		DeleteContent: true,
		// csi-snapshotter removes a deleted content's finalizer; where
		// the controller Deployment runs none, the test does what it would.
		AfterContentDelete: func(ctx context.Context, content string) error {
			if centralSnapshotter() {
				return nil
			}
			patch := []byte(`{"metadata":{"finalizers":null}}`)
			if _, err := dc.Resource(kubetest.VolumeSnapshotContents).Patch(ctx, content, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("remove the finalizers: %w", err)
			}
			return nil
		},
		Wait: func(what string, cond func(ctx context.Context) (bool, string, error)) {
			waitFor(t, time.Minute, what, cond)
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := dc.Resource(kubetest.VolumeSnapshotClasses).Delete(ctx, class, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete VolumeSnapshotClass %s: %v", class, err)
	}
}
