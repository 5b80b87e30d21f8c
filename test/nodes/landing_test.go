//go:build nodes

package nodes

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/internal/controller/placement"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// TestMeasureRestoreLanding (make measure-placement-nodes; skipped by make
// test-nodes) measures where unpinned restoring and cloning pods land on
// a bed of the guest and bigger simulated nodes (CARVE_NODES_SIMULATED):
// the source lives on the guest, and each round a claim restored from its
// snapshot, then a claim cloned from it, each with a pod that names no
// node, must run on the guest and read the source's bytes. It prints the
// time from the claim to the pod Running (median of CARVE_MEASURE_ROUNDS,
// default 10) and in how many rounds carve selected the node
// (placement.AnnPlaced) rather than the scheduler finding it alone. The
// claims are of a class with carve.dev/cross-node-copy "false": a copy to
// a node the scheduler picked would hide where carve placed the claim.
func TestMeasureRestoreLanding(t *testing.T) {
	if len(bed.Nodes) == 0 {
		t.Fatal("this measurement needs simulated nodes beside the guest (CARVE_NODES_SIMULATED=3; make measure-placement-nodes sets it): with the guest alone every pod lands there whatever carve does")
	}
	rounds := kubetest.Rounds(t, 10)
	ns := newNamespace(t, "landing")
	ctx := testCtx(t, time.Duration(rounds)*8*time.Minute)
	dc := dynamicClient(t)

	// The source: a thick ext4 claim on the guest, 32 MiB of random
	// bytes, and a snapshot of it. A clone is of its source's class.
	const size = "128Mi"
	sc := localOnlyClass(t, ctx, thickSC, "carve-local-"+ns)
	writer := newPod(ns, "writer", "data", false, sleeper)
	writer.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": nodeName}
	createClaimAndPod(t, newPVC(ns, "data", sc, size), writer)
	sum := strings.Fields(podExec(t, ns, "writer", "head -c 33554432 /dev/urandom > /data/f && sync && sha256sum /data/f"))[0]
	createSnapshotReady(t, ctx, dc, ns, "snap", "data")

	kinds := []struct {
		name   string
		source func(*corev1.PersistentVolumeClaim)
	}{
		{"restore", func(c *corev1.PersistentVolumeClaim) {
			group := "snapshot.storage.k8s.io"
			c.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: &group, Kind: "VolumeSnapshot", Name: "snap"}
		}},
		{"clone", func(c *corev1.PersistentVolumeClaim) {
			c.Spec.DataSourceRef = &corev1.TypedObjectReference{Kind: "PersistentVolumeClaim", Name: "data"}
		}},
	}
	for _, k := range kinds {
		var took []time.Duration
		var refusedAll []int
		byCarve := 0
		for i := range rounds {
			claim, pod := fmt.Sprintf("%s-%d", k.name, i), fmt.Sprintf("%s-reader-%d", k.name, i)
			pvc := newPVC(ns, claim, sc, size)
			k.source(pvc)
			start := time.Now()
			kubetest.CreateClaimAndPod(t, ctx, bed.Client, pvc, newPod(ns, pod, claim, false, sleeper))
			p := waitLanded(t, ns, claim, pod)
			d := time.Since(start)
			if p.Spec.NodeName != nodeName {
				t.Errorf("%s round %d: the pod runs on %s, want the source's node %s", k.name, i, p.Spec.NodeName, nodeName)
			}
			if got := strings.Fields(podExec(t, ns, pod, "sha256sum /data/f"))[0]; got != sum {
				t.Errorf("%s round %d: /data/f has SHA-256 %s, want the source's %s", k.name, i, got, sum)
			}
			c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if c.Annotations[placement.AnnPlaced] != "" {
				byCarve++
			}
			refused := refusals(t, ns, claim)
			t.Logf("%s round %d: pod Running on %s %s after its claim (carve selected the node: %t; refusals on other nodes: %d)",
				k.name, i, p.Spec.NodeName, d.Round(time.Millisecond), c.Annotations[placement.AnnPlaced] != "", refused)
			took, refusedAll = append(took, d), append(refusedAll, refused)
			deleteClaimAndPod(t, ns, claim, pod)
		}
		fmt.Printf("MEASURE unpinned %s on a real node beside %d bigger simulated nodes, %d rounds: claim to pod Running min %s median %s max %s; carve selected the source's node in %d of %d rounds; refusals on other nodes per round %v\n",
			k.name, len(bed.Nodes), rounds, kubetest.Percentile(took, 0), kubetest.Percentile(took, 50), kubetest.Percentile(took, 100), byCarve, rounds, refusedAll)
	}
}

// deleteClaimAndPod deletes a pod and its claim and waits until the
// claim's PV is gone, so the next round finds the node as it was.
func deleteClaimAndPod(t *testing.T, ns, claim, pod string) {
	t.Helper()
	pv := pvOf(t, ns, claim)
	ctx := testCtx(t, podTimeout)
	if err := bed.Client.CoreV1().Pods(ns).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete pod %s: %v", pod, err)
	}
	if err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, claim, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete claim %s: %v", claim, err)
	}
	waitFor(t, podTimeout, "PV "+pv+" gone", func(ctx context.Context) (bool, string, error) {
		_, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err), nil
	})
}

// waitLanded waits until the claim's pod runs and returns it; if it does
// not, the failure says what the claim went through: its annotations
// and its events.
func waitLanded(t *testing.T, ns, claim, pod string) *corev1.Pod {
	t.Helper()
	var got *corev1.Pod
	kubetest.Poll(t, 500*time.Millisecond, podTimeout, fmt.Sprintf("pod %s/%s running", ns, pod), func(ctx context.Context) (bool, string, error) {
		p, err := bed.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		got = p
		return allRunning(p), podState(p), nil
	}, func() {
		ctx := testCtx(t, time.Minute)
		if c, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{}); err == nil {
			t.Logf("claim %s: phase %s, annotations %v", claim, c.Status.Phase, c.Annotations)
		}
		evs, err := bed.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Logf("events of %s: %v", ns, err)
			return
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == claim || e.InvolvedObject.Name == pod {
				t.Logf("event %s %s %s x%d: %s", e.InvolvedObject.Kind, e.Type, e.Reason, e.Count, e.Message)
			}
		}
	})
	return got
}

// refusals counts the ProvisioningFailed events of a claim whose message
// says its source lives on another node: the times the claim was asked
// of a wrong node before it landed.
func refusals(t *testing.T, ns, claim string) int {
	t.Helper()
	evs, err := bed.Client.CoreV1().Events(ns).List(testCtx(t, time.Minute), metav1.ListOptions{
		FieldSelector: "involvedObject.kind=PersistentVolumeClaim,involvedObject.name=" + claim + ",reason=ProvisioningFailed"})
	if err != nil {
		t.Fatalf("events of claim %s: %v", claim, err)
	}
	n := 0
	for _, e := range evs.Items {
		if strings.Contains(e.Message, "lives on node") {
			n += int(max(e.Count, 1))
		}
	}
	return n
}

// localOnlyClass is kubetest.LocalOnlyClass on this bed.
func localOnlyClass(t *testing.T, ctx context.Context, base, name string) string {
	t.Helper()
	return kubetest.LocalOnlyClass(t, ctx, bed.Client, bed.Namespace, base, name)
}
