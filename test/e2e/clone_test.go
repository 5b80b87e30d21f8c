//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/internal/controller/placement"
)

// TestCloneAskedOnAnotherNode: a clone (a PVC whose dataSource is a carve
// PVC) of a StorageClass with carve.dev/cross-node-copy "false" (the
// default copies it: TestRestoreAskedOnAnotherNode sees the copy asked)
// whose pod is pinned to a node that does not hold the source gets
// carve's ResourceExhausted, naming the source's node (carve controller
// finds it from the source's PV, since a volume ID does not name
// its node), as a ProvisioningFailed event on the claim; csi-provisioner
// drops the selected node; nothing is sent to a node, nothing is made
// anywhere. The simulated nodes
// have no device-mapper, so the clone itself is the real-node and guest
// tiers' (the refusal comes before any LVM mutation).
func TestCloneAskedOnAnotherNode(t *testing.T) {
	ns := newNamespace(t, "clone-elsewhere")
	ctx := testCtx(t, 3*time.Minute)
	// A clone is of its source's class (csi-provisioner's rule).
	sc := localOnlyClass(t, ctx, thickSC, "carve-local-"+ns)
	createPVCAndPod(t, ctx, newPVC(ns, "src", sc, "64Mi"), newPod(ns, "src-app", "src"))
	pvc := waitBound(t, ns, "src", settle)
	pv := getPV(t, ctx, pvc.Spec.VolumeName)
	holder := pvNode(pv)
	var other string
	for _, n := range bed.Nodes {
		if n.Name != holder {
			other = n.Name
			break
		}
	}
	if holder == "" || other == "" {
		t.Fatalf("precondition: the source's node %q and another node %q", holder, other)
	}
	lvsBefore, err := lvsByNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Clones counted before (TestRestorePlacedWithSource's, when it ran
	// first): only this test's count.
	clonesBefore := map[string]float64{}
	for _, n := range bed.Nodes {
		if clonesBefore[n.Name], err = scrape(ctx, n.MetricsURL, "carve_phase_duration_seconds_count", `phase="clone"`); err != nil {
			t.Fatal(err)
		}
	}

	clone := newPVC(ns, "clone", sc, "64Mi")
	clone.Spec.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}
	// Left to the scheduler: carve controller would otherwise select the
	// source's node for the clone before the scheduler selects the pod's
	// (TestRestorePlacedWithSource), and the pod would never schedule.
	clone.Annotations = map[string]string{placement.AnnPlaced: "left-to-the-scheduler"}
	pod := newPod(ns, "clone-app", "clone")
	pod.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": other}
	start := createPVCAndPod(t, ctx, clone, pod)
	want := fmt.Sprintf("lives on node %s, not on %s", holder, other)
	waitFor(t, settle, "a ProvisioningFailed event on the clone naming "+holder, func(ctx context.Context) (bool, string, error) {
		evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "clone", "ProvisioningFailed", want)
		if err != nil {
			return false, "", err
		}
		if len(evs) > 0 {
			t.Logf("PVC event %s after the claim: %s", time.Since(start).Round(time.Millisecond), evs[0].Message)
		}
		all, _ := events(ctx, ns, "PersistentVolumeClaim", "clone")
		return len(evs) > 0, fmt.Sprint(all), nil
	})
	evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "clone", "ProvisioningFailed", "ResourceExhausted")
	if err != nil || len(evs) == 0 {
		t.Errorf("no ProvisioningFailed event with code ResourceExhausted (%v)", err)
	}
	c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "clone", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Spec.VolumeName != "" || c.Status.Phase == corev1.ClaimBound {
		t.Errorf("the clone is %s with volume %q", c.Status.Phase, c.Spec.VolumeName)
	}
	checkNoNewLVs(t, ctx, lvsBefore)
	// carve controller refuses it from its PV index: no node agent is
	// asked (the node agent has no API access to tell where the source is).
	for _, n := range bed.Nodes {
		calls, err := scrape(ctx, n.MetricsURL, "carve_phase_duration_seconds_count", `phase="clone"`)
		if err != nil {
			t.Fatal(err)
		}
		if calls -= clonesBefore[n.Name]; calls != 0 {
			t.Errorf("carve on %s counted %v clones; carve controller should have refused the clone before sending it", n.Name, calls)
		}
	}
}
