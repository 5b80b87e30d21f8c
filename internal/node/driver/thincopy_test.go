package driver

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/volume"
)

// TestCopyIntoThin: a thick snapshot restored into a thin class is copied
// sparse (zeros skipped) into a new thin LV of a pool that zeroes new
// blocks, and every byte otherwise; it is refused with RESOURCE_EXHAUSTED,
// before any LV is made, when the source's size does not fit the pool's
// real free space minus the spare, whatever the overprovision ratio
// admits; a retry after a copy cut short copies into a new LV.
func TestCopyIntoThin(t *testing.T) {
	tests := []struct {
		name        string
		zeroes      bool
		dataPercent float64
		crash       bool
		// wantCode is the restore's; OK copies, sparse as wantSparse.
		wantCode   codes.Code
		wantSparse bool
	}{
		{"pool zeroes new blocks", true, 0, false, codes.OK, true},
		{"pool does not zero new blocks", false, 0, false, codes.OK, false},
		{"retry after a copy cut short", true, 0, true, codes.OK, true},
		// 4 GiB pool, 80 % used: 0.8 GiB free, 1 GiB to copy; the ratio
		// of 2 would admit 1.6 GiB.
		{"source larger than the pool's real free space", true, 80, false, codes.ResourceExhausted, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			fx := newControllerFixture(t)
			vol := fx.mustVolume(t, "pvc-1", gib, nil)
			snap := fx.mustSnapshot(t, "snap-1", vol)
			pool := fx.lvm.Pools["vg1/pool"]
			pool.ZeroNewBlocks, pool.DataPercent = tt.zeroes, tt.dataPercent
			fx.restart(t)
			req := createReq("pvc-new", gib, thinParams)
			req.VolumeContentSource = fromSnapshot(snap.GetSnapshotId())
			target := "vg1/" + volume.LVNameFor("pvc-new")
			if tt.crash {
				fx.copier.failNext = true
				_, err := fx.cs.CreateVolume(ctx, req)
				wantCode(t, err, codes.Internal)
				fx.restart(t)
			}
			_, err := fx.cs.CreateVolume(ctx, req)
			if tt.wantCode != codes.OK {
				wantCode(t, err, tt.wantCode, "vg1/pool", strconv.FormatInt(gib, 10), "free")
				if _, ok := fx.lvm.LVs[target]; ok || len(fx.copier.copies) != 0 {
					t.Errorf("a refused restore made LV %s (%v) or copied %v", target, ok, fx.copier.copies)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(fx.copier.copies) != 1 {
				t.Fatalf("copies %v, want one", fx.copier.copies)
			}
			if c := fx.copier.copies[0]; c.sparse != tt.wantSparse {
				t.Errorf("copy %+v: sparse %v, want %v", c, c.sparse, tt.wantSparse)
			}
		})
	}
}

// TestCloneTemporarySnapshotRoom: a clone's temporary copy-on-write
// snapshot takes its space under the class's rules: when the volume
// group has it only by eating the source class's spare, the clone is
// refused with RESOURCE_EXHAUSTED and no temporary snapshot is made.
func TestCloneTemporarySnapshotRoom(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	// vg1: 6 GiB free, 5 GiB after class fast's 1 GiB spare. A 2 GiB
	// source and a 2.8 GiB neighbour leave 0.2 GiB; the temporary
	// snapshot needs 20 % of 2 GiB.
	src := fx.mustVolume(t, "pvc-src", 2*gib, nil)
	fx.mustVolume(t, "pvc-neighbour", 2*gib+800*mib, nil)
	req := createReq("pvc-clone", 2*gib, thinParams)
	req.VolumeContentSource = fromVolume(src)
	_, err := fx.cs.CreateVolume(ctx, req)
	wantCode(t, err, codes.ResourceExhausted, "class fast", "snapshot")
	for _, l := range fx.lvm.LVs {
		if k, _, _ := volume.Owned(l.Tags); k == volume.KindCopySource {
			t.Errorf("temporary snapshot %s made although the room check refused it", l.Name)
		}
	}
	if len(fx.copier.copies) != 0 {
		t.Errorf("copied %v", fx.copier.copies)
	}
}

// TestCopySourceDeactivated: a snapshot that a restore activated to read
// it (a thin snapshot is kept inactive) is deactivated after the copy;
// the target and a clone's source volume are left active.
func TestCopySourceDeactivated(t *testing.T) {
	tests := []struct {
		name      string
		srcParams map[string]string
		dstParams map[string]string
		clone     bool
	}{
		{"thin snapshot restored thick", thinParams, nil, false},
		{"thick snapshot restored thin", nil, thinParams, false},
		{"thin clone into thick", thinParams, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fx := newControllerFixture(t)
			vol := fx.mustVolume(t, "pvc-1", gib, tt.srcParams)
			req := createReq("pvc-new", gib, tt.dstParams)
			var want []string
			if tt.clone {
				req.VolumeContentSource = fromVolume(vol)
			} else {
				snap := fx.mustSnapshot(t, "snap-1", vol)
				req.VolumeContentSource = fromSnapshot(snap.GetSnapshotId())
				lv := fx.lv(t, snap.GetSnapshotId())
				fx.lvm.LVs["vg1/"+lv.Name].Attr.Active = false
				want = append(want, "vg1/"+lv.Name)
			}
			resp, err := fx.cs.CreateVolume(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			if got := fx.lvm.Deactivations; !slices.Equal(got, want) {
				t.Errorf("deactivated %v, want %v", got, want)
			}
			if lv := fx.lv(t, resp.GetVolume().GetVolumeId()); !lv.Attr.Active {
				t.Errorf("the new volume %s is inactive", lv.Name)
			}
		})
	}
}
