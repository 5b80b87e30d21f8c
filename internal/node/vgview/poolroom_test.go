package vgview

import (
	"context"
	"testing"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// TestPoolRoom: the real room of a thin class's pool is its free data
// space (from data_percent) minus the class's spare and minus the sizes
// of the pool's LVs a copy is still filling, with no overprovision ratio.
func TestPoolRoom(t *testing.T) {
	r := testReport() // pool: 8 GiB, 25 % used
	r.ThinPools[0].ZeroNewBlocks = true
	r.LogicalVolumes = append(r.LogicalVolumes,
		lvm.LogicalVolume{Name: "copying", VolumeGroup: "vg1", Size: 1 * gi, Pool: "pool",
			Tags: []string{volume.TagOwner, volume.TagClassPrefix + "thin", volume.TagCopyPending}},
		lvm.LogicalVolume{Name: "copying-thick", VolumeGroup: "vg1", Size: 1 * gi,
			Tags: []string{volume.TagOwner, volume.TagClassPrefix + "thick", volume.TagCopyPending}})
	cfg := testConfig()
	v := New(&fakeReporter{report: r}, cfg, nil)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	thin, _ := cfg.Class("thin")
	got, err := v.PoolRoom(thin)
	// 8 GiB - 2 GiB used - 1 GiB still to be copied; ratio 2 ignored.
	want := PoolRoom{Pool: "vg1/pool", Free: 5 * gi, Pending: 1 * gi, ZeroNewBlocks: true}
	if err != nil || got != want {
		t.Errorf("PoolRoom = %+v, %v; want %+v", got, err, want)
	}
	thick, _ := cfg.Class("thick")
	if _, err := v.PoolRoom(thick); err == nil {
		t.Error("PoolRoom of a thick class is no error")
	}
}
