//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/carve-csi/carve/internal/volume"
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

// TestNodeReRegistered (issue 22 item 5, review N6): a Node deleted and
// registered again within --lost-node-grace-period (the test bed's 20 s),
// as `kubectl delete node` and a kubelet restart do, keeps its claims.
// carve controller, run with --delete-claims-of-lost-nodes, reports the
// claim (NodeLost, naming when it would delete it) while the Node is gone;
// a grace period and two passes later the claim and the PV are still
// there, and nothing was deleted. Before, the claim was deleted at the
// first pass that found the Node gone.
func TestNodeReRegistered(t *testing.T) {
	ns := newNamespace(t, "rereg")
	ctx := testCtx(t, 3*time.Minute)
	pvc, name := dataClaimWithPod(t, ctx, ns, "64Mi", time.Minute)
	node, err := bed.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deletedBefore, err := scrape(ctx, bed.Central.MetricsURL, "carve_lost_node_volumes_deleted_total", `object="pvc"`, `result="success"`)
	if err != nil {
		t.Fatal(err)
	}

	// Orphan propagation keeps the CSINode the harness made (a kubelet
	// would write it again); the Node object itself goes.
	start := time.Now()
	orphan := metav1.DeletePropagationOrphan
	if err := bed.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &orphan}); err != nil {
		t.Fatal(err)
	}
	back := false
	t.Cleanup(func() {
		if !back {
			if err := reRegisterNode(context.Background(), node); err != nil {
				t.Errorf("registering Node %s again: %v", name, err)
			}
		}
	})
	waitFor(t, 30*time.Second, "Node "+name+" to be gone", func(ctx context.Context) (bool, string, error) {
		_, err := bed.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		return false, "still there", err
	})
	var lostEvent corev1.Event
	waitFor(t, lostNodeGrace*3/4, "a NodeLost Event on the claim", func(ctx context.Context) (bool, string, error) {
		evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "data", "NodeLost", "Node "+name+" no longer exists")
		if err != nil || len(evs) == 0 {
			return false, fmt.Sprintf("%d events", len(evs)), err
		}
		lostEvent = evs[0]
		return true, "", nil
	})
	if !strings.Contains(lostEvent.Message, "unless Node "+name+" comes back first") {
		t.Errorf("the NodeLost Event does not say that the deletion waits: %q", lostEvent.Message)
	}
	// The kubelet restarts and registers the Node again.
	if err := reRegisterNode(ctx, node); err != nil {
		t.Fatalf("registering Node %s again: %v", name, err)
	}
	back = true
	absent := time.Since(start)
	if absent >= lostNodeGrace {
		t.Fatalf("the Node was away %s, longer than the grace period %s: the test proves nothing", absent, lostNodeGrace)
	}

	// Past the grace period and two passes (--lost-nodes-interval=5s),
	// claim and PV are the same and not being deleted.
	until := start.Add(lostNodeGrace + 10*time.Second)
	for time.Now().Before(until) {
		c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil || c.UID != pvc.UID || c.DeletionTimestamp != nil {
			t.Fatalf("claim of the re-registered Node %s: %v, %+v", name, err, c.ObjectMeta)
		}
		pv, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil || pv.DeletionTimestamp != nil {
			t.Fatalf("PV of the re-registered Node %s: %v, %+v", name, err, pv.ObjectMeta)
		}
		time.Sleep(time.Second)
	}
	if evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "data", "NodeLostClaimDeleted", ""); err != nil || len(evs) != 0 {
		t.Errorf("NodeLostClaimDeleted events: %v (%v)", evs, err)
	}
	if v, err := scrape(ctx, bed.Central.MetricsURL, "carve_lost_node_volumes_deleted_total", `object="pvc"`, `result="success"`); err != nil || v != deletedBefore {
		t.Errorf("carve_lost_node_volumes_deleted_total{object=pvc,result=success}: %v (%v), want %v as before", v, err, deletedBefore)
	}
	t.Logf("Node %s away for %s: NodeLost reported, claim and PV kept past the grace period (%s)", name, absent.Round(time.Millisecond), lostNodeGrace)
}

// reRegisterNode creates the Node old again as its kubelet would: same
// labels and status, no taints, and takes the CSINode of that name back
// as its own.
func reRegisterNode(ctx context.Context, old *corev1.Node) error {
	cs := bed.Client
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: old.Name, Labels: old.Labels, Annotations: old.Annotations}, Spec: old.Spec}
	created, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	// As the harness does at the start: the admission plugin taints a new
	// Node not-ready, and no node lifecycle controller runs to lift it.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := cs.CoreV1().Nodes().Get(ctx, old.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec.Taints = old.Spec.Taints
		if _, err := cs.CoreV1().Nodes().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return err
		}
		cur, err = cs.CoreV1().Nodes().Get(ctx, old.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status = old.Status
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := cs.StorageV1().CSINodes().Get(ctx, old.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: old.Name, UID: created.UID}}
		_, err = cs.StorageV1().CSINodes().Update(ctx, c, metav1.UpdateOptions{})
		return err
	})
}
