//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/cluster"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// createOrphan makes, on node n, the LV csi-provisioner would make for the
// PVC ns/name, through the plugin's socket with the parameters
// --extra-create-metadata adds, and then deletes the PVC: the state a
// claim deleted while its volume was being made leaves (csi-provisioner
// never writes the PV). It returns the volume name and when the LV was
// made.
func createOrphan(t *testing.T, ctx context.Context, n *cluster.Node, ns, name string, size int64) (string, time.Time) {
	t.Helper()
	pvc, err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, newPVC(ns, name, thickSC, "64Mi"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	volName := "pvc-" + string(pvc.UID)
	// Through carve's controller, which routes by the topology to n: an
	// LV that no provisioner asked for, so no PV will name it.
	conn, err := grpc.NewClient("unix://"+bed.Central.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := conn.Close(); err != nil {
			t.Errorf("closing the connection to %s: %v", bed.Central.Socket, err)
		}
	}()
	seg := &csi.Topology{Segments: map[string]string{cluster.TopologyKey: n.Name}}
	made := time.Now()
	if _, err := csi.NewControllerClient(conn).CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               volName,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{plugintest.MountCapability("ext4")},
		Parameters: map[string]string{volume.ParamDeviceClass: thickClass,
			"csi.storage.k8s.io/pvc/namespace": ns, "csi.storage.k8s.io/pvc/name": name, "csi.storage.k8s.io/pv/name": volName},
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{seg}, Preferred: []*csi.Topology{seg}},
	}); err != nil {
		t.Fatalf("CreateVolume on %s: %v", n.Name, err)
	}
	if err := bed.Client.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	return volName, made
}

// TestOrphanedVolume: an LV carve made whose claim was deleted before its
// PV existed is reported by carve controller's audit (metric with the
// node's label, Event on the Node naming LV, size and claim) once the
// grace period has passed and not before, and left in place; once the
// controller runs with --remove-orphans, it is quarantined (renamed
// carve-orphan-<hex>) and, the removal grace period later, removed through
// the node's agent, and the capacity comes back.
func TestOrphanedVolume(t *testing.T) {
	ns := newNamespace(t, "orphan")
	ctx := testCtx(t, 3*time.Minute)
	const size = 64 << 20
	small, large := bed.Node("node-small"), bed.Node("node-large")
	capLarge, err := scrape(ctx, large.MetricsURL, "carve_capacity_available_bytes", `device_class="thick"`)
	if err != nil {
		t.Fatal(err)
	}
	volSmall, madeSmall := createOrphan(t, ctx, small, ns, "lost-small", size)
	volLarge, _ := createOrphan(t, ctx, large, ns, "lost-large", size)
	lvSmall := small.VG.Name + "/" + volume.LVNameFor(volSmall)
	lvLarge := large.VG.Name + "/" + volume.LVNameFor(volLarge)
	t.Cleanup(func() {
		// If the removal did not happen, remove the orphans (or their
		// quarantines) as an operator would.
		for _, o := range []struct {
			n   *cluster.Node
			vol string
		}{{small, volSmall}, {large, volLarge}} {
			removeLVAndQuarantine(t, o.n, volume.LVNameFor(o.vol))
		}
	})
	ctrlMetrics := bed.Central.MetricsURL
	onNode := func(n *cluster.Node) string { return `node="` + n.Name + `"` }

	orphanEvents := func(ctx context.Context, node, reason, lv string) ([]corev1.Event, error) {
		return eventsWith(ctx, "default", "Node", node, reason, "LV "+lv)
	}
	// Half the grace period in, the audit has run several passes
	// (--audit-interval 2s) and must not have spoken.
	time.Sleep(time.Until(madeSmall.Add(orphanGrace / 2)))
	if v, err := scrape(ctx, ctrlMetrics, "carve_orphaned_volumes", onNode(small), `device_class="thick"`); err != nil || v != 0 {
		t.Errorf("carve_orphaned_volumes on %s before the grace period: %v (%v), want 0", small.Name, v, err)
	}
	if evs, err := orphanEvents(ctx, small.Name, "OrphanedVolume", lvSmall); err != nil || len(evs) != 0 {
		t.Errorf("OrphanedVolume events before the grace period: %v (%v)", evs, err)
	}

	var ev corev1.Event
	waitFor(t, orphanGrace+30*time.Second, "the orphan on node-small to be reported", func(ctx context.Context) (bool, string, error) {
		n, err := scrape(ctx, ctrlMetrics, "carve_orphaned_volumes", onNode(small), `device_class="thick"`)
		if err != nil {
			return false, "", err
		}
		b, err := scrape(ctx, ctrlMetrics, "carve_orphaned_volume_bytes", onNode(small), `device_class="thick"`)
		if err != nil {
			return false, "", err
		}
		evs, err := orphanEvents(ctx, small.Name, "OrphanedVolume", lvSmall)
		if err != nil {
			return false, "", err
		}
		if len(evs) > 0 {
			ev = evs[0]
		}
		return n == 1 && b == size && len(evs) == 1, fmt.Sprintf("orphans %v, bytes %v, events %d", n, b, len(evs)), nil
	})
	if at := ev.FirstTimestamp.Time; at.Before(madeSmall.Add(orphanGrace).Truncate(time.Second)) {
		t.Errorf("orphan reported at %s, before the grace period ended (%s + %s)", at, madeSmall, orphanGrace)
	}
	for _, want := range []string{fmt.Sprintf("(%d bytes", size), "claim " + ns + "/lost-small", volSmall} {
		if !strings.Contains(ev.Message, want) {
			t.Errorf("event %q does not name %q", ev.Message, want)
		}
	}
	if lvs, err := small.LVM.ListLVs(ctx, small.VG.Name); err != nil || !slices.ContainsFunc(lvs, func(l lvm.LogicalVolume) bool { return l.Name == volume.LVNameFor(volSmall) }) {
		t.Errorf("the reported orphan is gone (%v): nothing may delete it without --remove-orphans", err)
	}

	t.Run("removed with --remove-orphans, capacity back", func(t *testing.T) {
		if err := bed.Central.RestartControllerWith(ctx, []string{"--remove-orphans=true"}); err != nil {
			t.Fatalf("restarting carve controller with --remove-orphans: %v", err)
		}
		t.Cleanup(func() {
			if err := bed.Central.RestartControllerWith(context.Background(), nil); err != nil {
				t.Errorf("restarting carve controller without --remove-orphans: %v", err)
			}
		})
		// The new controller waits for the Lease its killed predecessor
		// held (15 s), then starts every clock anew: the orphan is
		// quarantined a grace period later, and removed a removal grace
		// period after that.
		quarantine, _ := volume.QuarantineName(volume.LVNameFor(volLarge))
		waitFor(t, 2*orphanGrace+orphanRemovalGrace+45*time.Second, "carve controller to quarantine, then remove, node-large's orphan", func(ctx context.Context) (bool, string, error) {
			lvs, err := large.LVM.ListLVs(ctx, large.VG.Name)
			if err != nil {
				return false, "", err
			}
			there := slices.ContainsFunc(lvs, func(l lvm.LogicalVolume) bool { return l.Name == volume.LVNameFor(volLarge) || l.Name == quarantine })
			quarantined, err := orphanEvents(ctx, large.Name, "OrphanedVolumeQuarantined", lvLarge)
			if err != nil {
				return false, "", err
			}
			evs, err := orphanEvents(ctx, large.Name, "OrphanedVolumeRemoved", lvLarge)
			if err != nil {
				return false, "", err
			}
			c, err := scrape(ctx, large.MetricsURL, "carve_capacity_available_bytes", `device_class="thick"`)
			if err != nil {
				return false, "", err
			}
			return !there && len(quarantined) == 1 && len(evs) == 1 && c == capLarge,
				fmt.Sprintf("LV or its quarantine there %v, quarantine events %d, removal events %d, capacity %v (before %v)", there, len(quarantined), len(evs), c, capLarge), nil
		})
		quarantined, err := orphanEvents(ctx, large.Name, "OrphanedVolumeQuarantined", lvLarge)
		if err != nil || len(quarantined) != 1 {
			t.Fatalf("quarantine events: %v (%v)", quarantined, err)
		}
		removed, err := orphanEvents(ctx, large.Name, "OrphanedVolumeRemoved", lvLarge)
		if err != nil || len(removed) != 1 {
			t.Fatalf("removal events: %v (%v)", removed, err)
		}
		if gap := removed[0].FirstTimestamp.Sub(quarantined[0].FirstTimestamp.Time); gap < orphanRemovalGrace-time.Second {
			t.Errorf("removed %s after the quarantine, before the removal grace period (%s)", gap, orphanRemovalGrace)
		}
		if v, err := scrape(ctx, ctrlMetrics, "carve_orphaned_volumes_quarantined_total", onNode(large), `result="success"`); err != nil || v < 1 {
			t.Errorf("carve_orphaned_volumes_quarantined_total on %s: %v (%v)", large.Name, v, err)
		}
		if v, err := scrape(ctx, ctrlMetrics, "carve_orphaned_volumes_removed_total", onNode(large), `result="success"`); err != nil || v < 1 {
			t.Errorf("carve_orphaned_volumes_removed_total on %s: %v (%v)", large.Name, v, err)
		}
	})
}

// TestVolumeDataMissing: a PV whose LV is removed behind carve's back gets
// a VolumeDataMissing Event on the PV and on its PVC, and the metric.
func TestVolumeDataMissing(t *testing.T) {
	ns := newNamespace(t, "missing")
	ctx := testCtx(t, 3*time.Minute)
	pvc, nodeName := dataClaimWithPod(t, ctx, ns, "64Mi", time.Minute)
	node := bed.Node(nodeName)
	lv := volume.LVNameFor(pvc.Spec.VolumeName)
	if err := node.RemoveLV(ctx, lv); err != nil {
		t.Fatalf("lvremove behind carve's back: %v", err)
	}
	waitFor(t, orphanGrace+refreshInterval+30*time.Second, "VolumeDataMissing events on the PV and the PVC", func(ctx context.Context) (bool, string, error) {
		onPV, err := eventsWith(ctx, "default", "PersistentVolume", pvc.Spec.VolumeName, "VolumeDataMissing", node.VG.Name+"/"+lv)
		if err != nil {
			return false, "", err
		}
		onPVC, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "data", "VolumeDataMissing", node.VG.Name+"/"+lv)
		if err != nil {
			return false, "", err
		}
		m, err := scrape(ctx, bed.Central.MetricsURL, "carve_volumes_missing", `node="`+node.Name+`"`, `volume_group="`+node.VG.Name+`"`)
		if err != nil {
			return false, "", err
		}
		return len(onPV) == 1 && len(onPVC) == 1 && m == 1, fmt.Sprintf("events on PV %d, on PVC %d, metric %v", len(onPV), len(onPVC), m), nil
	})
}

// removeLVAndQuarantine removes, as an operator would, the LV name of
// node n and its quarantine, whichever exists.
func removeLVAndQuarantine(t *testing.T, n *cluster.Node, name string) {
	t.Helper()
	q, _ := volume.QuarantineName(name)
	for _, lv := range []string{name, q} {
		if _, err := n.LVM.GetLV(context.Background(), n.VG.Name, lv); err == nil {
			if err := n.RemoveLV(context.Background(), lv); err != nil {
				t.Errorf("removing %s on %s: %v", lv, n.Name, err)
			}
		}
	}
}
