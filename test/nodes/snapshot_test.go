//go:build nodes

package nodes

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/carve-csi/carve/test/harness/kubetest"
)

// snapshotClass is the shipped VolumeSnapshotClass for thin volumes.
const snapshotClass = "carve"

// TestRestoredClaimReadsTheSnapshot: a pod writes a file to a thin xfs
// volume; a VolumeSnapshot of it (the shipped class, the node's
// csi-snapshotter, snapshot-controller with distributed snapshotting)
// becomes ReadyToUse; the pod then overwrites the file and writes a
// second one; a claim restored from the snapshot, mounted by a second pod,
// holds the file as it was at the snapshot and not the second one.
func TestRestoredClaimReadsTheSnapshot(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t, "snap")
	dc := dynamicClient(t)
	ctx := testCtx(t, 10*time.Minute)
	createClaimAndPod(t, newPVC(ns, "data", thinSC, "256Mi"), newPod(ns, "app", "data", false, sleeper))
	podExec(t, ns, "app", "echo before > /data/f && sync")

	t.Cleanup(func() { deleteSnapshot(t, dc, ns, "snap") })
	start := time.Now()
	if err := kubetest.CreateVolumeSnapshot(ctx, dc, ns, "snap", snapshotClass, "data"); err != nil {
		t.Fatal(err)
	}
	// An xfs volume asked 256Mi was made 300 MiB (xfs's least); its
	// snapshot's restoreSize is what the claim asked, so that a restore
	// asked at the source claim's size passes csi-provisioner's check
	// (which refuses a restore smaller than its snapshot).
	vs := waitSnapshotReady(t, dc, ns, "snap")
	restoreSize, _, _ := unstructured.NestedString(vs.Object, "status", "restoreSize")
	ready := time.Since(start)
	podExec(t, ns, "app", "echo after > /data/f && echo after > /data/g && sync")

	if q, err := resource.ParseQuantity(restoreSize); err != nil || q.Value() != 256<<20 {
		t.Fatalf("the ready VolumeSnapshot's status.restoreSize is %q (%v), want the 256Mi its source claim asked", restoreSize, err)
	}
	restored := newPVC(ns, "restored", thinSC, "256Mi")
	group := "snapshot.storage.k8s.io"
	restored.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}
	start = time.Now()
	reader := createClaimAndPod(t, restored, newPod(ns, "reader", "restored", false, sleeper))
	running := time.Since(start)
	if got := strings.TrimSpace(podExec(t, ns, "reader", "cat /data/f; test -e /data/g && echo g-exists || echo no-g")); got != "before\nno-g" {
		t.Errorf("the restored volume holds %q, want the file as it was at the snapshot (\"before\") and no file written after it", got)
	}
	claim, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "restored", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := claim.Status.Capacity[corev1.ResourceStorage]; got.Value() != 300<<20 {
		t.Errorf("the restored claim's capacity is %s, want the source's whole 300Mi", got.String())
	}
	if reader.Spec.NodeName != nodeName {
		t.Errorf("the reader runs on %s, want %s", reader.Spec.NodeName, nodeName)
	}
	t.Logf("VolumeSnapshot ReadyToUse %s after it was created; restored claim's pod running %s after its claim", ready.Round(time.Millisecond), running.Round(time.Millisecond))
}

// deleteSnapshot deletes a VolumeSnapshot and waits until it and its
// content are gone (deletionPolicy Delete: the node's csi-snapshotter
// deletes the LV).
func deleteSnapshot(t *testing.T, dc dynamic.Interface, ns, name string) {
	t.Helper()
	kubetest.DeleteVolumeSnapshot(t, dc, ns, name, kubetest.DeleteSnapshotOptions{
		Wait: func(what string, cond func(ctx context.Context) (bool, string, error)) {
			waitFor(t, shortWait, what, cond)
		},
	})
}
