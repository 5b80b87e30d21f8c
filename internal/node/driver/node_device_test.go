package driver

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// Stage and publish find an active volume by its device node and the class
// in the volume context, with no LVM command; without either they ask LVM
// (and activate an inactive LV).
func TestStageAndPublishLookup(t *testing.T) {
	cases := []struct {
		name       string
		volumeCtx  map[string]string
		deviceNode bool
		inactive   bool
		wantCode   codes.Code
		wantGets   int
	}{
		{name: "device node and class in the volume context", volumeCtx: map[string]string{volume.ParamDeviceClass: "fast"}, deviceNode: true, wantGets: 0},
		{name: "no volume context", deviceNode: true, wantGets: 2},
		{name: "no device node yet, LV active", volumeCtx: map[string]string{volume.ParamDeviceClass: "fast"}, wantGets: 2},
		// Activated by stage; publish reads it again because this fixture's device node is not one.
		{name: "inactive LV", volumeCtx: map[string]string{volume.ParamDeviceClass: "fast"}, inactive: true, wantGets: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newNodeFixture(t)
			fx.ns.isDeviceNode = func(path string) bool { return tc.deviceNode && path == fx.device }
			if tc.inactive {
				fx.setLV(fx.id, func(lv *lvm.LogicalVolume) { lv.Attr.Active = false })
			}
			stage := fx.stageReq(mountCap("", sw))
			stage.VolumeContext = fx.volumeContext(tc.volumeCtx)
			_, err := fx.ns.NodeStageVolume(context.Background(), stage)
			csitest.WantCode(t, err, tc.wantCode)
			if err == nil {
				publish := fx.publishReq(mountCap("", sw), false)
				publish.VolumeContext = fx.volumeContext(tc.volumeCtx)
				if _, err := fx.ns.NodePublishVolume(context.Background(), publish); err != nil {
					t.Fatalf("publish: %v", err)
				}
			}
			if fx.lvm.Gets != tc.wantGets {
				t.Errorf("stage and publish read the LV %d times, want %d", fx.lvm.Gets, tc.wantGets)
			}
			if got := sampleCountOf(t, fx, "stage", "fast"); err == nil && got != 1 {
				t.Errorf("stage phase with device_class=fast counted %d times, want 1", got)
			}
		})
	}
}

// sampleCountOf is the number of observations of a phase with a class.
func sampleCountOf(t *testing.T, fx *nodeFixture, phase, class string) uint64 {
	t.Helper()
	families, err := fx.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "carve_phase_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["phase"] == phase && labels["device_class"] == class {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}
