//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestExpansionReachesTheNode: the shipped controller Deployment (carve
// controller beside csi-resizer, run with the Deployment's own flags and
// service account) takes a PVC size increase: csi-resizer records the new
// size on the PV and leaves the growing to the node (kubelet's
// NodeExpandVolume, which needs a kubelet and is tested in the guest). The
// LV is not touched by the controller side.
func TestExpansionReachesTheNode(t *testing.T) {
	ns := newNamespace(t, "expand")
	ctx := testCtx(t, 3*time.Minute)
	createPVCAndPod(t, ctx, newPVC(ns, "data", thickSC, "1Gi"), newPod(ns, "app", "data"))
	pvc := waitBound(t, ns, "data", settle)
	pvName := pvc.Spec.VolumeName
	if got := pvCapacity(t, ctx, pvName); got != gib(1) {
		t.Fatalf("precondition: PV %s holds %d bytes, want 1 GiB", pvName, got)
	}

	raiseClaim(t, ctx, ns, "data", gib(2))

	waitFor(t, settle, "csi-resizer to record 2 GiB on the PV and hand the rest to the node", func(ctx context.Context) (bool, string, error) {
		pv, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		claim, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		size := pv.Spec.Capacity[corev1.ResourceStorage]
		pending := nodeResizePending(claim)
		return size.Value() == gib(2) && pending, fmt.Sprintf("PV capacity %s, PVC conditions %v, allocated resource statuses %v",
			size.String(), claim.Status.Conditions, claim.Status.AllocatedResourceStatuses), nil
	})

	_, lv, err := lvOfPV(ctx, pvName)
	if err != nil {
		t.Fatal(err)
	}
	if lv == nil {
		t.Fatalf("no LV of PV %s on any node", pvName)
	}
	if lv.Size != uint64(gib(1)) {
		t.Errorf("LV %s/%s is %d bytes; only the node (NodeExpandVolume) may grow it", lv.VolumeGroup, lv.Name, lv.Size)
	}
	if err := bed.CheckAlive(); err != nil {
		t.Errorf("processes died: %v", err)
	}
}

// pvCapacity is the PV's spec.capacity in bytes.
func pvCapacity(t *testing.T, ctx context.Context, name string) int64 {
	t.Helper()
	pv := getPV(t, ctx, name)
	q := pv.Spec.Capacity[corev1.ResourceStorage]
	return q.Value()
}

// nodeResizePending tells whether a PVC waits for the node to expand it:
// the FileSystemResizePending condition, or (with recovery from expansion
// failure, on by default since Kubernetes 1.32) the NodeResizePending
// allocated-resource status.
func nodeResizePending(pvc *corev1.PersistentVolumeClaim) bool {
	for _, c := range pvc.Status.Conditions {
		if c.Type == corev1.PersistentVolumeClaimFileSystemResizePending && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] == corev1.PersistentVolumeClaimNodeResizePending
}
