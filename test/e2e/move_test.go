//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/controller/mover"
	"github.com/carve-csi/carve/test/harness/cluster"
)

// TestMoveAbortsWhenTheCopyFails: a move asked of a bound claim (the
// annotation kubectl carve move sets) runs in carve controller: a seed
// snapshot on the claim's node, then a volume on the target node restored
// from it across nodes. The simulated nodes have no device-mapper, so the
// seed (lvcreate of a snapshot) or else the copy fails for real (or, with
// agents that serve no copies, is refused): the move gives up before it
// stops anything. The claim stays bound to
// its old PV (same UID, reclaim policy back, no move annotation left),
// the pod is untouched, no LV is left on any node (neither the target nor
// the seed), the Events on the claim say why, and carve_moves_total
// counts a failure.
func TestMoveAbortsWhenTheCopyFails(t *testing.T) {
	ns := newNamespace(t, "move")
	ctx := testCtx(t, 6*time.Minute)
	pvc, from := dataClaimWithPod(t, ctx, ns, "64Mi", settle)
	pod, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv := getPV(t, ctx, pvc.Spec.VolumeName)
	to := ""
	for _, n := range bed.Nodes {
		if n.Name != from {
			to = n.Name
			break
		}
	}
	before, err := lvsByNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	failedBefore, err := scrape(ctx, bed.Central.MetricsURL, "carve_moves_total", `result="failed"`)
	if err != nil {
		t.Fatal(err)
	}

	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{moveapi.AnnMoveTo: to}}})
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "data", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var msg string
	waitFor(t, 4*time.Minute, "a MoveFailed event on the claim naming node "+to, func(ctx context.Context) (bool, string, error) {
		evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "data", moveapi.ReasonMoveFailed, to)
		if err != nil {
			return false, "", err
		}
		if len(evs) > 0 {
			msg = evs[0].Message
			return true, "", nil
		}
		all, _ := events(ctx, ns, "PersistentVolumeClaim", "data")
		p, _ := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		return false, fmt.Sprintf("PV annotations %v; events %v", p.Annotations, all), nil
	})
	t.Logf("after %s: %s", time.Since(start).Round(time.Millisecond), msg)
	if !strings.Contains(msg, "stays on its volume on node "+from) {
		t.Errorf("the event does not say the claim stays on node %s: %s", from, msg)
	}
	if evs, _ := eventsWith(ctx, ns, "PersistentVolumeClaim", "data", moveapi.ReasonMoving, "seeding"); len(evs) == 0 {
		t.Error("no Moving event for the seeding")
	}

	waitFor(t, settle, "the old PV restored", func(ctx context.Context) (bool, string, error) {
		p, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		var left []string
		for k := range p.Annotations {
			if strings.HasPrefix(k, moveapi.AnnPrefix) {
				left = append(left, k)
			}
		}
		return len(left) == 0 && p.Spec.PersistentVolumeReclaimPolicy == pv.Spec.PersistentVolumeReclaimPolicy,
			fmt.Sprintf("annotations %v, reclaim policy %s (was %s)", left, p.Spec.PersistentVolumeReclaimPolicy, pv.Spec.PersistentVolumeReclaimPolicy), nil
	})
	// The mover takes the request off the claim last, after the PV.
	var now *corev1.PersistentVolumeClaim
	waitFor(t, settle, "the request "+moveapi.AnnMoveTo+" taken off the claim", func(ctx context.Context) (bool, string, error) {
		var err error
		if now, err = bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{}); err != nil {
			return false, "", err
		}
		_, asked := now.Annotations[moveapi.AnnMoveTo]
		return !asked, fmt.Sprintf("annotations %v", now.Annotations), nil
	})
	if now.UID != pvc.UID || now.Spec.VolumeName != pv.Name || now.Status.Phase != corev1.ClaimBound || now.DeletionTimestamp != nil {
		t.Errorf("the claim changed: UID %s (was %s), volume %s (was %s), phase %s, deleting %v",
			now.UID, pvc.UID, now.Spec.VolumeName, pv.Name, now.Status.Phase, now.DeletionTimestamp != nil)
	}
	p, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
	if err != nil || p.UID != pod.UID || p.DeletionTimestamp != nil {
		t.Errorf("the pod was touched: %v", err)
	}
	if _, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, mover.TargetName(pv.Name, to), metav1.GetOptions{}); err == nil {
		t.Errorf("a PV %s was made", mover.TargetName(pv.Name, to))
	}
	checkNoNewLVs(t, ctx, before)
	waitFor(t, 30*time.Second, "carve_moves_total{result=failed} to count it", func(ctx context.Context) (bool, string, error) {
		v, err := scrape(ctx, bed.Central.MetricsURL, "carve_moves_total", `result="failed"`)
		return v == failedBefore+1, fmt.Sprintf("%v (was %v)", v, failedBefore), err
	})
}

// TestMoveBindsTheClaimMadeInTheGap plays a move's binding phase on the
// real control plane, with the data step left out (the simulated nodes
// copy no data): a volume made on node B stands for the copy (its PV
// taken away, so that only the move names it), and a PV on node A in
// phase binding, with that volume as its target, stands for the old one.
// A PV of the target's name that is not the move's holds the move back;
// meanwhile a claim of the moved claim's name appears with a pod, as a
// StatefulSet makes it from its template: csi-provisioner's CreateVolume
// is refused naming the move (no fresh volume is made). Once the blocker
// goes, the mover makes the target's PV pre-bound to the claim, the PV
// controller binds the waiting claim to it, the pod lands on B, and the
// mover deletes the old PV and says Moved.
func TestMoveBindsTheClaimMadeInTheGap(t *testing.T) {
	ns := newNamespace(t, "movegap")
	ctx := testCtx(t, 6*time.Minute)
	from, to := bed.Nodes[0].Name, bed.Nodes[1].Name
	pvs := bed.Client.CoreV1().PersistentVolumes()

	// The copy: a volume on B whose PV is taken away (Retain first).
	seed := newPVC(ns, "copy", thickSC, "64Mi")
	seedPod := newPod(ns, "copy-app", "copy")
	seedPod.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": to}
	createPVCAndPod(t, ctx, seed, seedPod)
	seedPV, err := pvs.Get(ctx, waitBound(t, ns, "copy", settle).Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	retain := []byte(`{"spec":{"persistentVolumeReclaimPolicy":"Retain"}}`)
	if _, err := pvs.Patch(ctx, seedPV.Name, types.MergePatchType, retain, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	zero := int64(0)
	if err := bed.Client.CoreV1().Pods(ns).Delete(ctx, "copy-app", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, "copy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, settle, "the copy's claim gone", func(ctx context.Context) (bool, string, error) {
		_, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "copy", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	})
	if err := pvs.Delete(ctx, seedPV.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, settle, "the copy's PV gone", func(ctx context.Context) (bool, string, error) {
		_, err := pvs.Get(ctx, seedPV.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	})

	oldName := "movegap-old-" + ns
	target := mover.TargetName(oldName, to)
	gone := func(name string) {
		t.Cleanup(func() {
			if err := pvs.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete PV %s: %v", name, err)
			}
		})
	}
	// The blocker: a PV of the target's name that is not the move's.
	blocker := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: target},
		Spec: corev1.PersistentVolumeSpec{Capacity: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain, StorageClassName: "movegap-none",
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: "blocker.example.com", VolumeHandle: "blocker"}}}}
	if _, err := pvs.Create(ctx, blocker, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gone(target)

	saved, _ := json.Marshal(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: ns}, Spec: newPVC(ns, "data", thickSC, "64Mi").Spec})
	vc, _ := json.Marshal(seedPV.Spec.CSI.VolumeAttributes)
	old := seedPV.DeepCopy()
	old.ObjectMeta = metav1.ObjectMeta{Name: oldName, Annotations: map[string]string{
		"pv.kubernetes.io/provisioned-by": cluster.DriverName,
		moveapi.AnnMoveTo:                 to, moveapi.AnnPhase: moveapi.PhaseBinding, moveapi.AnnReclaimPolicy: "Delete",
		moveapi.AnnTarget: target, moveapi.AnnTargetID: seedPV.Spec.CSI.VolumeHandle, moveapi.AnnTargetContext: string(vc),
		moveapi.AnnClaim: string(saved), moveapi.AnnPhaseSince: time.Now().UTC().Format(time.RFC3339Nano)}}
	old.Spec.CSI.VolumeHandle = "moved-away-" + ns // no node has it
	old.Spec.PersistentVolumeReclaimPolicy = corev1.PersistentVolumeReclaimRetain
	old.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: ns, Name: "data", UID: "00000000-0000-0000-0000-00000000dead"}
	old.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: cluster.TopologyKey, Operator: corev1.NodeSelectorOpIn, Values: []string{from}}}}}}}
	old.Status = corev1.PersistentVolumeStatus{}
	if _, err := pvs.Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gone(oldName)
	waitFor(t, settle, "the move to wait for the blocker", func(ctx context.Context) (bool, string, error) {
		p, err := pvs.Get(ctx, oldName, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return strings.Contains(p.Annotations[moveapi.AnnWaiting], "not this move's"), fmt.Sprint(p.Annotations[moveapi.AnnWaiting]), nil
	})

	// The claim made again in the gap, and its pod.
	before, err := lvsByNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	createPVCAndPod(t, ctx, newPVC(ns, "data", thickSC, "64Mi"), newPod(ns, "app", "data"))
	waitFor(t, settle, "csi-provisioner refused to provision the claim, naming the move", func(ctx context.Context) (bool, string, error) {
		evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "data", "ProvisioningFailed", "being moved to node "+to)
		if err != nil {
			return false, "", err
		}
		all, _ := events(ctx, ns, "PersistentVolumeClaim", "data")
		return len(evs) > 0, fmt.Sprint(all), nil
	})
	checkNoNewLVs(t, ctx, before)

	if err := pvs.Delete(ctx, target, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c := waitBound(t, ns, "data", 2*settle)
	if c.Spec.VolumeName != target {
		t.Fatalf("the claim is bound to %s, not to the moved volume's PV %s", c.Spec.VolumeName, target)
	}
	np, err := pvs.Get(ctx, target, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if np.Spec.CSI.VolumeHandle != seedPV.Spec.CSI.VolumeHandle || pvNode(np) != to || np.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("the new PV: handle %s (want %s), node %s (want %s), reclaim %s", np.Spec.CSI.VolumeHandle, seedPV.Spec.CSI.VolumeHandle,
			pvNode(np), to, np.Spec.PersistentVolumeReclaimPolicy)
	}
	if n := waitPodNode(t, ns, "app", settle); n != to {
		t.Errorf("the pod runs on %s, want %s", n, to)
	}
	waitFor(t, settle, "the old PV gone and a Moved event", func(ctx context.Context) (bool, string, error) {
		_, err := pvs.Get(ctx, oldName, metav1.GetOptions{})
		evs, _ := eventsWith(ctx, ns, "PersistentVolumeClaim", "data", moveapi.ReasonMoved, to)
		return apierrors.IsNotFound(err) && len(evs) > 0, fmt.Sprintf("old PV: %v; Moved events %d", err, len(evs)), nil
	})
	checkNoNewLVs(t, ctx, before)
}
