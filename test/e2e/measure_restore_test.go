//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/internal/controller/placement"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// TestMeasureUnpinnedRestore (make measure-restore-placement; skipped by
// make test-e2e, like the benchmarks) measures what happens to a restoring
// pod that is not pinned to its snapshot's node. carve controller selects
// the snapshot's node for the claim (volume.kubernetes.io/selected-node,
// internal/controller/placement) as soon as its pod waits and can run
// there, so the scheduler considers only that node for the pod and
// csi-provisioner asks carve there. Before
// it did, the scheduler picked any node with room, carve there answered
// ResourceExhausted naming the snapshot's node, and the pod wandered from
// node to node (issue 23: it never got there in five minutes). Every
// round must end on the snapshot's node; the test prints the time from
// the claim to carve's selection and to carve's CreateVolume there, how
// many wrong nodes were tried (a scheduler that selects a wrong node
// before carve does gets refused once, and carve then selects the right
// one) and in how many rounds the scheduler selected first.
//
// The simulated nodes have no device-mapper and no kubelet, so the
// snapshot is an LV with carve's snapshot tags made with lvcreate on one
// node (taggedSnapshot), and the restore itself then fails on that node
// at the copy (no device to read), which keeps the claim there and its
// pod unbound. The restores are of a class with carve.dev/cross-node-copy
// "false", so that a wrong node is refused as before copies across nodes
// rather than copied to. What is measured, scheduling and provisioning up to
// carve's CreateVolume on the right node, is all real; the copy and the
// pod Running are the real-node tier's.
func TestMeasureUnpinnedRestore(t *testing.T) {
	rounds := kubetest.Rounds(t, 5)
	ns := newNamespace(t, "unpinned")
	ctx := testCtx(t, time.Duration(rounds)*6*time.Minute+2*time.Minute)
	// Not node-large: its plugin removes orphans, which would race the
	// test's own clean-up of the restores' LVs.
	holder := bed.Nodes[1]
	restoreSize := taggedSnapshot(t, ctx, ns, "snap", holder)
	// A class that never copies across nodes: what is measured is where
	// the restore is placed, and a copy to a node the scheduler picked
	// first would hide a wrong placement.
	sc := localOnlyClass(t, ctx, thickSC, "carve-local-"+ns)

	var took, placed []time.Duration
	var wrong []int
	bySched := 0 // rounds whose node the scheduler selected before carve
	for i := range rounds {
		name := fmt.Sprintf("restored-%d", i)
		before, err := scrape(ctx, holder.MetricsURL, "carve_phase_duration_seconds_count", `phase="restore"`)
		if err != nil {
			t.Fatal(err)
		}
		pvc := newPVC(ns, name, sc, restoreSize)
		group := "snapshot.storage.k8s.io"
		pvc.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}
		selected := watchPlaced(t, ctx, ns, name)
		start := createPVCAndPod(t, ctx, pvc, newPod(ns, "app-"+strconv.Itoa(i), name))
		waitFor(t, 5*time.Minute, "carve on "+holder.Name+" to be asked for "+name, func(ctx context.Context) (bool, string, error) {
			n, err := scrape(ctx, holder.MetricsURL, "carve_phase_duration_seconds_count", `phase="restore"`)
			return n > before, fmt.Sprintf("%v restores asked of %s", n-before, holder.Name), err
		})
		d := time.Since(start)
		// carve's selection comes before carve there is asked, unless the
		// scheduler selected the snapshot's node first (then carve has
		// nothing to select).
		var sel placedAt
		select {
		case sel = <-selected:
		case <-time.After(10 * time.Second):
			c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("round %d: carve selected no node for %s: the scheduler selected %q first", i, name, c.Annotations[annSelected])
			sel = placedAt{node: c.Annotations[annSelected], at: time.Now()}
			bySched++
		}
		if sel.node != holder.Name {
			t.Errorf("round %d: node %q selected for %s, want the snapshot's node %s", i, sel.node, name, holder.Name)
		}
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
		p := sel.at.Sub(start)
		t.Logf("round %d: carve selected %s %s after the claim; carve there asked %s after the claim, after %d refusal(s) on %v",
			i, sel.node, p.Round(time.Millisecond), d.Round(time.Millisecond), tries, tried)
		took, placed, wrong = append(took, d), append(placed, p), append(wrong, tries)
		deleteRestore(t, ns, name, "app-"+strconv.Itoa(i), holder)
	}
	slices.Sort(took)
	slices.Sort(placed)
	fmt.Printf("MEASURE unpinned restore, %d nodes, %d rounds: claim to the snapshot's node selected by carve min %s median %s max %s; "+
		"claim to carve's CreateVolume there min %s median %s max %s; refusals per round %v; rounds the scheduler selected first %d\n",
		len(bed.Nodes), rounds, placed[0].Round(time.Millisecond), placed[len(placed)/2].Round(time.Millisecond), placed[len(placed)-1].Round(time.Millisecond),
		took[0].Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), wrong, bySched)
}

// placedAt is when a claim got the annotation carve sets with the node it
// selects, and the node.
type placedAt struct {
	node string
	at   time.Time
}

// watchPlaced watches claim ns/name (call it before creating the claim)
// and sends the node carve selects for it (placement.AnnPlaced) and when
// the watch saw it.
func watchPlaced(t *testing.T, ctx context.Context, ns, name string) <-chan placedAt {
	t.Helper()
	w, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan placedAt, 1)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if c, ok := ev.Object.(*corev1.PersistentVolumeClaim); ok && c.Annotations[placement.AnnPlaced] != "" {
				out <- placedAt{node: c.Annotations[placement.AnnPlaced], at: time.Now()}
				return
			}
		}
	}()
	return out
}

// deleteRestore deletes a restoring pod (none: "") and its claim, and the
// LV carve made for the claim on holder (its copy cannot run on a
// simulated node).
func deleteRestore(t *testing.T, ns, claim, pod string, holder *cluster.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pvc, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod != "" {
		if err := bed.Client.CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete pod %s: %v", pod, err)
		}
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
