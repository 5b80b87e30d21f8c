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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/carve-csi/carve/pkg/mover"
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
	createPVCAndPod(t, ctx, newPVC(ns, "data", thickSC, "64Mi"), newPod(ns, "app", "data"))
	pvc := waitBound(t, ns, "data", settle)
	from := waitPodNode(t, ns, "app", settle)
	pod, err := bed.Client.CoreV1().Pods(ns).Get(ctx, "app", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
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

	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{mover.AnnMoveTo: to}}})
	if _, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, "data", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var msg string
	waitFor(t, 4*time.Minute, "a MoveFailed event on the claim naming node "+to, func(ctx context.Context) (bool, string, error) {
		evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "data", mover.ReasonMoveFailed, to)
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
	if evs, _ := eventsWith(ctx, ns, "PersistentVolumeClaim", "data", mover.ReasonMoving, "seeding"); len(evs) == 0 {
		t.Error("no Moving event for the seeding")
	}

	waitFor(t, settle, "the old PV restored", func(ctx context.Context) (bool, string, error) {
		p, err := bed.Client.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		var left []string
		for k := range p.Annotations {
			if strings.HasPrefix(k, mover.AnnPrefix) {
				left = append(left, k)
			}
		}
		return len(left) == 0 && p.Spec.PersistentVolumeReclaimPolicy == pv.Spec.PersistentVolumeReclaimPolicy,
			fmt.Sprintf("annotations %v, reclaim policy %s (was %s)", left, p.Spec.PersistentVolumeReclaimPolicy, pv.Spec.PersistentVolumeReclaimPolicy), nil
	})
	now, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Get(ctx, "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.UID != pvc.UID || now.Spec.VolumeName != pv.Name || now.Status.Phase != corev1.ClaimBound || now.DeletionTimestamp != nil {
		t.Errorf("the claim changed: UID %s (was %s), volume %s (was %s), phase %s, deleting %v",
			now.UID, pvc.UID, now.Spec.VolumeName, pv.Name, now.Status.Phase, now.DeletionTimestamp != nil)
	}
	if _, ok := now.Annotations[mover.AnnMoveTo]; ok {
		t.Errorf("the request %s is still on the claim", mover.AnnMoveTo)
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
