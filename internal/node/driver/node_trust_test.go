package driver

import (
	"context"
	"slices"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// Stage and publish trust nothing in the request: a class in the volume
// context and a device node take the fast path only when the class is the
// handle's volume group's and the view holds the LV as carve's finished
// volume of that class; anything else goes to the full lookup, which
// refuses an LV of a volume group no class uses, one that is not carve's,
// one whose copy has not finished, and a handle whose PV was made for
// another volume (its volume context names another, or none).
func TestStageAndPublishTrustNoRequest(t *testing.T) {
	// otherVG makes vg9, which no class uses, with a carve-tagged LV of
	// class fast in it, and points the fixture at it.
	otherVG := func(t *testing.T, fx *nodeFixture) {
		fx.lvm.AddVG("vg9", 10*uint64(gib))
		lv, err := fx.lvm.CreateLV(context.Background(), lvm.CreateRequest{VolumeGroup: "vg9", Name: volume.LVNameFor("victim"),
			Size: uint64(gib), Tags: []string{volume.TagOwner, volume.VolumeTag("victim"), volume.TagClassPrefix + "fast"}})
		if err != nil {
			t.Fatal(err)
		}
		fx.id = volume.VolumeID("vg9", lv.Name)
	}
	tag := func(change func(tags []string) []string) func(t *testing.T, fx *nodeFixture) {
		return func(t *testing.T, fx *nodeFixture) {
			fx.setLV(fx.id, func(lv *lvm.LogicalVolume) { lv.Tags = change(lv.Tags) })
		}
	}
	cases := []struct {
		name    string
		class   string
		prepare func(t *testing.T, fx *nodeFixture)
		code    codes.Code
		msg     []string
		// gets is how many times stage and publish read the LV from LVM
		// when the calls succeed: 0 on the fast path.
		gets int
		// label is the device_class of the stage phase when it succeeds.
		label string
	}{
		{name: "carve's volume of that class: fast path", class: "fast", label: "fast"},
		{name: "a PV made for another volume", class: "fast", prepare: func(t *testing.T, fx *nodeFixture) { fx.named(fx.id, "pvc-other") },
			code: codes.FailedPrecondition, msg: []string{"volume_context", volume.ContextVolumeName, `"pvc-other"`}},
		{name: "a PV that names no volume", class: "fast", prepare: func(t *testing.T, fx *nodeFixture) { fx.named(fx.id, "") },
			code: codes.FailedPrecondition, msg: []string{"volume_context", volume.ContextVolumeName}},
		{name: "volume group no class uses", class: "fast", prepare: otherVG,
			code: codes.FailedPrecondition, msg: []string{"volume_id", "vg9", "not one of this node's device classes"}},
		{name: "copy not finished", class: "fast", prepare: tag(func(tags []string) []string { return append(tags, volume.TagCopyPending) }),
			code: codes.FailedPrecondition, msg: []string{"copy"}},
		{name: "no owner tag", class: "fast",
			prepare: tag(func(tags []string) []string {
				return slices.DeleteFunc(tags, func(t string) bool { return t == volume.TagOwner })
			}),
			code: codes.FailedPrecondition, msg: []string{"volume_id", "carve serves only its own volumes"}},
		{name: "class of the context not the LV's: the LV's counts", class: "thin", gets: 2, label: "fast"},
		{name: "class no device class has: the LV's counts", class: "gold", gets: 2, label: "fast"},
	}
	for _, tc := range cases {
		for _, rpc := range []string{"stage", "publish"} {
			t.Run(tc.name+"/"+rpc, func(t *testing.T) {
				fx := newNodeFixture(t)
				if tc.prepare != nil {
					tc.prepare(t, fx)
				}
				// The view holds the LVs as LVM does.
				if err := fx.view.Refresh(context.Background()); err != nil {
					t.Fatal(err)
				}
				fx.ns.isDeviceNode = func(string) bool { return true }
				vctx := map[string]string{volume.ParamDeviceClass: tc.class}
				c := mountCap("", sw)
				if rpc == "publish" {
					c = blockCap(sw)
				}
				stage := fx.stageReq(c)
				stage.VolumeContext = fx.volumeContext(vctx)
				_, err := fx.ns.NodeStageVolume(context.Background(), stage)
				if rpc == "publish" {
					if err != nil && tc.code == codes.OK {
						t.Fatalf("stage: %v", err)
					}
					publish := fx.publishReq(c, false)
					publish.VolumeContext = fx.volumeContext(vctx)
					_, err = fx.ns.NodePublishVolume(context.Background(), publish)
				}
				csitest.WantCode(t, err, tc.code, tc.msg...)
				if tc.code != codes.OK {
					if fx.mountAt(fx.staging) != nil || fx.mountAt(fx.target) != nil {
						t.Error("something was mounted although the call was refused")
					}
					return
				}
				if want := tc.gets / 2 * map[string]int{"stage": 1, "publish": 2}[rpc]; fx.lvm.Gets != want {
					t.Errorf("read the LV %d times, want %d", fx.lvm.Gets, want)
				}
				if got := sampleCountOf(t, fx, "stage", tc.label); got != 1 {
					t.Errorf("stage phase with device_class=%s counted %d times, want 1", tc.label, got)
				}
			})
		}
	}
}
