package driver

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/volume"
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

// DeleteVolume and DeleteSnapshot flush the volume group's PVs once
// lvremove has run, before they answer; a flush that fails fails the call,
// and its retry, which finds the LV gone, flushes again.
func TestDeleteFlushesTheRemoval(t *testing.T) {
	ctx := context.Background()
	fx := newControllerFixture(t)
	var mu sync.Mutex
	var flushes []string // each "path, LV gone|LV still there"
	// watched is the LV (vg/name) whose removal the flushes must follow.
	var watched string
	fx.eraser.Observe = func(path string, m erase.Method) {
		if m != erase.Flush || watched == "" {
			return
		}
		vg, name, _ := strings.Cut(watched, "/")
		state := "LV gone"
		if _, ok := fx.lvm.LVTags(vg, name); ok {
			state = "LV still there"
		}
		mu.Lock()
		flushes = append(flushes, path+", "+state)
		mu.Unlock()
	}
	check := func(what string, want ...string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(flushes, want) {
			t.Errorf("%s: flushes %q, want %q", what, flushes, want)
		}
		flushes = nil
	}

	for _, params := range []map[string]string{nil, thinParams} {
		id := mustCreate(t, fx, "pvc-"+params[volume.ParamDeviceClass], params)
		check("CreateVolume") // not watched: a create flushes the LV's own device
		watched = id
		if _, err := fx.cs.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatal(err)
		}
		check("DeleteVolume "+id, provisiontest.PVOf("vg1")+", LV gone")
		watched = ""
	}

	id := mustCreate(t, fx, "pvc-flush-fails", nil)
	watched = id
	fx.eraser.Mu.Lock()
	fx.eraser.Fail = errors.New("the disk is gone")
	fx.eraser.Mu.Unlock()
	_, err := fx.cs.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, err, codes.Internal, "the disk is gone")
	check("DeleteVolume whose flush fails", provisiontest.PVOf("vg1")+", LV gone")
	fx.eraser.Mu.Lock()
	fx.eraser.Fail = nil
	fx.eraser.Mu.Unlock()
	if _, err := fx.cs.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	check("the retry", provisiontest.PVOf("vg1")+", LV gone")
	watched = ""

	vol := fx.mustVolume(t, "pvc-snapped", gib, thinParams)
	snap := fx.mustSnapshot(t, "snap-1", vol)
	_, vg, lv, err := volume.ParseSnapshotID(snap.GetSnapshotId())
	if err != nil {
		t.Fatal(err)
	}
	check("CreateSnapshot")
	watched = vg + "/" + lv
	if _, err := fx.cs.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	check("DeleteSnapshot", provisiontest.PVOf("vg1")+", LV gone")
}
