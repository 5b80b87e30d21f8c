//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// TestVolumeAbnormalEvents: a volume that turns abnormal (here its LV
// removed behind carve's back) gets one Warning VolumeAbnormal Event on
// its claim and counts in carve_volumes_abnormal; put back, it gets one
// Normal VolumeRecovered Event, however many audit passes follow, and the
// count goes back to 0.
func TestVolumeAbnormalEvents(t *testing.T) {
	ns := newNamespace(t, "health")
	ctx := testCtx(t, 4*time.Minute)
	pvc, nodeName := dataClaimWithPod(t, ctx, ns, "64Mi", time.Minute)
	node := bed.Node(nodeName)
	name := volume.LVNameFor(pvc.Spec.VolumeName)
	lv, err := node.LVM.GetLV(ctx, node.VG.Name, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := node.RemoveLV(ctx, name); err != nil {
		t.Fatalf("lvremove behind carve's back: %v", err)
	}
	abnormal := func(ctx context.Context) (float64, error) {
		return scrape(ctx, bed.Central.MetricsURL, "carve_volumes_abnormal", `node="`+node.Name+`"`, `volume_group="`+node.VG.Name+`"`)
	}
	onClaim := func(ctx context.Context, typ, reason string) ([]corev1.Event, error) {
		evs, err := eventsWith(ctx, ns, "PersistentVolumeClaim", "data", reason, node.VG.Name+"/"+name)
		var out []corev1.Event
		for _, e := range evs {
			if e.Type == typ {
				out = append(out, e)
			}
		}
		return out, err
	}
	// claimSays holds once the claim has one Event of typ and reason and
	// carve_volumes_abnormal is want.
	claimSays := func(typ, reason string, want float64) func(ctx context.Context) (bool, string, error) {
		return func(ctx context.Context) (bool, string, error) {
			evs, err := onClaim(ctx, typ, reason)
			if err != nil {
				return false, "", err
			}
			m, err := abnormal(ctx)
			if err != nil {
				return false, "", err
			}
			return len(evs) == 1 && m == want, fmt.Sprintf("events %d, metric %v", len(evs), m), nil
		}
	}
	waitFor(t, orphanGrace+refreshInterval+30*time.Second, "a VolumeAbnormal Event on the claim and carve_volumes_abnormal 1", claimSays(corev1.EventTypeWarning, "VolumeAbnormal", 1))

	// Put back (same name, size and tags), as after restoring the
	// volume group's metadata.
	if _, err := node.LVM.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: node.VG.Name, Name: name, Size: lv.Size, Tags: lv.Tags}); err != nil {
		t.Fatalf("lvcreate the LV back: %v", err)
	}
	waitFor(t, refreshInterval+30*time.Second, "a VolumeRecovered Event on the claim and carve_volumes_abnormal 0", claimSays(corev1.EventTypeNormal, "VolumeRecovered", 0))
	// Several passes later, each was said once.
	time.Sleep(5 * auditInterval)
	for _, e := range []struct{ typ, reason string }{{corev1.EventTypeWarning, "VolumeAbnormal"}, {corev1.EventTypeNormal, "VolumeRecovered"}} {
		evs, err := onClaim(ctx, e.typ, e.reason)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != 1 || evs[0].Count > 1 {
			t.Errorf("%s Events on the claim: %d (count %v), want one, said once", e.reason, len(evs), evs)
		}
	}
}
