//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/carve-csi/carve/internal/controller/placement"
	"github.com/carve-csi/carve/internal/controller/router"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// TestRestoreAskedOnAnotherNode: a restore whose pod is pinned to another
// node than its snapshot's goes, through csi-provisioner and carve
// controller, to the pod's node with a copy granted by the snapshot's
// node (the shipped DaemonSet serves copies by default); a StorageClass with carve.dev/cross-node-copy "false" gets the
// refusal naming the snapshot's node, RESOURCE_EXHAUSTED, and the
// parameter never reaches a node agent (which would refuse an unknown
// key). The simulated nodes have no device-mapper, so a granted copy
// fails on the pod's node at activating the new volume or at the data
// (the guest tier's TestCrossNodeCopy copies real data between two
// agents); what is checked here is the choreography up to it.
func TestRestoreAskedOnAnotherNode(t *testing.T) {
	ns := newNamespace(t, "crossnode")
	ctx := testCtx(t, 6*time.Minute)
	holder, other := bed.Nodes[1], bed.Nodes[2]
	restoreSize := taggedSnapshot(t, ctx, ns, "snap", holder)
	group := "snapshot.storage.k8s.io"
	restore := func(t *testing.T, name, sc string) time.Time {
		t.Helper()
		c := newPVC(ns, name, sc, restoreSize)
		c.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}
		// Left to the scheduler: carve controller would select the
		// snapshot's node first.
		c.Annotations = map[string]string{placement.AnnPlaced: "left-to-the-scheduler"}
		pod := newPod(ns, name+"-app", name)
		pod.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": other.Name}
		return createPVCAndPod(t, ctx, c, pod)
	}
	// waitEvent waits for a ProvisioningFailed event on claim that names
	// node and holds one of wants; it returns its message.
	waitEvent := func(t *testing.T, claim, node string, wants ...string) string {
		t.Helper()
		var msg string
		waitFor(t, settle, "a ProvisioningFailed event on "+claim+" naming "+node, func(ctx context.Context) (bool, string, error) {
			evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", claim, "ProvisioningFailed", node)
			if err != nil {
				return false, "", err
			}
			for _, e := range evs {
				for _, w := range wants {
					if strings.Contains(e.Message, w) {
						msg = e.Message
						return true, "", nil
					}
				}
			}
			all, _ := events(ctx, ns, "PersistentVolumeClaim", claim)
			return false, fmt.Sprint(all), nil
		})
		if strings.Contains(msg, router.ParamCrossNodeCopy) || strings.Contains(msg, "unknown key") {
			t.Errorf("the parameter reached a node agent: %s", msg)
		}
		return msg
	}

	t.Run("copied", func(t *testing.T) {
		start := restore(t, "copied", thickSC)
		// The attempts make the volume on the pod's node (and fail): it
		// goes with the claim.
		t.Cleanup(func() { deleteRestore(t, ns, "copied", "copied-app", other) })
		// Granted and sent to the pod's node, which makes the volume and
		// fails at activating it or at the data: the bed's nodes have no
		// device-mapper.
		msg := waitEvent(t, "copied", other.Name, "the copy's target", "from node "+holder.Name, "copies its volumes to no other node")
		t.Logf("after %s: %s", time.Since(start).Round(time.Millisecond), msg)
		if strings.Contains(msg, "copies its volumes to no other node") {
			t.Fatalf("the bed's node agents serve no copies (no --node-copy-address), though the shipped DaemonSet turns them on by default: %s", msg)
		}
		// Granted and sent to the pod's node, which read from the
		// snapshot's node over mutual TLS; no device-mapper here.
		if !strings.Contains(msg, "node "+other.Name) {
			t.Errorf("the copy was not made on the pod's node %s: %s", other.Name, msg)
		}
		if strings.Contains(msg, "PermissionDenied") {
			t.Errorf("the snapshot's node refused the pod's node: %s", msg)
		}
	})

	t.Run("forbidden by the StorageClass", func(t *testing.T) {
		local := localOnlyClass(t, ctx, thickSC, "carve-local-"+ns)
		start := restore(t, "local", local)
		msg := waitEvent(t, "local", holder.Name, fmt.Sprintf("lives on node %s, not on %s", holder.Name, other.Name))
		t.Logf("after %s: %s", time.Since(start).Round(time.Millisecond), msg)
		if !strings.Contains(msg, "ResourceExhausted") || strings.Contains(msg, "copies its volumes") {
			t.Errorf("want the refusal of a restore on another node, RESOURCE_EXHAUSTED: %s", msg)
		}
	})
}

// localOnlyClass is kubetest.LocalOnlyClass on this bed.
func localOnlyClass(t *testing.T, ctx context.Context, base, name string) string {
	t.Helper()
	return kubetest.LocalOnlyClass(t, ctx, bed.Client, bed.Namespace, base, name)
}
