package provision

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/volume"
)

// TestCopyIntoThin: a thick snapshot restored into a thin class is copied
// sparse (zeros skipped) into a new thin LV of a pool that zeroes new
// blocks, and every byte otherwise; it is refused with ErrNoRoom, before
// any LV is made, when the source's size does not fit the pool's real free
// space minus the spare, whatever the overprovision ratio admits; a retry
// after a copy cut short copies into a new LV.
func TestCopyIntoThin(t *testing.T) {
	tests := []struct {
		name        string
		zeroes      bool
		dataPercent float64
		crash       bool
		// wantErr is the restore's; nil copies, sparse as wantSparse.
		wantErr    error
		wantSparse bool
	}{
		{"pool zeroes new blocks", true, 0, false, nil, true},
		{"pool does not zero new blocks", false, 0, false, nil, false},
		{"retry after a copy cut short", true, 0, true, nil, true},
		// 4 GiB pool, 80 % used: 0.8 GiB free, 1 GiB to copy; the ratio
		// of 2 would admit 1.6 GiB.
		{"source larger than the pool's real free space", true, 80, false, ErrNoRoom, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			l := newLifecycle(t)
			vol := l.mustVolume(t, "pvc-1", gib, "fast")
			snap := l.mustSnapshot(t, "snap-1", vol)
			pool := l.lvm.Pools["vg1/pool"]
			pool.ZeroNewBlocks, pool.DataPercent = tt.zeroes, tt.dataPercent
			l.restart(t)
			req := l.request(t, "pvc-new", gib, "thin", snapshotSource(snap))
			target := "vg1/" + volume.LVNameFor("pvc-new")
			if tt.crash {
				l.copier.FailNext = true
				if _, err := l.p.Create(ctx, req); err == nil {
					t.Fatal("Create succeeded although its copy was cut short")
				}
				l.restart(t)
			}
			_, err := l.p.Create(ctx, req)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Create: %v, want %v", err, tt.wantErr)
				}
				for _, part := range []string{"vg1/pool", strconv.FormatInt(gib, 10), "free"} {
					if !strings.Contains(err.Error(), part) {
						t.Errorf("error %q does not say %q", err, part)
					}
				}
				if _, ok := l.lvm.LVs[target]; ok || len(l.copier.Copies) != 0 {
					t.Errorf("a refused restore made LV %s (%v) or copied %v", target, ok, l.copier.Copies)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(l.copier.Copies) != 1 {
				t.Fatalf("copies %v, want one", l.copier.Copies)
			}
			if c := l.copier.Copies[0]; c.Sparse != tt.wantSparse {
				t.Errorf("copy %+v: sparse %v, want %v", c, c.Sparse, tt.wantSparse)
			}
		})
	}
}

// TestCloneTemporarySnapshotRoom: a clone's temporary copy-on-write
// snapshot takes its space under the class's rules: when the volume
// group has it only by eating the source class's spare, the clone is
// refused with ErrNoRoom and no temporary snapshot is made.
func TestCloneTemporarySnapshotRoom(t *testing.T) {
	l := newLifecycle(t)
	// vg1: 6 GiB free, 5 GiB after class fast's 1 GiB spare. A 2 GiB
	// source and a 2.8 GiB neighbour leave 0.2 GiB; the temporary
	// snapshot needs 20 % of 2 GiB.
	src := l.mustVolume(t, "pvc-src", 2*gib, "fast")
	l.mustVolume(t, "pvc-neighbour", 2*gib+800*mib, "fast")
	_, err := l.p.Create(context.Background(), l.request(t, "pvc-clone", 2*gib, "thin", &Source{ID: src}))
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "class fast") || !strings.Contains(err.Error(), "snapshot") {
		t.Errorf("Create: %v, want %v naming class fast and the snapshot", err, ErrNoRoom)
	}
	for _, lv := range l.lvm.LVs {
		if k, _, _ := volume.Owned(lv.Tags); k == volume.KindCopySource {
			t.Errorf("temporary snapshot %s made although the room check refused it", lv.Name)
		}
	}
	if len(l.copier.Copies) != 0 {
		t.Errorf("copied %v", l.copier.Copies)
	}
}

// TestCopySourceDeactivated: a snapshot that a restore activated to read
// it (a thin snapshot is kept inactive) is deactivated after the copy;
// the target and a clone's source volume are left active.
func TestCopySourceDeactivated(t *testing.T) {
	tests := []struct {
		name             string
		srcClass, dstCls string
		clone            bool
	}{
		{"thin snapshot restored thick", "thin", "fast", false},
		{"thick snapshot restored thin", "fast", "thin", false},
		{"thin clone into thick", "thin", "fast", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLifecycle(t)
			vol := l.mustVolume(t, "pvc-1", gib, tt.srcClass)
			src := &Source{ID: vol}
			var want []string
			if !tt.clone {
				snap := l.mustSnapshot(t, "snap-1", vol)
				src = snapshotSource(snap)
				l.lvm.LVs["vg1/"+snap.Name].Attr.Active = false
				want = append(want, "vg1/"+snap.Name)
			}
			lv, err := l.p.Create(context.Background(), l.request(t, "pvc-new", gib, tt.dstCls, src))
			if err != nil {
				t.Fatal(err)
			}
			if got := l.lvm.Deactivations; !slices.Equal(got, want) {
				t.Errorf("deactivated %v, want %v", got, want)
			}
			if !l.lvm.LVs[lv.VolumeGroup+"/"+lv.Name].Attr.Active {
				t.Errorf("the new volume %s is inactive", lv.Name)
			}
		})
	}
}
