package driver

import (
	"context"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/volume"
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
	lv := fx.lvm.lvs[snap.GetSnapshotId()[len(testNode)+1:]]
	lv.Tags = slices.DeleteFunc(lv.Tags, func(t string) bool { return strings.HasPrefix(t, volume.TagSizePrefix) })
	fx.restart(t)
	req := createReq("pvc-new", gib, nil)
	req.VolumeContentSource = fromSnapshot(snap.GetSnapshotId())
	_, err := fx.cs.CreateVolume(ctx, req)
	wantCode(t, err, codes.FailedPrecondition, snap.GetSnapshotId(), volume.TagSizePrefix)
	if len(fx.copier.copies) != 0 || slices.ContainsFunc(fx.view.Volumes(), func(l lvm.LogicalVolume) bool { return l.Name == volume.LVNameFor("pvc-new") }) {
		t.Errorf("a restore from a snapshot of unknown size made a volume (copies %v)", fx.copier.copies)
	}
}
