package driver

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// TestRestoreWithoutSizeTag: a copy-on-write snapshot whose size tag is
// gone (an lvchange by hand, another tool) holds a volume of unknown
// size; its restore is refused, naming the tag, never answered with an
// empty volume (the copy of 0 bytes and a zeroed tail it was before).
func TestRestoreWithoutSizeTag(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	vol := fx.mustVolume(t, "pvc-1", gib, nil)
	snap := fx.mustSnapshot(t, "snap-1", vol)
	lv := fx.lvm.LVs[snap.GetSnapshotId()[len(testNode)+1:]]
	lv.Tags = slices.DeleteFunc(lv.Tags, func(t string) bool { return strings.HasPrefix(t, volume.TagSizePrefix) })
	fx.restart(t)
	req := createReq("pvc-new", gib, nil)
	req.VolumeContentSource = fromSnapshot(snap.GetSnapshotId())
	_, err := fx.cs.CreateVolume(ctx, req)
	wantCode(t, err, codes.FailedPrecondition, snap.GetSnapshotId(), volume.TagSizePrefix)
	if len(fx.copier.Copies) != 0 || slices.ContainsFunc(fx.view.Volumes(), func(l lvm.LogicalVolume) bool { return l.Name == volume.LVNameFor("pvc-new") }) {
		t.Errorf("a restore from a snapshot of unknown size made a volume (copies %v)", fx.copier.Copies)
	}
}

// TestDeleteVolumeWithOthersSnapshots: lvremove --yes takes every
// copy-on-write snapshot of a thick origin with it, not only carve's; a
// volume that is the origin of any LV is not removed, and the answer
// names that LV.
func TestDeleteVolumeWithOthersSnapshots(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	vol := fx.mustVolume(t, "pvc-1", gib, nil)
	lvName := fx.lv(t, vol).Name
	// Another tool's snapshot, made after the view's last refresh: no
	// carve tag.
	if _, err := fx.lvm.CreateSnapshot(ctx, lvm.SnapshotRequest{VolumeGroup: "vg1", Origin: lvName, Name: "backup-tool-snap", CowSize: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	_, err := fx.cs.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol})
	wantCode(t, err, codes.FailedPrecondition, "vg1/backup-tool-snap")
	for _, name := range []string{lvName, "backup-tool-snap"} {
		if _, ok := fx.lvm.LVs["vg1/"+name]; !ok {
			t.Errorf("LV vg1/%s was removed", name)
		}
	}
	if err := fx.lvm.RemoveLV(ctx, "vg1", "backup-tool-snap"); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.cs.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol}); err != nil {
		t.Errorf("DeleteVolume once the other snapshot is gone: %v", err)
	}
}
