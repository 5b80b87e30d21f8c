package driver

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// After a reboot on a host without LVM autoactivation every LV is
// inactive. The node activates the one LV a call needs (a thin LV's pool
// comes with it), only if it is carve's, and then proceeds.
func TestNodeActivatesTheLVItNeeds(t *testing.T) {
	deactivate := func(fx *nodeFixture, ids ...string) {
		for _, id := range ids {
			fx.setLV(id, func(lv *lvm.LogicalVolume) { lv.Attr.Active = false })
		}
	}
	// twoInactive leaves the fixture's volume and a second one inactive.
	twoInactive := func(t *testing.T, fx *nodeFixture) {
		other, _ := fx.addVolume(t, "pvc-2")
		deactivate(fx, fx.id, other)
	}
	expandBlock := func(t *testing.T, fx *nodeFixture) error {
		fx.publish(t, blockCap(sw), false)
		deactivate(fx, fx.id)
		_, err := fx.ns.NodeExpandVolume(context.Background(), &csi.NodeExpandVolumeRequest{VolumeId: fx.id, VolumePath: fx.target,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gib}})
		return err
	}
	stageFS := func(t *testing.T, fx *nodeFixture) error {
		_, err := fx.ns.NodeStageVolume(context.Background(), fx.stageReq(mountCap("", sw)))
		return err
	}
	cases := []struct {
		name    string
		prepare func(t *testing.T, fx *nodeFixture)
		call    func(t *testing.T, fx *nodeFixture) error
		code    codes.Code
		msg     []string
		// activated is what must be active afterwards (vg/name); the
		// fake's activation list must be exactly the volume's LV when
		// code is OK, and empty otherwise.
		activated []string
		mounted   func(fx *nodeFixture) string
	}{
		{name: "stage of a filesystem volume", prepare: twoInactive, call: stageFS,
			mounted: func(fx *nodeFixture) string { return fx.staging }},
		{name: "stage of a raw block volume", prepare: twoInactive,
			call: func(t *testing.T, fx *nodeFixture) error {
				_, err := fx.ns.NodeStageVolume(context.Background(), fx.stageReq(blockCap(sw)))
				return err
			}},
		{name: "publish of a raw block volume", prepare: twoInactive,
			call: func(t *testing.T, fx *nodeFixture) error {
				_, err := fx.ns.NodePublishVolume(context.Background(), fx.publishReq(blockCap(sw), false))
				return err
			},
			mounted: func(fx *nodeFixture) string { return fx.target }},
		{name: "stage of a thin volume whose pool is inactive too",
			prepare: func(t *testing.T, fx *nodeFixture) {
				fx.id = fx.addThinVolume(t, "pvc-thin")
				deactivate(fx, fx.id, "vg1/pool")
			},
			call: stageFS, activated: []string{"vg1/pool"},
			mounted: func(fx *nodeFixture) string { return fx.staging }},
		{name: "expansion of a raw block volume", call: expandBlock},
		{name: "an LV without carve's tag is left alone", code: codes.FailedPrecondition, msg: []string{"carve activates only its own volumes"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				deactivate(fx, fx.id)
				fx.setLV(fx.id, func(lv *lvm.LogicalVolume) {
					lv.Tags = slices.DeleteFunc(lv.Tags, func(t string) bool { return t == volume.TagOwner })
				})
			},
			call: stageFS},
		{name: "activation fails", code: codes.Internal, msg: []string{"activating its inactive LV", "device-mapper: reload ioctl failed"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				deactivate(fx, fx.id)
				fx.lvm.FailNext = fmt.Errorf("lvchange: exit code 5: device-mapper: reload ioctl failed")
			},
			call: stageFS},
		{name: "the LV vanished before its activation", code: codes.NotFound, msg: []string{"does not exist"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				deactivate(fx, fx.id)
				fx.lvm.FailNext = fmt.Errorf("lv: %w", lvm.ErrNotFound)
			},
			call: stageFS},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newNodeFixture(t)
			if tc.prepare != nil {
				tc.prepare(t, fx)
			}
			csitest.WantCode(t, tc.call(t, fx), tc.code, tc.msg...)
			want := []string{}
			if tc.code == codes.OK {
				want = []string{fx.id}
			}
			if got := fx.lvm.Activations; !slices.Equal(append([]string{}, got...), want) {
				t.Errorf("activated %v, want %v", got, want)
			}
			for _, key := range tc.activated {
				fx.lvm.Mu.Lock()
				active := fx.lvm.LVs[key].Attr.Active
				fx.lvm.Mu.Unlock()
				if !active {
					t.Errorf("%s is still inactive", key)
				}
			}
			if tc.mounted != nil && fx.mountAt(tc.mounted(fx)) == nil {
				t.Errorf("nothing mounted at %s after the activation", tc.mounted(fx))
			}
			if tc.code != codes.OK && (fx.mountAt(fx.staging) != nil || fx.mountAt(fx.target) != nil) {
				t.Error("something was mounted although the call failed")
			}
		})
	}
}
