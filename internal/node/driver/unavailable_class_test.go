package driver

import (
	"context"
	"errors"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// TestBadClassHasNoCapacity: a missing or unreadable volume group, one
// with a missing PV, a missing or failed thin pool make GetCapacity
// answer no capacity for the classes that use it, and the others' as it
// was; CreateVolume in the bad class is RESOURCE_EXHAUSTED, so the pod
// goes to another node (what the lifecycle does with a bad class is
// provision's TestOneBadClassLeavesTheOthers).
func TestBadClassHasNoCapacity(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		class string // the class the breakage hits
		brk   func(fx *controllerFixture)
	}{
		{name: "volume group missing", class: "other", brk: func(fx *controllerFixture) { fx.lvm.HideVG("vg2") }},
		{name: "volume group unreadable", class: "other", brk: func(fx *controllerFixture) {
			fx.lvm.Unreadable = map[string]error{"vg2": errors.New("checksum error in metadata area")}
		}},
		{name: "volume group with a missing PV", class: "other", brk: func(fx *controllerFixture) { fx.lvm.VGs["vg2"].MissingPVs = 1 }},
		{name: "thin pool missing", class: "thin", brk: func(fx *controllerFixture) {
			delete(fx.lvm.Pools, "vg1/pool")
			delete(fx.lvm.LVs, "vg1/pool")
		}},
		{name: "thin pool failed", class: "thin", brk: func(fx *controllerFixture) { fx.lvm.LVs["vg1/pool"].Attr.Health = lvm.HealthFailed }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newControllerFixture(t)
			capacity := map[string]int64{}
			for _, c := range fx.cfg.Names() {
				capacity[c] = capacityOf(t, fx, c)
			}
			tt.brk(fx) // between calls: the fake's state is not in use
			if err := fx.view.Refresh(ctx); err != nil {
				t.Fatalf("Refresh = %v; one bad class must not fail it", err)
			}
			for _, c := range fx.cfg.Names() {
				got := capacityOf(t, fx, c)
				switch {
				case c == tt.class && got != 0:
					t.Errorf("GetCapacity(%s) = %d, want 0", c, got)
				case c != tt.class && got != capacity[c]:
					t.Errorf("GetCapacity(%s) = %d, was %d: a healthy class changed", c, got, capacity[c])
				}
			}
			_, err := fx.cs.CreateVolume(ctx, createReq("new-in-bad-class", gib, map[string]string{volume.ParamDeviceClass: tt.class}))
			csitest.WantCode(t, err, codes.ResourceExhausted, "cannot make volumes of device class "+tt.class)
		})
	}
}

func capacityOf(t *testing.T, fx *controllerFixture, class string) int64 {
	t.Helper()
	resp, err := fx.cs.GetCapacity(context.Background(), &csi.GetCapacityRequest{Parameters: map[string]string{volume.ParamDeviceClass: class}})
	if err != nil {
		t.Fatalf("GetCapacity(%s): %v", class, err)
	}
	return resp.GetAvailableCapacity()
}

// Unpublish and unstage never ask LVM (their metric label comes from what
// stage and publish cached, else "unknown"), so they work, and answer at
// once, for a volume whose volume group is missing or unreadable, also
// after a plugin restart.
func TestUnpublishAndUnstageNeedNoLVM(t *testing.T) {
	for _, brk := range []struct {
		name string
		do   func(fx *nodeFixture)
	}{
		{"volume group missing", func(fx *nodeFixture) { fx.lvm.HideVG("vg1") }},
		{"volume group unreadable", func(fx *nodeFixture) {
			fx.lvm.Mu.Lock()
			fx.lvm.Unreadable = map[string]error{"vg1": errors.New("read error on /dev/sdb")}
			fx.lvm.Mu.Unlock()
		}},
	} {
		for _, restart := range []bool{false, true} {
			name := brk.name
			if restart {
				name += ", after a plugin restart"
			}
			t.Run(name, func(t *testing.T) {
				fx := newNodeFixture(t)
				fx.stage(t, mountCap("", sw))
				fx.publish(t, mountCap("", sw), false)
				brk.do(fx)
				if restart {
					fx.ns = NewNodeServer(fx.ns.cfg)
				}
				gets := fx.lvm.Gets
				if _, err := fx.ns.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: fx.id, TargetPath: fx.target}); err != nil {
					t.Fatalf("unpublish: %v", err)
				}
				if _, err := fx.ns.NodeUnstageVolume(context.Background(), &csi.NodeUnstageVolumeRequest{VolumeId: fx.id, StagingTargetPath: fx.staging}); err != nil {
					t.Fatalf("unstage: %v", err)
				}
				fx.wantGone(t, fx.target, "target")
				fx.wantGone(t, fx.staging, "staging path")
				if fx.lvm.Gets != gets {
					t.Errorf("unpublish and unstage read LVM %d times", fx.lvm.Gets-gets)
				}
				wantClass := "fast"
				if restart {
					wantClass = metrics.UnknownClass
				}
				if n := histogramCount(t, fx.reg, "carve_phase_duration_seconds",
					map[string]string{"phase": metrics.PhaseUnstage, "device_class": wantClass, "result": "OK"}); n != 1 {
					t.Errorf("unstage recorded %d times with class %s, want 1", n, wantClass)
				}
			})
		}
	}
}

// Stage of a volume whose volume group is missing says so.
func TestStageVolumeGroupMissing(t *testing.T) {
	fx := newNodeFixture(t)
	fx.lvm.HideVG("vg1")
	_, err := fx.ns.NodeStageVolume(context.Background(), fx.stageReq(mountCap("", sw)))
	csitest.WantCode(t, err, codes.NotFound, "volume group vg1 is missing")
}
