//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/pkg/volume"
)

// TestNodeLostForGood runs after the other scenarios, before
// TestNothingLeftBehind (the finale's order; it takes a Node away for the
// rest of the run): a StatefulSet's pod has its volume
// on a node whose Node object is then deleted. carve controller reports
// the claim (NodeLost Event) and, run with --delete-claims-of-lost-nodes
// (the component's RBAC applied), deletes the claim and the PV; the
// pod garbage collector removes the pod of the deleted node, and the
// StatefulSet makes a new pod and claim, bound on another node with a new
// volume.
func TestNodeLostForGood(t *testing.T) {
	finale.Enter(t)
	ns := newNamespace(t, "lost")
	ctx := testCtx(t, 4*time.Minute)
	if _, err := bed.Client.AppsV1().StatefulSets(ns).Create(ctx, newStatefulSet(ns, "db", thickSC, "64Mi", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	old := waitBound(t, ns, "data-db-0", 2*time.Minute)
	lost := waitPodNode(t, ns, "db-0", settle)
	checkVolumeOnNode(t, ctx, old, lost)
	lostLV := volume.LVNameFor(old.Spec.VolumeName)
	t.Cleanup(func() {
		// The disk went with the node: what is left of the LV on the
		// simulated node's volume group goes too (its own plugin may have
		// removed it as an orphan already).
		if err := bed.Node(lost).RemoveLV(context.Background(), lostLV); err != nil {
			t.Logf("removing %s on %s: %v (gone already)", lostLV, lost, err)
		}
	})

	start := time.Now()
	if err := bed.Client.CoreV1().Nodes().Delete(ctx, lost, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "a NodeLost Event on the claim", func(ctx context.Context) (bool, string, error) {
		evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "data-db-0", "NodeLost", "Node "+lost+" no longer exists")
		if err != nil {
			return false, "", err
		}
		return len(evs) > 0, fmt.Sprintf("%d events", len(evs)), nil
	})
	reported := time.Since(start)
	// The claim keeps its pvc-protection finalizer until the pod is gone,
	// which the pod garbage collector deletes after its 40 s quarantine
	// (and its 20 s period): minutes on a loaded machine.
	waitFor(t, 3*time.Minute, "the old claim and PV to be deleted", func(ctx context.Context) (bool, string, error) {
		c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data-db-0", metav1.GetOptions{})
		claimGone := apierrors.IsNotFound(err) || err == nil && c.UID != old.UID
		_, err = bed.Client.CoreV1().PersistentVolumes().Get(ctx, old.Spec.VolumeName, metav1.GetOptions{})
		pvGone := apierrors.IsNotFound(err)
		return claimGone && pvGone, fmt.Sprintf("old claim gone %v, PV gone %v", claimGone, pvGone), nil
	})
	if v, err := scrape(ctx, bed.Central.MetricsURL, "carve_lost_node_volumes_deleted_total", `object="pvc"`, `result="success"`); err != nil || v < 1 {
		t.Errorf("carve_lost_node_volumes_deleted_total{object=pvc,result=success}: %v (%v), want >= 1", v, err)
	}

	// The pod garbage collector deletes the pod of the deleted node (after
	// its quarantine of 40 s); the StatefulSet makes it again with a new
	// claim.
	var fresh string
	waitFor(t, 3*time.Minute, "db-0 on another node with a new claim", func(ctx context.Context) (bool, string, error) {
		pod, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "db-0", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "no pod", nil
		}
		if err != nil {
			return false, "", err
		}
		c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data-db-0", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "pod on " + pod.Spec.NodeName + ", no claim yet", nil
		}
		if err != nil {
			return false, "", err
		}
		fresh = pod.Spec.NodeName
		ok := fresh != "" && fresh != lost && c.UID != old.UID && c.Spec.VolumeName != ""
		return ok, fmt.Sprintf("pod on %q, claim %s phase %s", fresh, c.UID, c.Status.Phase), nil
	})
	pvc := waitBound(t, ns, "data-db-0", time.Minute)
	checkVolumeOnNode(t, ctx, pvc, fresh)
	t.Logf("Node %s deleted: claim reported after %s, db-0 rebound on %s with volume %s after %s",
		lost, reported.Round(time.Millisecond), fresh, pvc.Spec.VolumeName, time.Since(start).Round(time.Millisecond))
}
