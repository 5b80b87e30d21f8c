//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
)

// TestRetainPVRemadeKeepsLV (issue 22 item 5, review N7): with
// --remove-orphans, a Retain PV whose claim is gone, deleted by hand and
// made again by hand after the orphan grace period, keeps its LV. The
// audit quarantines the orphan (deactivated, renamed carve-orphan-<hex>,
// data kept) instead of removing it; the PV made again names its old
// handle, so the quarantine outlives the removal grace period, no data is
// reported missing, and a QuarantinedVolumeClaimed Event on the PV names
// the lvrename that restores it. Renamed back as docs/operations.md says,
// the LV is the PV's again and a new claim binds to it. Before, the LV was
// removed once the grace period had passed.
func TestRetainPVRemadeKeepsLV(t *testing.T) {
	ns := newNamespace(t, "retain")
	ctx := testCtx(t, 5*time.Minute)
	pvc, nodeName := dataClaimWithPod(t, ctx, ns, "64Mi", time.Minute)
	n := bed.Node(nodeName)
	pvName := pvc.Spec.VolumeName
	lv := volume.LVNameFor(pvName)
	quarantine, _ := volume.QuarantineName(lv)
	t.Cleanup(func() {
		// Retain keeps the LV whatever happens to the claim: take the
		// claim, the PV and the LV (or its quarantine) away by hand,
		// before the namespace's cleanup waits for them.
		ctx := context.Background()
		if err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "again", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting claim again: %v", err)
		}
		deletePVByHand(t, ctx, pvName)
		removeLVAndQuarantine(t, n, lv)
	})

	if err := bed.Central.RestartControllerWith(ctx, []string{"--remove-orphans=true"}); err != nil {
		t.Fatalf("restarting carve controller with --remove-orphans: %v", err)
	}
	t.Cleanup(func() {
		if err := bed.Central.RestartControllerWith(context.Background(), nil); err != nil {
			t.Errorf("restarting carve controller without --remove-orphans: %v", err)
		}
	})

	// The PV is Retain; its pod and claim go (the PV is then Released),
	// and someone deletes the Released PV by hand.
	if _, err := bed.Client.CoreV1().PersistentVolumes().Patch(ctx, pvName, types.MergePatchType,
		[]byte(`{"spec":{"persistentVolumeReclaimPolicy":"Retain"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	zero := int64(0)
	if err := bed.Client.CoreV1().Pods(ns).Delete(ctx, "app", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "data", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var pv *corev1.PersistentVolume
	waitFor(t, settle, "PV "+pvName+" to be Released", func(ctx context.Context) (bool, string, error) {
		var err error
		pv, err = bed.Client.CoreV1().PersistentVolumes().Get(ctx, pvName, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return pv.Status.Phase == corev1.VolumeReleased, "phase " + string(pv.Status.Phase), nil
	})
	deletePVByHand(t, ctx, pvName)
	gone := time.Now()

	// The orphan grace period later (after the restarted controller's
	// Lease), the audit quarantines the LV.
	waitFor(t, orphanGrace+60*time.Second, "the orphaned LV to be quarantined as "+quarantine, func(ctx context.Context) (bool, string, error) {
		names, err := lvNames(ctx, n)
		if err != nil {
			return false, "", err
		}
		return !slices.Contains(names, lv) && slices.Contains(names, quarantine), fmt.Sprintf("LVs %v", names), nil
	})
	waitFor(t, 10*time.Second, "an OrphanedVolumeQuarantined Event on "+n.Name, func(ctx context.Context) (bool, string, error) {
		evs, err := eventsWith(ctx, "default", "Node", n.Name, "OrphanedVolumeQuarantined", quarantine)
		return len(evs) == 1, fmt.Sprintf("%d events", len(evs)), err
	})
	q, err := n.LVM.GetLV(ctx, n.VG.Name, quarantine)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := volume.QuarantinedFrom(q.Name, q.Tags); !ok || got.Original != lv || got.At.Before(gone.Add(-time.Second)) {
		t.Errorf("quarantine's tags %v: %+v, %v; want orphan of %s, quarantined after %s", q.Tags, got, ok, lv, gone)
	}

	// Someone makes the PV again by hand, as it was: its handle names the
	// LV's old name.
	again := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: pvName}, Spec: pv.Spec}
	again.Spec.ClaimRef = nil
	if _, err := bed.Client.CoreV1().PersistentVolumes().Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	remade := time.Now()
	handle := n.VG.Name + "/" + lv
	waitFor(t, 30*time.Second, "a QuarantinedVolumeClaimed Event on the PV", func(ctx context.Context) (bool, string, error) {
		evs, err := eventsWith(ctx, "default", "PersistentVolume", pvName, "QuarantinedVolumeClaimed", handle)
		return len(evs) == 1, fmt.Sprintf("%d events", len(evs)), err
	})
	evs, err := eventsWith(ctx, "default", "PersistentVolume", pvName, "QuarantinedVolumeClaimed", handle)
	if err != nil || len(evs) != 1 || !strings.Contains(evs[0].Message, "lvrename "+n.VG.Name+" "+quarantine+" "+lv) {
		t.Errorf("the Event does not name the lvrename that restores it: %v (%v)", evs, err)
	}
	// Well past the removal grace period, the quarantine is still there,
	// and no data was reported missing.
	time.Sleep(time.Until(remade.Add(orphanRemovalGrace + 3*auditInterval)))
	names, err := lvNames(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(names, quarantine) {
		t.Fatalf("the quarantined LV %s is gone although a PV names it: LVs %v", quarantine, names)
	}
	if evs, err := eventsWith(ctx, "default", "PersistentVolume", pvName, "VolumeDataMissing", ""); err != nil || len(evs) != 0 {
		t.Errorf("VolumeDataMissing events on the PV of a quarantined LV: %v (%v)", evs, err)
	}

	// Restored as docs/operations.md says, the LV is the PV's again: a
	// claim binds to it.
	if out, err := n.VG.LVM(ctx, "lvrename", n.VG.Name, quarantine, lv); err != nil {
		t.Fatalf("lvrename: %v: %s", err, out)
	}
	claim := newPVC(ns, "again", thickSC, "64Mi")
	claim.Spec.VolumeName = pvName
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitBound(t, ns, "again", settle)
	time.Sleep(orphanGrace + 2*auditInterval)
	if names, err := lvNames(ctx, n); err != nil || !slices.Contains(names, lv) {
		t.Errorf("the restored LV %s: LVs %v (%v)", lv, names, err)
	}
	if evs, err := eventsWith(ctx, "default", "PersistentVolume", pvName, "VolumeDataMissing", ""); err != nil || len(evs) != 0 {
		t.Errorf("VolumeDataMissing events on the restored PV: %v (%v)", evs, err)
	}
}

// lvNames lists the names of node n's LVs.
func lvNames(ctx context.Context, n *cluster.Node) ([]string, error) {
	lvs, err := n.LVM.ListLVs(ctx, n.VG.Name)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range lvs {
		names = append(names, l.Name)
	}
	return names, nil
}

// deletePVByHand deletes a PV as an administrator would, taking off
// finalizers that nothing will lift (csi-provisioner's, on a PV that is
// Retain), and waits until it is gone.
func deletePVByHand(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	err := bed.Client.CoreV1().PersistentVolumes().Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Errorf("deleting PV %s: %v", name, err)
		return
	}
	waitFor(t, 30*time.Second, "PV "+name+" to be gone", func(ctx context.Context) (bool, string, error) {
		pv, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		if err != nil {
			return false, "", err
		}
		if len(pv.Finalizers) > 0 && pv.DeletionTimestamp != nil && time.Since(pv.DeletionTimestamp.Time) > 5*time.Second {
			_, err := bed.Client.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return false, "", err
			}
		}
		return false, fmt.Sprintf("finalizers %v", pv.Finalizers), nil
	})
}
