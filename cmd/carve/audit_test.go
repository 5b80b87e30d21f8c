package main

import (
	"context"
	"testing"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/config"
	"github.com/carve-csi/carve/pkg/vgview"
	"github.com/carve-csi/carve/pkg/volume"
)

type stubReporter struct{ r *lvm.Report }

func (s stubReporter) Report(context.Context, ...string) (*lvm.Report, error) { return s.r, nil }

// TestAuditSeesOnlyCarveLVs: the audit's LVs are carve's own in the
// configured volume groups, with their tags read; LVs of other tools and
// of volume groups carve does not use never reach it.
func TestAuditSeesOnlyCarveLVs(t *testing.T) {
	tags := volume.VolumeTags("pvc-1", "fast", map[string]string{
		"csi.storage.k8s.io/pvc/namespace": "db", "csi.storage.k8s.io/pvc/name": "data-0"})
	report := &lvm.Report{
		VolumeGroups: []lvm.VolumeGroup{{Name: "vg1", Size: 10 << 30, Free: 8 << 30, ExtentSize: 4 << 20}, {Name: "other", Size: 1 << 30}},
		LogicalVolumes: []lvm.LogicalVolume{
			{VolumeGroup: "vg1", Name: volume.LVNameFor("pvc-1"), Size: 1 << 30, Tags: tags},
			{VolumeGroup: "vg1", Name: "home", Size: 1 << 30}, // another tool's
			// a snapshot of carve's is no volume
			{VolumeGroup: "vg1", Name: volume.SnapshotLVNameFor("snap-1"), Size: 1 << 30, Tags: volume.SnapshotTags("snap-1", "fast", "vg1/x")},
			{VolumeGroup: "vg1", Name: "backup", Size: 1 << 30, Tags: []string{"carve.dev/owner=x"}}, // not carve's tag
			{VolumeGroup: "other", Name: volume.LVNameFor("pvc-2"), Size: 1 << 30, Tags: volume.VolumeTags("pvc-2", "fast", nil)},
		},
	}
	cfg := &config.Config{DeviceClasses: []config.DeviceClass{{Name: "fast", VolumeGroup: "vg1"}}}
	view := vgview.New(stubReporter{report}, cfg, nil)
	v := viewVolumes{view}
	if v.Readable("vg1") {
		t.Error("vg1 readable before the first refresh")
	}
	if err := view.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !v.Readable("vg1") || v.Readable("other") {
		t.Errorf("readable vg1 %v, other %v; want true, false (not configured)", v.Readable("vg1"), v.Readable("other"))
	}
	got := v.Volumes()
	if len(got) != 1 {
		t.Fatalf("audit LVs %+v, want only carve's in vg1", got)
	}
	want := volume.LVNameFor("pvc-1")
	if l := got[0]; l.Name != want || l.Class != "fast" || l.VolumeName != "pvc-1" || l.Claim != "db/data-0" || l.Size != 1<<30 {
		t.Errorf("audit LV %+v", l)
	}
}
