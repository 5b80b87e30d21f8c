//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/controller/capacity"
)

// Scenario 1: a CSIStorageCapacity object for every node x WaitForFirstConsumer
// StorageClass, holding VG free - spare, written by carve controller from
// the node's capacity stream (labelled as its own, owned by no node pod:
// a restarted node agent does not take its objects with it), and
// following a volume's create and delete.
func TestCapacityObjectsPerNodeAndClass(t *testing.T) {
	scs, err := bed.StorageClasses()
	if err != nil {
		t.Fatal(err)
	}
	if len(scs) == 0 {
		t.Fatal("the manifests hold no WaitForFirstConsumer StorageClass of lvm.carve.dev")
	}
	for _, sc := range scs {
		class := sc.Parameters["carve.dev/device-class"]
		for _, n := range bed.Nodes {
			t.Run(sc.Name+"/"+n.Name, func(t *testing.T) {
				// The thin class is not configured on the host (no
				// device-mapper, so no thin pool): carve reports 0.
				thin := shippedClass(class) != nil && shippedClass(class).Thin()
				waitFor(t, settle, fmt.Sprintf("CSIStorageCapacity of %s on %s to equal VG free - spare", sc.Name, n.Name), func(ctx context.Context) (bool, string, error) {
					var want int64
					if !thin {
						var err error
						if want, err = expectedThickCapacity(ctx, n); err != nil {
							return false, "", err
						}
					}
					got, err := capacityBytes(ctx, n.Name, sc.Name)
					if err != nil {
						return false, "", err
					}
					return got == want, fmt.Sprintf("published %d, want %d", got, want), nil
				})
				ctx := testCtx(t, 30*time.Second)
				obj, err := capacityObject(ctx, n.Name, sc.Name)
				if err != nil || obj == nil {
					t.Fatalf("capacity object: %v", err)
				}
				for _, o := range obj.OwnerReferences {
					if o.Kind == "Pod" {
						t.Errorf("CSIStorageCapacity %s is owned by pod %s: the controller writes it, no node pod owns it", obj.Name, o.Name)
					}
				}
				if got := obj.Labels[capacity.LabelManagedBy]; got != capacity.ManagedBy {
					t.Errorf("CSIStorageCapacity %s label %s=%q, want %q (carve controller writes it)", obj.Name, capacity.LabelManagedBy, got, capacity.ManagedBy)
				}
				if got := obj.Labels[capacity.LabelNode]; got != n.Name {
					t.Errorf("CSIStorageCapacity %s label %s=%q, want the node %s", obj.Name, capacity.LabelNode, got, n.Name)
				}
				if !thin && (obj.MaximumVolumeSize == nil || obj.MaximumVolumeSize.Value() != obj.Capacity.Value()) {
					t.Errorf("CSIStorageCapacity %s maximumVolumeSize %v, want %v (one VG: the largest volume is all the room)", obj.Name, obj.MaximumVolumeSize, obj.Capacity)
				}
			})
		}
	}

	t.Run("follows create and delete", func(t *testing.T) {
		ns := newNamespace(t, "capacity")
		ctx := testCtx(t, 5*time.Minute)
		before := nodeCapacities(t, ctx, thickSC)
		createPVCAndPod(t, ctx, newPVC(ns, "data", thickSC, "1Gi"), newPod(ns, "app", "data"))
		waitBound(t, ns, "data", settle)
		node := waitPodNode(t, ns, "app", settle)
		waitFor(t, 30*time.Second, "capacity of "+node+" to drop by 1 GiB after the volume was created", func(ctx context.Context) (bool, string, error) {
			got, err := capacityBytes(ctx, node, thickSC)
			return got == before[node]-gib(1), fmt.Sprintf("published %d, before %d", got, before[node]), err
		})
		deleteNamespaceVolumes(t, ns)
		waitCapacities(t, 30*time.Second, "capacity of every node to return to its value before the volume", thickSC, before)
	})
}
