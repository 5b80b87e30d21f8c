package driver

import (
	"context"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/csiserver/csitest"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// NodeExpandVolume obeys the class's rules as CreateVolume does: the
// spare of a thick class, the overprovision ratio of a thin one (which
// lvextend alone lets a thin volume pass), and a capacity range the class
// can never serve is OUT_OF_RANGE while one it cannot serve now is
// RESOURCE_EXHAUSTED. Nothing is extended when the answer is an error.
func TestNodeExpandVolumeObeysClassRules(t *testing.T) {
	// The node fixture: vg1 of 10 GiB with pvc-1 (1 GiB, class fast,
	// spare 1 GiB): 8 GiB available to fast, 9 GiB at most for a volume.
	thinVolume := func(t *testing.T, fx *nodeFixture) {
		// A 4 GiB pool with ratio 2: 8 GiB of thin volumes at most.
		fx.id = fx.addThinVolume(t, "pvc-thin")
		if err := fx.view.Refresh(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name            string
		prepare         func(t *testing.T, fx *nodeFixture)
		required, limit int64
		code            codes.Code
		msg             []string
		want            int64 // the LV's size afterwards
	}{
		{name: "thick: within the room", required: 5 * gib, want: 5 * gib},
		{name: "thick: all the room, the spare kept", required: 9 * gib, want: 9 * gib},
		{name: "thick: into the spare", required: 9*gib + 4*mib, code: codes.OutOfRange, want: gib,
			msg: []string{"the most a volume can have on this node is 9663676416"}},
		{name: "thick: room taken by another volume", required: 4 * gib, code: codes.ResourceExhausted, want: gib,
			msg: []string{"growing by 3221225472", "available"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				if _, err := fx.cs.CreateVolume(context.Background(), createReq("pvc-other", 6*gib, nil)); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "rounded to extents above limit_bytes", required: gib + 1, limit: gib + 1, code: codes.OutOfRange, want: gib,
			msg: []string{"above limit_bytes"}},
		{name: "thin: within the overprovision ratio", prepare: thinVolume, required: 8 * gib, want: 8 * gib},
		{name: "thin: past pool size x ratio", prepare: thinVolume, required: 8*gib + 4*mib, code: codes.OutOfRange, want: gib},
		{name: "thin: the ratio's room taken by another thin volume", required: 4 * gib, code: codes.ResourceExhausted, want: gib,
			prepare: func(t *testing.T, fx *nodeFixture) {
				thinVolume(t, fx)
				if _, err := fx.cs.CreateVolume(context.Background(), createReq("pvc-thin-2", 5*gib, map[string]string{volume.ParamDeviceClass: "thin"})); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "class unavailable: a PV of the volume group is missing", required: 2 * gib, code: codes.ResourceExhausted, want: gib,
			msg: []string{"missing physical volume"},
			prepare: func(t *testing.T, fx *nodeFixture) {
				fx.lvm.VGs["vg1"].MissingPVs = 1
				if err := fx.view.Refresh(context.Background()); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "the volume's class is not this node's", required: 2 * gib, code: codes.ResourceExhausted, want: gib,
			msg: []string{`device class "gone"`},
			prepare: func(t *testing.T, fx *nodeFixture) {
				fx.setLV(fx.id, func(lv *lvm.LogicalVolume) {
					lv.Tags = []string{volume.TagOwner, volume.VolumeTag("pvc-1"), volume.TagClassPrefix + "gone"}
				})
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newNodeFixture(t)
			if tt.prepare != nil {
				tt.prepare(t, fx)
			}
			fx.publish(t, blockCap(sw), false)
			_, err := fx.ns.NodeExpandVolume(context.Background(), &csi.NodeExpandVolumeRequest{VolumeId: fx.id, VolumePath: fx.target,
				CapacityRange: &csi.CapacityRange{RequiredBytes: tt.required, LimitBytes: tt.limit}})
			csitest.WantCode(t, err, tt.code, tt.msg...)
			vg, name, _ := volume.ParseVolumeID(fx.id)
			lv, _ := fx.lvm.GetLV(context.Background(), vg, name)
			if int64(lv.Size) != tt.want {
				t.Errorf("LV size %d, want %d", lv.Size, tt.want)
			}
		})
	}
}

// A growth counts at once in the room CreateVolume sees (no refresh in
// between), and the reverse: each of the two fits alone, not both.
func TestNodeExpandAndCreateShareTheRoom(t *testing.T) {
	ctx := context.Background()
	expand := func(fx *nodeFixture, size int64) error {
		_, err := fx.ns.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: fx.id, VolumePath: fx.target,
			CapacityRange: &csi.CapacityRange{RequiredBytes: size}})
		return err
	}
	create := func(fx *nodeFixture) error {
		_, err := fx.cs.CreateVolume(ctx, createReq("pvc-new", 4*gib, nil))
		return err
	}
	// 8 GiB available: a 4 GiB growth (1 -> 5 GiB) and a 4 GiB volume fit
	// together with nothing to spare; a 5 GiB growth and the volume do not.
	t.Run("expand first", func(t *testing.T) {
		fx := newNodeFixture(t)
		fx.publish(t, blockCap(sw), false)
		if err := expand(fx, 6*gib); err != nil {
			t.Fatal(err)
		}
		csitest.WantCode(t, create(fx), codes.ResourceExhausted)
	})
	t.Run("create first", func(t *testing.T) {
		fx := newNodeFixture(t)
		fx.publish(t, blockCap(sw), false)
		if err := create(fx); err != nil {
			t.Fatal(err)
		}
		csitest.WantCode(t, expand(fx, 6*gib), codes.ResourceExhausted)
		if err := expand(fx, 5*gib); err != nil {
			t.Errorf("a growth that fits beside the new volume: %v", err)
		}
	})
	t.Run("no refresh needed", func(t *testing.T) {
		fx := newNodeFixture(t)
		fx.publish(t, blockCap(sw), false)
		reports := fx.lvm.Reports
		if err := expand(fx, 5*gib); err != nil {
			t.Fatal(err)
		}
		if err := create(fx); err != nil {
			t.Fatal(err)
		}
		if fx.lvm.Reports != reports {
			t.Errorf("%d LVM reports ran; the growth must count in the view at once", fx.lvm.Reports-reports)
		}
	})
}

// An expansion waits for the volume group's room lock, which a create
// holds through its check and lvcreate, and gives up with its context.
func TestNodeExpandWaitsForTheRoomLock(t *testing.T) {
	fx := newNodeFixture(t)
	fx.publish(t, blockCap(sw), false)
	unlock, err := fx.view.LockRoom(context.Background(), "vg1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err = fx.ns.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: fx.id, VolumePath: fx.target,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gib}})
	csitest.WantCode(t, err, codes.DeadlineExceeded, "room lock of volume group vg1")
	unlock()
	if _, err := fx.ns.NodeExpandVolume(context.Background(), &csi.NodeExpandVolumeRequest{VolumeId: fx.id, VolumePath: fx.target,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gib}}); err != nil {
		t.Errorf("after the lock was released: %v", err)
	}
}

// A Node server built without the classes and the view (a wiring that
// forgot them) still expands, checked by LVM alone.
func TestNodeExpandWithoutClassesIsCheckedByLVMAlone(t *testing.T) {
	fx := newNodeFixture(t)
	cfg := fx.ns.cfg
	cfg.Classes, cfg.View = nil, nil
	fx.ns = NewNodeServer(cfg)
	fx.publish(t, blockCap(sw), false)
	// 9.5 GiB is past fast's spare but within the volume group.
	if _, err := fx.ns.NodeExpandVolume(context.Background(), &csi.NodeExpandVolumeRequest{VolumeId: fx.id, VolumePath: fx.target,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 9*gib + 512*mib}}); err != nil {
		t.Fatal(err)
	}
	_, err := fx.ns.NodeExpandVolume(context.Background(), &csi.NodeExpandVolumeRequest{VolumeId: fx.id, VolumePath: fx.target,
		CapacityRange: &csi.CapacityRange{RequiredBytes: 20 * gib}})
	csitest.WantCode(t, err, codes.ResourceExhausted)
}
