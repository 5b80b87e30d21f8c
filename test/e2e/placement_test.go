//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Scenario 2: a pod with a WaitForFirstConsumer PVC is bound to a node, the
// PVC becomes Bound, the PV's node affinity names that node, and the LV is
// in that node's VG with the requested size and carve's tags, nowhere else.
func TestWFFCVolumeOnThePodsNode(t *testing.T) {
	ns := newNamespace(t, "wffc")
	ctx := testCtx(t, 3*time.Minute)
	pvc, node := dataClaimWithPod(t, ctx, ns, "1Gi", settle)
	if sel := pvc.Annotations[annSelected]; sel != node {
		t.Errorf("PVC selected-node annotation %q, pod bound to %q", sel, node)
	}
	checkVolumeOnNode(t, ctx, pvc, node)
}

// Scenario 3: a 5 GiB volume goes to the only node with room for it; a
// volume no node can hold leaves its pod Pending with the scheduler saying
// why, and carve sees no CreateVolume at all (no error loop).
func TestPlacementByCapacity(t *testing.T) {
	waitCapacitySettled(t, settle)
	roomFor := func(ctx context.Context, size int64) ([]string, error) {
		var nodes []string
		for _, n := range bed.Nodes {
			c, err := capacityBytes(ctx, n.Name, thickSC)
			if err != nil {
				return nil, err
			}
			if c >= size {
				nodes = append(nodes, n.Name)
			}
		}
		return nodes, nil
	}

	t.Run("5GiB goes to the only node with room", func(t *testing.T) {
		ns := newNamespace(t, "fits")
		ctx := testCtx(t, 3*time.Minute)
		nodes, err := roomFor(ctx, gib(5))
		if err != nil {
			t.Fatal(err)
		}
		if len(nodes) != 1 {
			t.Fatalf("precondition: exactly one node should publish room for 5 GiB, these do: %v", nodes)
		}
		createPVCAndPod(t, ctx, newPVC(ns, "big", thickSC, "5Gi"), newPod(ns, "app", "big"))
		pvc := waitBound(t, ns, "big", settle)
		if node := waitPodNode(t, ns, "app", settle); node != nodes[0] {
			t.Fatalf("pod bound to %s, the only node with room is %s", node, nodes[0])
		}
		checkVolumeOnNode(t, ctx, pvc, nodes[0])
	})

	t.Run("too big for every node stays Pending without CreateVolume", func(t *testing.T) {
		ns := newNamespace(t, "toobig")
		ctx := testCtx(t, 3*time.Minute)
		if nodes, err := roomFor(ctx, gib(20)); err != nil || len(nodes) != 0 {
			t.Fatalf("precondition: no node should publish room for 20 GiB; these do: %v (%v)", nodes, err)
		}
		callsBefore, err := createVolumeCalls(ctx)
		if err != nil {
			t.Fatal(err)
		}
		createPVCAndPod(t, ctx, newPVC(ns, "huge", thickSC, "20Gi"), newPod(ns, "app", "huge"))
		waitFor(t, settle, "a FailedScheduling event on the pod saying no node has enough free storage", func(ctx context.Context) (bool, string, error) {
			evs, err := eventsWith(ctx, ns, "Pod", "app", "FailedScheduling", "did not have enough free storage")
			if err != nil {
				return false, "", err
			}
			all, _ := events(ctx, ns, "Pod", "app")
			return len(evs) > 0, fmt.Sprintf("%d events: %v", len(all), all), nil
		})
		// Give the scheduler and the provisioners time to (wrongly) try:
		// the scheduler retries unschedulable pods, a provisioner would act
		// on a selected-node annotation at once.
		const window = 20 * time.Second
		time.Sleep(window)
		pod, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Spec.NodeName != "" {
			t.Errorf("pod was bound to %s although no node has 20 GiB", pod.Spec.NodeName)
		}
		pvc, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "huge", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sel, ok := pvc.Annotations[annSelected]; ok || pvc.Status.Phase != "Pending" {
			t.Errorf("PVC is %s with selected node %q; want Pending with no node selected", pvc.Status.Phase, sel)
		}
		callsAfter, err := createVolumeCalls(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if callsAfter != callsBefore {
			t.Errorf("carve saw %v CreateVolume calls in the %s after the pod was created; want none", callsAfter-callsBefore, window)
		}
		if failed, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "huge", "ProvisioningFailed", ""); err != nil || len(failed) != 0 {
			t.Errorf("PVC has ProvisioningFailed events %v (%v); want none", failed, err)
		}
		t.Logf("pod Pending for %s, FailedScheduling says insufficient storage, %v CreateVolume calls", window, callsAfter-callsBefore)
	})
}
