//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/pkg/kubeview"
)

// TestKubectlCarve: `kubectl carve` (cmd/kubectl-carve) answers from the
// API what the test bed's own reads say: the volume of a bound PVC with its
// pod, node and LV (found in that node's VG), the capacity every node
// publishes per class, and a PVC no node can hold as Pending with its pod
// and its last event.
func TestKubectlCarve(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	// make build puts kubectl-carve beside carve.
	bin := filepath.Join(filepath.Dir(os.Getenv("CARVE_BIN")), "kubectl-carve")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kubectl-carve is not beside CARVE_BIN (%v): run `make build` (make test-e2e does)", err)
	}
	carve := func(v any, args ...string) {
		t.Helper()
		argv := append(args, "-o", "json", "--kubeconfig", bed.Control.Kubeconfig)
		out, err := exec.CommandContext(ctx, bin, argv...).Output()
		if err != nil {
			var stderr string
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				stderr = string(ee.Stderr)
			}
			t.Fatalf("kubectl carve %s: %v: %s", strings.Join(args, " "), err, stderr)
		}
		if err := json.Unmarshal(out, v); err != nil {
			t.Fatalf("kubectl carve %s: %v\n%s", args[0], err, out)
		}
	}

	ns := newNamespace(t, "kcarve")
	createPVCAndPod(t, ctx, newPVC(ns, "data", thickSC, "1Gi"), newPod(ns, "app", "data"))
	createPVCAndPod(t, ctx, newPVC(ns, "huge", thickSC, "1Ti"), newPod(ns, "stuck", "huge"))
	pvc := waitBound(t, ns, "data", settle)
	node := waitPodNode(t, ns, "app", settle)

	var vols []kubeview.Volume
	carve(&vols, "volumes")
	var mine *kubeview.Volume
	for i := range vols {
		if vols[i].Claim == ns+"/data" {
			mine = &vols[i]
		}
	}
	if mine == nil {
		t.Fatalf("kubectl carve volumes lacks %s/data: %+v", ns, vols)
	}
	nodes, lv, err := lvOfPV(ctx, pvc.Spec.VolumeName)
	if err != nil {
		t.Fatal(err)
	}
	if mine.PV != pvc.Spec.VolumeName || mine.Node != node || len(nodes) != 1 || nodes[0] != node ||
		lv == nil || mine.LV != lv.Name || mine.SizeBytes != gib(1) || len(mine.Pods) != 1 || mine.Pods[0] != ns+"/app" {
		t.Errorf("kubectl carve volumes says %+v; the bed has PV %s, pod %s/app on %s, LV %v on %v", *mine, pvc.Spec.VolumeName, ns, node, lv, nodes)
	}

	var caps []kubeview.Capacity
	carve(&caps, "capacity")
	seen := 0
	for _, c := range caps {
		if c.StorageClass != thickSC {
			continue
		}
		seen++
		want, err := capacityBytes(context.Background(), c.Node, thickSC)
		if err != nil {
			t.Fatal(err)
		}
		if c.CapacityBytes != want || c.DeviceClass != "thick" {
			t.Errorf("kubectl carve capacity: %s %s reports %d (class %q), the CSIStorageCapacity says %d", c.Node, thickSC, c.CapacityBytes, c.DeviceClass, want)
		}
		if c.Node == node && c.Volumes < 1 {
			t.Errorf("kubectl carve capacity: %s shows no volume of class thick on %s", thickSC, node)
		}
	}
	if seen != len(bed.Nodes) {
		t.Errorf("kubectl carve capacity lists %s on %d nodes, the bed has %d: %+v", thickSC, seen, len(bed.Nodes), caps)
	}

	// The 1 TiB claim fits nowhere: Pending, with its pod and last event.
	waitFor(t, settle, "kubectl carve pending to list the 1 TiB claim with an event", func(context.Context) (bool, string, error) {
		var pend []kubeview.Pending
		carve(&pend, "pending")
		for _, p := range pend {
			if p.Claim == ns+"/huge" {
				evs, err := events(ctx, ns, "PersistentVolumeClaim", "huge")
				if err != nil {
					return false, "", err
				}
				reasons := map[string]bool{}
				for _, e := range evs {
					reasons[e.Reason] = true
				}
				ok := p.Reason != "" && reasons[p.Reason] && len(p.Pods) == 1 && p.Pods[0] == ns+"/stuck"
				return ok, p.Reason + ": " + p.Message, nil
			}
		}
		return false, "not listed", nil
	})
}
