package driver

import (
	"context"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
)

// lvm2 leaves its metadata in the disks' write caches, so NodeExpandVolume
// flushes the volume group's PVs once lvextend has run, before it
// answers; a repeat that extends nothing flushes nothing.
func TestNodeExpandVolumeFlushesTheGrowth(t *testing.T) {
	fx := newNodeFixture(t)
	fx.publish(t, blockCap(sw), false)
	expand := func() {
		t.Helper()
		if _, err := fx.ns.NodeExpandVolume(context.Background(), &csi.NodeExpandVolumeRequest{VolumeId: fx.id, VolumePath: fx.target,
			CapacityRange: &csi.CapacityRange{RequiredBytes: 2 * gib}}); err != nil {
			t.Fatal(err)
		}
	}
	expand()
	want := []flushedAt{{path: provisiontest.PVOf("vg1"), lvSize: 2 * uint64(gib)}}
	if !slices.Equal(fx.flushed, want) {
		t.Errorf("flushes %+v, want %+v: the volume group's PV, once the LV has its new size", fx.flushed, want)
	}
	expand()
	if !slices.Equal(fx.flushed, want) {
		t.Errorf("flushes %+v after a repeat that extended nothing, want still %+v", fx.flushed, want)
	}
}
