//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/carve-csi/carve/pkg/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// TestMeasureUnpinnedRestore (make measure-restore-placement; skipped by
// make test-e2e, like the benchmarks) measures what happens to a restoring
// pod that is not pinned to its snapshot's node: the scheduler picks a
// node with room for the claim, carve there answers ResourceExhausted
// naming the snapshot's node, csi-provisioner drops the node, and the
// scheduler picks again, until it picks the snapshot's node. It asserts
// that every round gets there and prints how long it took and how many
// wrong nodes were tried.
//
// The simulated nodes have no device-mapper, so the snapshot is an LV
// with carve's snapshot tags made with lvcreate on one node (carve serves
// it as a snapshot: ListSnapshots, ReadyToUse), bound to a pre-provisioned
// VolumeSnapshotContent; the restore itself then fails on that node at
// the copy (no device to read), which keeps the claim there. What is
// measured, scheduling and provisioning up to carve's CreateVolume on the
// right node, is all real; the copy is the real-node tier's.
func TestMeasureUnpinnedRestore(t *testing.T) {
	rounds := 5
	if v := os.Getenv("CARVE_MEASURE_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("CARVE_MEASURE_ROUNDS=%q: want a positive number", v)
		}
		rounds = n
	}
	ns := newNamespace(t, "unpinned")
	ctx := testCtx(t, time.Duration(rounds)*6*time.Minute+2*time.Minute)
	dc := dynamicClient(t)
	// Not node-large: its plugin removes orphans, which would race the
	// test's own clean-up of the restores' LVs.
	holder := bed.Nodes[1]
	snapName := "e2e-unpinned-" + ns
	lv := volume.SnapshotLVNameFor(snapName)
	args := []string{"lvcreate", "--yes", "--activate", "n", "--zero", "n", "--name", lv, "--size", "64m"}
	for _, tag := range volume.SnapshotTags(snapName, "thick", "carve-e2e-origin") {
		args = append(args, "--addtag", tag)
	}
	if _, err := holder.VG.LVM(ctx, append(args, holder.VG.Name)...); err != nil {
		t.Fatalf("the snapshot LV on %s: %v", holder.Name, err)
	}
	t.Cleanup(func() { removeLVIfThere(t, holder, lv) })

	content := "e2e-" + ns
	handle := volume.SnapshotID(holder.Name, holder.VG.Name, lv)
	if _, err := dc.Resource(kubetest.VolumeSnapshotContents).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": content, "labels": map[string]any{managedByLabel: holder.Name}},
		"spec": map[string]any{
			"deletionPolicy":    "Retain",
			"driver":            cluster.DriverName,
			"source":            map[string]any{"snapshotHandle": handle},
			"volumeSnapshotRef": map[string]any{"name": "snap", "namespace": ns},
		},
	}}, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		t.Fatalf("create VolumeSnapshotContent: %v", err)
	}
	t.Cleanup(func() {
		if err := dc.Resource(kubetest.VolumeSnapshotContents).Delete(context.Background(), content, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete VolumeSnapshotContent %s: %v", content, err)
		}
	})
	if _, err := dc.Resource(kubetest.VolumeSnapshots).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": "snap", "namespace": ns},
		"spec":     map[string]any{"source": map[string]any{"volumeSnapshotContentName": content}},
	}}, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		t.Fatalf("create VolumeSnapshot: %v", err)
	}
	var restoreSize string
	waitFor(t, time.Minute, "the VolumeSnapshot ReadyToUse (carve on "+holder.Name+" lists the snapshot)", func(ctx context.Context) (bool, string, error) {
		vs, err := dc.Resource(kubetest.VolumeSnapshots).Namespace(ns).Get(ctx, "snap", metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		ready, _, _ := unstructured.NestedBool(vs.Object, "status", "readyToUse")
		restoreSize, _, _ = unstructured.NestedString(vs.Object, "status", "restoreSize")
		return ready && restoreSize != "", fmt.Sprintf("status %v", vs.Object["status"]), nil
	})

	var took []time.Duration
	var wrong []int
	for i := range rounds {
		name := fmt.Sprintf("restored-%d", i)
		before, err := scrape(ctx, holder.MetricsURL, "carve_phase_duration_seconds_count", `phase="restore"`)
		if err != nil {
			t.Fatal(err)
		}
		pvc := newPVC(ns, name, thickSC, restoreSize)
		group := "snapshot.storage.k8s.io"
		pvc.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}
		start := createPVCAndPod(t, ctx, pvc, newPod(ns, "app-"+strconv.Itoa(i), name))
		waitFor(t, 5*time.Minute, "carve on "+holder.Name+" to be asked for "+name, func(ctx context.Context) (bool, string, error) {
			n, err := scrape(ctx, holder.MetricsURL, "carve_phase_duration_seconds_count", `phase="restore"`)
			return n > before, fmt.Sprintf("%v restores asked of %s", n-before, holder.Name), err
		})
		d := time.Since(start)
		evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", name, "ProvisioningFailed", "lives on node "+holder.Name)
		if err != nil {
			t.Fatal(err)
		}
		tries, tried := 0, []string{}
		for _, e := range evs {
			tries += int(max(e.Count, 1))
			if _, after, ok := strings.Cut(e.Message, ", not on "); ok {
				if n, _, ok := strings.Cut(after, ":"); ok && !slices.Contains(tried, n) {
					tried = append(tried, n)
				}
			}
		}
		slices.Sort(tried)
		t.Logf("round %d: carve on the snapshot's node %s asked %s after the claim, after %d refusal(s) on %v", i, holder.Name, d.Round(time.Millisecond), tries, tried)
		took, wrong = append(took, d), append(wrong, tries)
		deleteRestore(t, ns, name, "app-"+strconv.Itoa(i), holder)
	}
	slices.Sort(took)
	fmt.Printf("MEASURE unpinned restore, %d nodes, %d rounds: time to the snapshot's node min %s median %s max %s; refusals per round %v\n",
		len(bed.Nodes), rounds, took[0].Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), wrong)
}

// deleteRestore deletes a restoring pod and its claim, and the LV carve
// made for the claim on holder (its copy cannot run on a simulated node).
func deleteRestore(t *testing.T, ns, claim, pod string, holder *cluster.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pvc, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := bed.Client.CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete pod %s: %v", pod, err)
	}
	if err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, claim, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete claim %s: %v", claim, err)
	}
	waitFor(t, time.Minute, "claim "+claim+" gone", func(ctx context.Context) (bool, string, error) {
		_, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	})
	// csi-provisioner stops retrying once the claim is gone; a call in
	// flight may still make the LV after this, hence the second look.
	lv := volume.LVNameFor("pvc-" + string(pvc.UID))
	removeLVIfThere(t, holder, lv)
	time.Sleep(3 * time.Second)
	removeLVIfThere(t, holder, lv)
}

// removeLVIfThere removes an LV of holder's volume group if it exists.
func removeLVIfThere(t *testing.T, holder *cluster.Node, lv string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := holder.VG.LVM(ctx, "lvs", "--noheadings", "-o", "lv_name", holder.VG.Name)
	if err != nil {
		t.Errorf("lvs on %s: %v", holder.Name, err)
		return
	}
	if !slices.Contains(strings.Fields(string(out)), lv) {
		return
	}
	if err := holder.RemoveLV(ctx, lv); err != nil {
		t.Errorf("remove LV %s on %s: %v", lv, holder.Name, err)
	}
}
