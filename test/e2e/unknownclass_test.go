//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Scenario 7: a StorageClass naming a device class no node has. Every node
// publishes 0 bytes for it, so the scheduler keeps the pod Pending. When a
// node is picked anyway (the selected-node annotation set by hand, as the
// scheduler would set it), carve answers with a clear error that lands on
// the PVC as an event. Nothing is created anywhere.
func TestUnknownDeviceClass(t *testing.T) {
	ctx := testCtx(t, 4*time.Minute)
	const scName, class = "carve-e2e-unknown-class", "no-such-class"
	createClass(t, ctx, scName, class, storagev1.VolumeBindingWaitForFirstConsumer)
	ns := newNamespace(t, "unknown")
	lvsBefore, err := lvsByNode(ctx)
	if err != nil {
		t.Fatal(err)
	}

	waitFor(t, settle, "every node to publish 0 bytes for the unknown class", func(ctx context.Context) (bool, string, error) {
		var status []string
		ok := true
		for _, n := range bed.Nodes {
			got, err := capacityBytes(ctx, n.Name, scName)
			if err != nil {
				return false, "", err
			}
			ok = ok && got == 0
			status = append(status, fmt.Sprintf("%s=%d", n.Name, got))
		}
		return ok, fmt.Sprint(status), nil
	})

	createPVCAndPod(t, ctx, newPVC(ns, "data", scName, "1Gi"), newPod(ns, "app", "data"))
	waitFor(t, settle, "a FailedScheduling event on the pod (no node has storage for the class)", func(ctx context.Context) (bool, string, error) {
		evs, err := eventsWith(ctx, ns, "Pod", "app", "FailedScheduling", "did not have enough free storage")
		return len(evs) > 0, "", err
	})

	node := bed.Nodes[0].Name
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, annSelected, node)
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "data", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("device class %q is not configured on node %s", class, node)
	waitFor(t, settle, "a ProvisioningFailed event on the PVC with carve's message", func(ctx context.Context) (bool, string, error) {
		evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "data", "ProvisioningFailed", want)
		if err != nil {
			return false, "", err
		}
		all, _ := events(ctx, ns, "PersistentVolumeClaim", "data")
		if len(evs) > 0 {
			t.Logf("PVC event: %s", evs[0].Message)
		}
		return len(evs) > 0, fmt.Sprint(all), nil
	})
	// RESOURCE_EXHAUSTED (another node might have the class): the
	// provisioner gives the PVC back to the scheduler.
	waitFor(t, settle, "the selected-node annotation to be dropped", func(ctx context.Context) (bool, string, error) {
		pvc, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		_, has := pvc.Annotations[annSelected]
		return !has && pvc.Spec.VolumeName == "", fmt.Sprintf("annotations %v, volume %q", pvc.Annotations, pvc.Spec.VolumeName), nil
	})
	checkNoNewLVs(t, ctx, lvsBefore)
	pvs, err := bed.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pv := range pvs.Items {
		if pv.Spec.StorageClassName == scName {
			t.Errorf("PV %s was created for the unknown class", pv.Name)
		}
	}
}
