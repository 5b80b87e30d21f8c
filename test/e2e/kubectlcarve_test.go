//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/carve-csi/carve/internal/kubectl/view"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/kubetest"
)

// TestKubectlCarve: `kubectl carve` (cmd/kubectl-carve) answers from the
// API what the test bed's own reads say: the volume of a bound PVC with its
// pod, node and LV (found in that node's VG), in its namespace's view and
// in -A's but not in another namespace's, the capacity every node publishes
// per class, a PVC no node can hold as Pending with its pod and its last
// event, every node's agent (its pod, its channel endpoint, its CSINode
// registration, its version and free space), and everything about one
// claim (describe).
func TestKubectlCarve(t *testing.T) {
	ctx := testCtx(t, 3*time.Minute)
	// make build puts kubectl-carve beside carve.
	bin := filepath.Join(filepath.Dir(os.Getenv("CARVE_BIN")), "kubectl-carve")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("kubectl-carve is not beside CARVE_BIN (%v): run `make build` (make test-e2e does)", err)
	}
	text := func(args ...string) string {
		t.Helper()
		argv := append(args, "--kubeconfig", bed.Control.Kubeconfig)
		return output(t, exec.CommandContext(ctx, bin, argv...), "kubectl carve "+strings.Join(args, " "))
	}
	carve := func(v any, args ...string) {
		t.Helper()
		out := text(append(args, "-o", "json")...)
		if err := json.Unmarshal([]byte(out), v); err != nil {
			t.Fatalf("kubectl carve %s: %v\n%s", args[0], err, out)
		}
	}

	ns := newNamespace(t, "kcarve")
	createPVCAndPod(t, ctx, newPVC(ns, "data", thickSC, "1Gi"), newPod(ns, "app", "data"))
	createPVCAndPod(t, ctx, newPVC(ns, "huge", thickSC, "1Ti"), newPod(ns, "stuck", "huge"))
	pvc := waitBound(t, ns, "data", settle)
	node := waitPodNode(t, ns, "app", settle)

	// The claim's namespace and -A list it; another namespace does not.
	var vols []view.Volume
	carve(&vols, "volumes", "-A")
	var mine *view.Volume
	for i := range vols {
		if vols[i].Claim == ns+"/data" {
			mine = &vols[i]
		}
	}
	if mine == nil {
		t.Fatalf("kubectl carve volumes -A lacks %s/data: %+v", ns, vols)
	}
	var inNS, elsewhere []view.Volume
	carve(&inNS, "volumes", "-n", ns)
	carve(&elsewhere, "-n", bed.Namespace, "volumes")
	if len(inNS) != 1 || inNS[0].Claim != ns+"/data" {
		t.Errorf("kubectl carve volumes -n %s lists %+v, want only %s/data", ns, inNS, ns)
	}
	for _, v := range elsewhere {
		if strings.HasPrefix(v.Claim, ns+"/") {
			t.Errorf("kubectl carve volumes -n %s lists %s", bed.Namespace, v.Claim)
		}
	}
	if table := text("volumes", "-n", ns); !strings.HasPrefix(table, "PVC ") || !strings.Contains(table, " "+pvc.Spec.VolumeName+" ") {
		t.Errorf("kubectl carve volumes -n %s prints no row for %s:\n%s", ns, pvc.Spec.VolumeName, table)
	}
	nodes, lv, err := lvOfPV(ctx, pvc.Spec.VolumeName)
	if err != nil {
		t.Fatal(err)
	}
	if mine.PV != pvc.Spec.VolumeName || mine.Node != node || len(nodes) != 1 || nodes[0] != node ||
		lv == nil || mine.LV != lv.Name || mine.SizeBytes != gib(1) || len(mine.Pods) != 1 || mine.Pods[0] != ns+"/app" {
		t.Errorf("kubectl carve volumes says %+v; the bed has PV %s, pod %s/app on %s, LV %v on %v", *mine, pvc.Spec.VolumeName, ns, node, lv, nodes)
	}

	var caps []view.Capacity
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
		var pend []view.Pending
		carve(&pend, "pending", "-n", ns)
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

	checkCarveNodes(t, ctx, carve)
	checkCarveDescribe(t, ctx, carve, text, pvc, node, lv)
	checkCarveSnapshots(t, ctx, carve, ns, node)
	// What an operator sees, for the log of a failed run.
	for _, args := range [][]string{{"nodes"}, {"capacity"}, {"volumes", "-n", ns, "-o", "wide"}, {"pending", "-A"},
		{"describe", "data", "-n", ns}, {"snapshots", "-n", ns, "-o", "wide"}} {
		t.Logf("$ kubectl carve %s\n%s", strings.Join(args, " "), text(args...))
	}
}

// checkCarveNodes: `kubectl carve nodes` lists every node of the bed with
// its agent's DaemonSet pod, its Ready endpoint in the carve-node
// EndpointSlices, its CSINode registration, the DaemonSet's image tag as
// version, and the thick class's free space as the CSIStorageCapacity says;
// an agent that is not Ready says why.
func checkCarveNodes(t *testing.T, ctx context.Context, carve func(any, ...string)) {
	t.Helper()
	var nodes []view.Node
	carve(&nodes, "nodes")
	byName := map[string]view.Node{}
	for _, n := range nodes {
		byName[n.Node] = n
	}
	for _, bn := range bed.Nodes {
		n, ok := byName[bn.Name]
		if !ok {
			t.Errorf("kubectl carve nodes lacks %s: %+v", bn.Name, nodes)
			continue
		}
		pod, err := bed.Client.CoreV1().Pods(bed.Namespace).Get(ctx, bn.PodName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		image := ""
		for _, c := range pod.Spec.Containers {
			if c.Name == "carve" {
				image = c.Image
			}
		}
		ready := "NotReady"
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ready = "Ready"
			}
		}
		free, err := capacityBytes(ctx, bn.Name, thickSC)
		if err != nil {
			t.Fatal(err)
		}
		if n.Pod != bed.Namespace+"/"+bn.PodName || n.Channel != "Ready" || !n.Registered || n.Agent != ready ||
			(ready != "Ready" && n.Reason == "") || n.Version == "" || !strings.HasSuffix(image, ":"+n.Version) ||
			n.Free[thickClass] != free {
			t.Errorf("kubectl carve nodes says %+v; the bed has pod %s (image %s, %s), thick capacity %d", n, bn.PodName, image, ready, free)
		}
	}
}

// checkCarveDescribe: `kubectl carve describe` of the bound claim names its
// PV, node, volume group and LV as the node's VG holds them, its pod, its
// class, its events as the API has them, and the kubelet's metric of it.
func checkCarveDescribe(t *testing.T, ctx context.Context, carve func(any, ...string), text func(...string) string,
	pvc *corev1.PersistentVolumeClaim, node string, lv *lvm.LogicalVolume) {
	t.Helper()
	var c view.Claim
	carve(&c, "describe", pvc.Name, "-n", pvc.Namespace)
	var vg string
	for _, n := range bed.Nodes {
		if n.Name == node {
			vg = n.VG.Name
		}
	}
	if c.PV != pvc.Spec.VolumeName || c.Node != node || c.VolumeGroup != vg || c.LV != lv.Name || c.DeviceClass != thickClass ||
		c.StorageClass != thickSC || c.Phase != "Bound" || len(c.Pods) != 1 || c.Pods[0] != pvc.Namespace+"/app" {
		t.Errorf("kubectl carve describe %s says %+v; the bed has PV %s on %s, LV %s/%s", pvc.Name, c, pvc.Spec.VolumeName, node, vg, lv.Name)
	}
	evs, err := events(ctx, pvc.Namespace, "PersistentVolumeClaim", pvc.Name)
	if err != nil {
		t.Fatal(err)
	}
	described := map[string]bool{}
	for _, e := range c.Events {
		described[e.Object+" "+e.Reason] = true
	}
	for _, e := range evs {
		if !described["PersistentVolumeClaim/"+pvc.Name+" "+e.Reason] {
			t.Errorf("kubectl carve describe %s lacks event %s: %s", pvc.Name, e.Reason, e.Message)
		}
	}
	metric := fmt.Sprintf(`kubelet_volume_stats_used_bytes{namespace=%q,persistentvolumeclaim=%q}`, pvc.Namespace, pvc.Name)
	if !slices.Contains(c.Metrics, metric) {
		t.Errorf("kubectl carve describe %s names metrics %q, not %s", pvc.Name, c.Metrics, metric)
	}
	out := text("describe", pvc.Name, "-n", pvc.Namespace)
	for _, want := range []string{"Name:", pvc.Name, "LV:", lv.Name, "Node:", node, "Metrics:", metric} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl carve describe %s prints no %q:\n%s", pvc.Name, want, out)
		}
	}
}

// checkCarveSnapshots: a VolumeSnapshot of the claim is listed by
// `kubectl carve snapshots` in its namespace (and not in another) with its
// source claim and bound content; once carve answered, it is on the
// claim's node, or carries carve's error (the simulated nodes have no
// device-mapper, so their snapshots fail; the guest tiers make real ones).
func checkCarveSnapshots(t *testing.T, ctx context.Context, carve func(any, ...string), ns, node string) {
	t.Helper()
	dc := dynamicClient(t)
	class := "e2e-" + ns
	if _, err := dc.Resource(kubetest.VolumeSnapshotClasses).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
		"metadata": map[string]any{"name": class}, "driver": cluster.DriverName, "deletionPolicy": "Delete",
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create VolumeSnapshotClass: %v", err)
	}
	t.Cleanup(func() { deleteSnapshotObjects(t, dc, ns, "snap", class) })
	if err := kubetest.CreateVolumeSnapshot(ctx, dc, ns, "snap", class, "data"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, settle, "kubectl carve snapshots to show the snapshot on its node or with carve's error", func(context.Context) (bool, string, error) {
		var snaps []view.Snapshot
		carve(&snaps, "snapshots", "-n", ns)
		if len(snaps) != 1 {
			return false, fmt.Sprintf("%+v", snaps), nil
		}
		s := snaps[0]
		if s.Name != "snap" || s.SourceClaim != "data" || s.Class != class || s.Content == "" {
			return false, fmt.Sprintf("%+v", s), nil
		}
		return s.ReadyToUse && s.Node == node || s.Error != "", fmt.Sprintf("%+v", s), nil
	})
	var elsewhere []view.Snapshot
	carve(&elsewhere, "snapshots", "-n", bed.Namespace)
	for _, s := range elsewhere {
		if s.Namespace == ns {
			t.Errorf("kubectl carve snapshots -n %s lists %s/%s", bed.Namespace, s.Namespace, s.Name)
		}
	}
}
