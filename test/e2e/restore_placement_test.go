//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/carve-csi/carve/internal/controller/placement"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// TestRestorePlacedWithSource: carve controller selects the source's node
// for a new, unpinned restore (a claim of the WaitForFirstConsumer thick
// class from a carve VolumeSnapshot) and for a new clone (from a carve
// claim) once a pod that uses it waits and can run there: the claim gets
// volume.kubernetes.io/selected-node = the source's node and a
// PlacedWithSource Event, csi-provisioner provisions it there at once
// (carve on that node is asked for the restore or clone, and no other node
// is), and carve_restore_placements_total counts it. Before the pod
// exists nothing is selected. A restore bigger than the source's node can
// hold gets no node and a NotPlaced Event saying SourceNodeFull. A
// restore whose pod's nodeSelector excludes the source's node is never
// pinned there: carve says PodCannotRunThere, and the scheduler selects
// the pod's node.
//
// The pods of the placed cases name a scheduler that does not run
// (unscheduled), so that only carve selects a node: kube-scheduler, acting
// on the same pod, could otherwise select one first (then carve leaves
// it), which the test would take for carve's choice.
//
// The simulated nodes have no device-mapper, so the restore or clone
// fails on the source's node at the copy and the claim never binds (its
// PV's node affinity is the real-node tier's to see); what is checked here
// is everything up to carve's CreateVolume on the right node. The
// snapshot is an LV with carve's snapshot tags made with lvcreate,
// bound to a pre-provisioned VolumeSnapshotContent (as
// TestMeasureUnpinnedRestore).
func TestRestorePlacedWithSource(t *testing.T) {
	ns := newNamespace(t, "placed")
	ctx := testCtx(t, 8*time.Minute)
	// Not node-large: its plugin removes orphans, which would race the
	// test's own clean-up of the restores' LVs.
	holder := bed.Nodes[1]
	restoreSize := taggedSnapshot(t, ctx, ns, "snap", holder)
	group := "snapshot.storage.k8s.io"
	fromSnap := func(c *corev1.PersistentVolumeClaim) {
		c.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}
	}

	t.Run("restore", func(t *testing.T) {
		c := newPVC(ns, "restored", thickSC, restoreSize)
		fromSnap(c)
		checkPlaced(t, ctx, c, holder, "restore")
	})

	t.Run("clone", func(t *testing.T) {
		createPVCAndPod(t, ctx, newPVC(ns, "src", thickSC, "64Mi"), newPod(ns, "src-app", "src"))
		src := waitBound(t, ns, "src", settle)
		pv := getPV(t, ctx, src.Spec.VolumeName)
		var srcNode *cluster.Node
		for _, n := range bed.Nodes {
			if n.Name == pvNode(pv) {
				srcNode = n
			}
		}
		if srcNode == nil {
			t.Fatalf("precondition: the source's PV names node %q, not a node of the bed", pvNode(pv))
		}
		c := newPVC(ns, "clone", thickSC, "64Mi")
		c.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}
		checkPlaced(t, ctx, c, srcNode, "clone")
	})

	t.Run("source node full", func(t *testing.T) {
		obj, err := capacityObject(ctx, holder.Name, thickSC)
		if err != nil || obj == nil || obj.MaximumVolumeSize == nil {
			t.Fatalf("precondition: %s publishes the largest volume of %s (%v, %v)", holder.Name, thickSC, obj, err)
		}
		size := resource.NewQuantity(obj.MaximumVolumeSize.Value()+gib(1), resource.BinarySI)
		before := controllerPlacements(t, ctx, placement.ResultSourceNodeFull)
		c := newPVC(ns, "too-big", thickSC, size.String())
		fromSnap(c)
		if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := bed.Client.CoreV1().Pods(ns).Create(ctx, unscheduled(newPod(ns, "too-big-app", "too-big")), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf("SourceNodeFull: VolumeSnapshot %s/snap lives on node %s", ns, holder.Name)
		checkNotPlaced(t, ctx, ns, "too-big", want, "the source's node has no room", placement.ResultSourceNodeFull, before)
	})

	t.Run("pod cannot run on the source's node", func(t *testing.T) {
		var other *cluster.Node
		for _, n := range bed.Nodes {
			if n.Name != holder.Name && other == nil {
				other = n
			}
		}
		elsewhere := func(p *corev1.Pod) *corev1.Pod {
			p.Spec.NodeSelector = map[string]string{cluster.TopologyKey: other.Name}
			return p
		}
		before := controllerPlacements(t, ctx, placement.ResultPodCannotRun)

		// Only carve decides: it says why not and selects nothing.
		c := newPVC(ns, "elsewhere", thickSC, restoreSize)
		fromSnap(c)
		createPVCAndPod(t, ctx, c, unscheduled(elsewhere(newPod(ns, "elsewhere-app", "elsewhere"))))
		want := fmt.Sprintf("PodCannotRunThere: VolumeSnapshot %s/snap lives on node %s, where pod elsewhere-app cannot run: its nodeSelector %s=%s does not match",
			ns, holder.Name, cluster.TopologyKey, other.Name)
		checkNotPlaced(t, ctx, ns, "elsewhere", want, "its pod cannot run on the source's node, and no scheduler runs for it", placement.ResultPodCannotRun, before)

		// With kube-scheduler: the claim goes to the pod's node, never to
		// the source's.
		c = newPVC(ns, "scheduled", thickSC, restoreSize)
		fromSnap(c)
		node, _ := createAndWaitSelected(t, ctx, c, elsewhere(newPod(ns, "scheduled-app", "scheduled")))
		t.Cleanup(func() { deleteRestore(t, ns, "scheduled", "scheduled-app", other) })
		if node != other.Name {
			t.Errorf("the claim's selected node is %s, want %s (the pod's nodeSelector's; the source's node is %s)", node, other.Name, holder.Name)
		}
		got, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "scheduled", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p, ok := got.Annotations[placement.AnnPlaced]; ok {
			t.Errorf("carve selected node %q for the claim (%s); want the scheduler's choice", p, placement.AnnPlaced)
		}
		if evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "scheduled", placement.ReasonPlaced, ""); err != nil || len(evs) > 0 {
			t.Errorf("PlacedWithSource events %v (%v), want none", evs, err)
		}
	})
}

// unscheduled names a scheduler that does not run: the pod waits, no node
// chosen, for as long as it exists.
func unscheduled(p *corev1.Pod) *corev1.Pod {
	p.Spec.SchedulerName = "carve-e2e-nobody"
	return p
}

// checkPlaced creates claim c and an unscheduled pod that uses it, checks
// that nothing is selected before the pod exists, that carve then selects
// holder, with an Event and a count, and that csi-provisioner then asks
// carve on holder, and no other node, for the volume (phase is the
// carve_phase_duration_seconds phase: restore or clone). It deletes the
// claim, the pod and what carve made for it.
func checkPlaced(t *testing.T, ctx context.Context, c *corev1.PersistentVolumeClaim, holder *cluster.Node, phase string) {
	t.Helper()
	asked, err := scrape(ctx, holder.MetricsURL, "carve_phase_duration_seconds_count", `phase="`+phase+`"`)
	if err != nil {
		t.Fatal(err)
	}
	placed := controllerPlacements(t, ctx, placement.ResultPlaced)
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Create(ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := c.Name + "-app"
	t.Cleanup(func() { deleteRestore(t, c.Namespace, c.Name, pod, holder) })
	// The placer decides within milliseconds of a change; a second with
	// no pod and no selection shows it waits for the pod.
	time.Sleep(time.Second)
	if got, err := bed.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{}); err != nil || got.Annotations[annSelected] != "" {
		t.Fatalf("claim %s before its pod: annotations %v (%v), want no selected node", c.Name, got.Annotations, err)
	}
	node, took := waitSelected(t, ctx, c, func() {
		if _, err := bed.Client.CoreV1().Pods(c.Namespace).Create(ctx, unscheduled(newPod(c.Namespace, pod, c.Name)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	if node != holder.Name {
		t.Fatalf("the claim's selected node is %s, want the source's node %s", node, holder.Name)
	}
	t.Logf("%s: selected node %s %s after its pod was created", c.Name, node, took.Round(time.Millisecond))
	got, err := bed.Client.CoreV1().PersistentVolumeClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Annotations[placement.AnnPlaced] != holder.Name {
		t.Errorf("annotations %v: want %s=%s (carve selected it)", got.Annotations, placement.AnnPlaced, holder.Name)
	}
	// The Event and the count follow the annotation.
	waitFor(t, settle, "one "+placement.ReasonPlaced+" event naming "+holder.Name+" and one more placed count", func(ctx context.Context) (bool, string, error) {
		evs, err := eventsWith(ctx, c.Namespace, "PersistentVolumeClaim", c.Name, placement.ReasonPlaced, "Selected node "+holder.Name)
		if err != nil {
			return false, "", err
		}
		after, err := scrape(ctx, bed.Central.MetricsURL, "carve_restore_placements_total", `result="`+placement.ResultPlaced+`"`)
		if err != nil {
			return false, "", err
		}
		all, _ := events(ctx, c.Namespace, "PersistentVolumeClaim", c.Name)
		return len(evs) == 1 && after == placed+1, fmt.Sprintf("placed count %v -> %v; events %v", placed, after, all), nil
	})
	waitFor(t, settle, "carve on "+holder.Name+" to be asked for the "+phase, func(ctx context.Context) (bool, string, error) {
		n, err := scrape(ctx, holder.MetricsURL, "carve_phase_duration_seconds_count", `phase="`+phase+`"`)
		return n > asked, fmt.Sprintf("%v asked of %s", n-asked, holder.Name), err
	})
	for _, n := range bed.Nodes {
		if n.Name == holder.Name {
			continue
		}
		if evs, err := eventsWith(ctx, c.Namespace, "PersistentVolumeClaim", c.Name, "ProvisioningFailed", "not on "+n.Name); err != nil || len(evs) > 0 {
			t.Errorf("node %s was asked for the volume: %v (%v)", n.Name, evs, err)
		}
	}
}

// createAndWaitSelected creates c and pod and returns the node selected
// for c and how long after the create it was selected.
func createAndWaitSelected(t *testing.T, ctx context.Context, c *corev1.PersistentVolumeClaim, pod *corev1.Pod) (string, time.Duration) {
	t.Helper()
	return waitSelected(t, ctx, c, func() { kubetest.CreateClaimAndPod(t, ctx, bed.Client, c, pod) })
}

// waitSelected runs create and returns the node then selected for c and
// how long after create began, from a watch of the claim started before.
func waitSelected(t *testing.T, ctx context.Context, c *corev1.PersistentVolumeClaim, create func()) (string, time.Duration) {
	t.Helper()
	pvcs := bed.Client.CoreV1().PersistentVolumeClaims(c.Namespace)
	w, err := pvcs.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", c.Name).String()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	start := time.Now()
	create()
	timeout := time.After(settle)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the watch of claim %s ended", c.Name)
			}
			got, isClaim := ev.Object.(*corev1.PersistentVolumeClaim)
			if !isClaim || ev.Type == watch.Deleted {
				continue
			}
			if n := got.Annotations[annSelected]; n != "" {
				return n, time.Since(start)
			}
		case <-timeout:
			all, _ := events(ctx, c.Namespace, "PersistentVolumeClaim", c.Name)
			t.Fatalf("claim %s got no selected node in %s; events: %v", c.Name, settle, all)
		}
	}
}

// checkNotPlaced waits for a NotPlaced Event on claim ns/claim saying
// want, then checks that carve selected no node for it (why: the reason
// none fits) and that carve_restore_placements_total{result} went up by
// one from before.
func checkNotPlaced(t *testing.T, ctx context.Context, ns, claim, want, why, result string, before float64) {
	t.Helper()
	waitFor(t, settle, "a NotPlaced event on the claim: "+want, func(ctx context.Context) (bool, string, error) {
		evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", claim, placement.ReasonNotPlaced, want)
		if err != nil {
			return false, "", err
		}
		all, _ := events(ctx, ns, "PersistentVolumeClaim", claim)
		return len(evs) > 0, fmt.Sprint(all), nil
	})
	got, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sel, ok := got.Annotations[annSelected]; ok {
		t.Errorf("the claim got selected node %q; want none (%s)", sel, why)
	}
	if after := controllerPlacements(t, ctx, result); after != before+1 {
		t.Errorf("carve_restore_placements_total{result=%q} went from %v to %v, want one more", result, before, after)
	}
}

// controllerPlacements is carve controller's count of placement decisions
// with result.
func controllerPlacements(t *testing.T, ctx context.Context, result string) float64 {
	t.Helper()
	v, err := scrape(ctx, bed.Central.MetricsURL, "carve_restore_placements_total", `result="`+result+`"`)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// taggedSnapshot makes a 64 MiB LV with carve's snapshot tags on holder
// (carve serves it as a snapshot: ListSnapshots, ReadyToUse), a
// pre-provisioned VolumeSnapshotContent of it and VolumeSnapshot name in
// ns bound to it, waits until it is ReadyToUse and returns its
// restoreSize. Cleanups delete them.
func taggedSnapshot(t *testing.T, ctx context.Context, ns, name string, holder *cluster.Node) string {
	t.Helper()
	dc := dynamicClient(t)
	snapName := "e2e-" + name + "-" + ns
	lv := volume.SnapshotLVNameFor(snapName)
	args := []string{"lvcreate", "--yes", "--activate", "n", "--zero", "n", "--name", lv, "--size", "64m"}
	for _, tag := range volume.SnapshotTags(snapName, "thick", "carve-e2e-origin") {
		args = append(args, "--addtag", tag)
	}
	if _, err := holder.VG.LVM(ctx, append(args, holder.VG.Name)...); err != nil {
		t.Fatalf("the snapshot LV on %s: %v", holder.Name, err)
	}
	t.Cleanup(func() { removeLVIfThere(t, holder, lv) })

	content := "e2e-" + name + "-" + ns
	handle := volume.SnapshotID(holder.Name, holder.VG.Name, lv)
	if _, err := dc.Resource(kubetest.VolumeSnapshotContents).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
		"metadata": map[string]any{"name": content, "labels": map[string]any{managedByLabel: holder.Name}},
		"spec": map[string]any{
			"deletionPolicy":    "Retain",
			"driver":            cluster.DriverName,
			"source":            map[string]any{"snapshotHandle": handle},
			"volumeSnapshotRef": map[string]any{"name": name, "namespace": ns},
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
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"source": map[string]any{"volumeSnapshotContentName": content}},
	}}, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		t.Fatalf("create VolumeSnapshot: %v", err)
	}
	var restoreSize string
	waitFor(t, time.Minute, "the VolumeSnapshot ReadyToUse (carve on "+holder.Name+" lists the snapshot)", func(ctx context.Context) (bool, string, error) {
		vs, err := dc.Resource(kubetest.VolumeSnapshots).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		ready, _, _ := unstructured.NestedBool(vs.Object, "status", "readyToUse")
		restoreSize, _, _ = unstructured.NestedString(vs.Object, "status", "restoreSize")
		return ready && restoreSize != "", fmt.Sprintf("status %v", vs.Object["status"]), nil
	})
	return restoreSize
}
