//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Scenario 4: stale capacity. After a node's capacity was published, its VG
// is filled outside carve; the next volume sent there gets
// RESOURCE_EXHAUSTED, the provisioner drops the selected-node annotation,
// and the pod is rescheduled and bound on another node with room.
func TestStaleCapacityReschedules(t *testing.T) {
	waitCapacitySettled(t, settle)
	ns := newNamespace(t, "stale")
	ctx := testCtx(t, 5*time.Minute)
	target, other := bed.Node("node-large"), bed.Node("node-medium")
	const size = 2 << 30

	published, err := capacityBytes(ctx, target.Name, thickSC)
	if err != nil {
		t.Fatal(err)
	}
	if otherRoom, err := capacityBytes(ctx, other.Name, thickSC); err != nil || otherRoom < size || published < size {
		t.Fatalf("precondition: %s and %s should both publish room for 2 GiB: %d, %d (%v)", target.Name, other.Name, published, otherRoom, err)
	}
	// Fill the target outside carve, leaving 1 GiB free in the VG: less
	// than the 2 GiB the next volume asks, whatever the spare.
	vg, err := target.LVM.VolumeGroup(ctx, target.VG.Name)
	if err != nil {
		t.Fatal(err)
	}
	fill := vg.Free - 1<<30
	if err := target.FillVG(ctx, "outside-carve", fill); err != nil {
		t.Fatalf("fill %s outside carve: %v", target.VG.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := target.RemoveLV(ctx, "outside-carve"); err != nil {
			t.Errorf("remove the filler LV: %v", err)
		}
	})

	// The pod prefers the target (a soft node affinity), so the scheduler,
	// going by the stale capacity, sends the volume there first.
	pod := newPod(ns, "app", "data")
	pod.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
			Weight: 100,
			Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{target.Name},
			}}},
		}},
	}}
	createPVCAndPod(t, ctx, newPVC(ns, "data", thickSC, "2Gi"), pod)
	if still, err := capacityBytes(ctx, target.Name, thickSC); err != nil || still != published {
		t.Fatalf("precondition: %s's published capacity should still be the stale %d right after the fill, is %d (%v)", target.Name, published, still, err)
	}

	// Bounded by carve's --capacity-refresh-interval (1m default) plus a
	// provisioner refresh: until then the stale number may send it back.
	pvc := waitBound(t, ns, "data", 3*time.Minute)
	node := waitPodNode(t, ns, "app", settle)
	if node != other.Name {
		t.Fatalf("pod bound to %s, want %s (the only node with room once the fill is seen)", node, other.Name)
	}
	checkVolumeOnNode(t, ctx, pvc, other.Name)

	exhausted, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "data", "ProvisioningFailed", "ResourceExhausted")
	if err != nil {
		t.Fatal(err)
	}
	if len(exhausted) == 0 {
		all, _ := events(ctx, ns, "PersistentVolumeClaim", "data")
		t.Fatalf("no ProvisioningFailed event with ResourceExhausted on the PVC; its events: %v", all)
	}
	var tries int32
	for _, e := range exhausted {
		tries += max(e.Count, 1)
		if !strings.Contains(e.Message, target.Name) {
			t.Errorf("ResourceExhausted event does not name node %s: %s", target.Name, e.Message)
		}
	}
	t.Logf("%d CreateVolume attempt(s) on %s ended ResourceExhausted (%s); the pod was rescheduled to %s", tries, target.Name, exhausted[0].Message, node)
	// The filler and nothing of carve's is on the target.
	if nodes, _, err := lvOfPV(ctx, pvc.Spec.VolumeName); err != nil || len(nodes) != 1 {
		t.Errorf("LV of %s on nodes %v (%v)", pvc.Spec.VolumeName, nodes, err)
	}
	waitFor(t, 2*time.Minute, "the target's published capacity to show the fill", func(ctx context.Context) (bool, string, error) {
		want, err := expectedThickCapacity(ctx, target)
		if err != nil {
			return false, "", err
		}
		got, err := capacityBytes(ctx, target.Name, thickSC)
		return got == want, fmt.Sprintf("published %d, want %d", got, want), err
	})
}
