//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A claim of an Immediate carve StorageClass has no node chosen by the
// scheduler: carve refuses it with an event that names
// WaitForFirstConsumer, instead of letting it land on whichever node a race
// picks, and creates nothing anywhere.
func TestImmediateClassRefused(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	const scName = "carve-e2e-immediate"
	createClass(t, ctx, scName, "thick", storagev1.VolumeBindingImmediate)
	ns := newNamespace(t, "immediate")
	lvsBefore, err := lvsByNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, newPVC(ns, "data", scName, "64Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, settle, "a ProvisioningFailed event naming WaitForFirstConsumer", func(ctx context.Context) (bool, string, error) {
		evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "data", "ProvisioningFailed", "WaitForFirstConsumer")
		if err != nil {
			return false, "", err
		}
		if len(evs) > 0 {
			t.Logf("PVC event: %s", evs[0].Message)
		}
		all, _ := events(ctx, ns, "PersistentVolumeClaim", "data")
		return len(evs) > 0, fmt.Sprint(all), nil
	})
	pvc, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimPending || pvc.Spec.VolumeName != "" {
		t.Errorf("the claim is %s with volume %q, want Pending with none", pvc.Status.Phase, pvc.Spec.VolumeName)
	}
	checkNoNewLVs(t, ctx, lvsBefore)
}
