package vgview

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// TestSnapshotMetrics: every carve thick snapshot of a configured volume
// group has a fill ratio and an invalid flag, from the refresh; thin
// snapshots, a clone's temporary snapshot and other tools' snapshots have
// none, and a snapshot removed from the view stops being reported.
func TestSnapshotMetrics(t *testing.T) {
	r := testReport()
	cow := lvm.Attributes{Type: lvm.TypeSnapshot, Active: true}
	invalid := lvm.ParseAttributes("swi-I-s---")
	r.LogicalVolumes = append(r.LogicalVolumes,
		lvm.LogicalVolume{Name: "s-half", VolumeGroup: "vg1", Attr: cow, SnapPercent: 42.5, Origin: "b", Tags: volume.SnapshotTags("half", "thick", "b")},
		lvm.LogicalVolume{Name: "s-lost", VolumeGroup: "vg1", Attr: invalid, SnapPercent: 100, Origin: "b", Tags: volume.SnapshotTags("lost", "thick", "b")},
		lvm.LogicalVolume{Name: "s-full", VolumeGroup: "vg1", Attr: cow, SnapPercent: 100, Origin: "b", Tags: volume.SnapshotTags("full", "thick", "b")},
		lvm.LogicalVolume{Name: "s-thin", VolumeGroup: "vg1", Pool: "pool", Attr: lvm.Attributes{Type: lvm.TypeThin}, Origin: "a", Tags: volume.SnapshotTags("thin", "thin", "a")},
		lvm.LogicalVolume{Name: "tmp", VolumeGroup: "vg1", Attr: cow, SnapPercent: 90, Origin: "b", Tags: volume.CopySourceTags("carve-x", "thick")},
		lvm.LogicalVolume{Name: "theirs", VolumeGroup: "vg1", Attr: cow, SnapPercent: 90, Origin: "foreign"},
	)
	if invalid.Type != lvm.TypeSnapshot || !invalid.SnapshotInvalid {
		t.Fatalf("lv_attr swi-I-s--- parsed as %+v", invalid)
	}
	reg := prometheus.NewRegistry()
	v := New(&fakeReporter{report: r}, testConfig(), metrics.NewRecorder(reg))
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP carve_snapshot_cow_used_ratio Used share (0-1) of the copy-on-write space of a thick snapshot (lvs snap_percent / 100); at 1 the snapshot is lost.
# TYPE carve_snapshot_cow_used_ratio gauge
carve_snapshot_cow_used_ratio{device_class="thick",snapshot="s-full",volume_group="vg1"} 1
carve_snapshot_cow_used_ratio{device_class="thick",snapshot="s-half",volume_group="vg1"} 0.425
carve_snapshot_cow_used_ratio{device_class="thick",snapshot="s-lost",volume_group="vg1"} 1
# HELP carve_snapshot_invalid 1 when a thick snapshot ran out of its copy-on-write space (or LVM marks it invalid): its content is lost and no restore reads it; 0 otherwise.
# TYPE carve_snapshot_invalid gauge
carve_snapshot_invalid{device_class="thick",snapshot="s-full",volume_group="vg1"} 1
carve_snapshot_invalid{device_class="thick",snapshot="s-half",volume_group="vg1"} 0
carve_snapshot_invalid{device_class="thick",snapshot="s-lost",volume_group="vg1"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "carve_snapshot_cow_used_ratio", "carve_snapshot_invalid"); err != nil {
		t.Error(err)
	}
	v.Removed("vg1", "s-full")
	v.Removed("vg1", "s-lost")
	want = `
# HELP carve_snapshot_invalid 1 when a thick snapshot ran out of its copy-on-write space (or LVM marks it invalid): its content is lost and no restore reads it; 0 otherwise.
# TYPE carve_snapshot_invalid gauge
carve_snapshot_invalid{device_class="thick",snapshot="s-half",volume_group="vg1"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "carve_snapshot_invalid"); err != nil {
		t.Errorf("after the removal of two snapshots: %v", err)
	}
}
