//go:build e2e

package e2e

import (
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/carve-csi/carve/internal/volume"
)

// TestNothingLeftBehind runs last (the finale's order): after every
// scenario no PV and no carve LV is left. TestMain checks the loop devices
// after teardown.
func TestNothingLeftBehind(t *testing.T) {
	finale.Enter(t)
	ctx := testCtx(t, time.Minute)
	pvs, err := bed.Client.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pv := range pvs.Items {
		t.Errorf("PV %s (%s) left behind", pv.Name, pv.Status.Phase)
	}
	all, err := lvsByNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for node, lvs := range all {
		for _, lv := range lvs {
			if slices.Contains(lv.Tags, volume.TagOwner) {
				t.Errorf("carve LV %s/%s left behind on %s", lv.VolumeGroup, lv.Name, node)
			} else {
				t.Errorf("LV %s/%s (not carve's) left behind on %s", lv.VolumeGroup, lv.Name, node)
			}
		}
	}
	if err := bed.CheckAlive(); err != nil {
		t.Errorf("a process of the test bed ended early: %v", err)
	}
}
