package provision

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/config"
	"github.com/carve-csi/carve/pkg/vgview"
	"github.com/carve-csi/carve/pkg/volume"
	"github.com/carve-csi/carve/pkg/volumelock"
)

// orphanLVM is an LVM of one volume group holding lvs; it answers the
// calls RemoveOrphan makes (the others are not called: nil LVM panics).
type orphanLVM struct {
	LVM
	lvs     []lvm.LogicalVolume
	removed []string
}

func (f *orphanLVM) Report(context.Context, ...string) (*lvm.Report, error) {
	return &lvm.Report{ReadAt: time.Now(), LogicalVolumes: slices.Clone(f.lvs),
		VolumeGroups: []lvm.VolumeGroup{{Name: "vg1", Size: 10 << 30, Free: 8 << 30, ExtentSize: 4 << 20}}}, nil
}

func (f *orphanLVM) GetLV(_ context.Context, vg, name string) (*lvm.LogicalVolume, error) {
	for _, lv := range f.lvs {
		if lv.VolumeGroup == vg && lv.Name == name {
			return &lv, nil
		}
	}
	return nil, lvm.ErrNotFound
}

func (f *orphanLVM) RemoveLV(_ context.Context, vg, name string) error {
	f.removed = append(f.removed, vg+"/"+name)
	f.lvs = slices.DeleteFunc(f.lvs, func(lv lvm.LogicalVolume) bool { return lv.VolumeGroup == vg && lv.Name == name })
	return nil
}

// RemoveOrphan, what the audit calls through its Orphans interface,
// removes only a carve volume that nothing is working on and that has no
// snapshots; one that is gone is success.
func TestRemoveOrphan(t *testing.T) {
	vol := func(name string, tags ...string) lvm.LogicalVolume {
		return lvm.LogicalVolume{VolumeGroup: "vg1", Name: name, Size: 1 << 30, Tags: tags}
	}
	orphan := volume.LVNameFor("pvc-orphan")
	snapped := volume.LVNameFor("pvc-snapped")
	toolSnapped := volume.LVNameFor("pvc-tool-snapped")
	toolSnap := vol("tool-snap")
	toolSnap.Origin = toolSnapped
	lvs := []lvm.LogicalVolume{
		vol(toolSnapped, volume.VolumeTags("pvc-tool-snapped", "fast", nil)...),
		toolSnap,
		vol(orphan, volume.VolumeTags("pvc-orphan", "fast", nil)...),
		vol(snapped, volume.VolumeTags("pvc-snapped", "fast", nil)...),
		vol(volume.SnapshotLVNameFor("snap-1"), volume.SnapshotTags("snap-1", "fast", snapped)...),
		vol("foreign"),
	}
	for _, tt := range []struct {
		name    string
		lv      string
		busy    bool
		wantErr string
		removed bool
	}{
		{name: "an orphan is removed", lv: orphan, removed: true},
		{name: "one that is gone is success", lv: volume.LVNameFor("pvc-gone")},
		{name: "one in flight is left", lv: orphan, busy: true, wantErr: "in flight"},
		{name: "an LV without carve's tag is left", lv: "foreign", wantErr: "does not carry carve's tag"},
		{name: "a volume with snapshots is left", lv: snapped, wantErr: "has snapshots"},
		{name: "a volume with another tool's snapshot is left", lv: toolSnapped, wantErr: "vg1/tool-snap"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			cfg, err := config.Parse([]byte("deviceClasses:\n  - name: fast\n    volumeGroup: vg1\n    default: true\n"))
			if err != nil {
				t.Fatal(err)
			}
			f := &orphanLVM{lvs: slices.Clone(lvs)}
			view := vgview.New(f, cfg, nil)
			if err := view.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			locks := volumelock.New()
			p := New(Config{NodeName: "node-a", Classes: cfg, LVM: f, View: view, Locks: locks})
			if tt.busy {
				locks.TryAcquire(tt.lv)
			}
			if p.Busy(tt.lv) != tt.busy {
				t.Errorf("Busy = %v, want %v", p.Busy(tt.lv), tt.busy)
			}
			err = p.RemoveOrphan(ctx, "vg1", tt.lv)
			if (err != nil) != (tt.wantErr != "") || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("RemoveOrphan: %v, want an error saying %q", err, tt.wantErr)
			}
			if got := len(f.removed) > 0; got != tt.removed {
				t.Errorf("removed %v, want an LV removed: %v", f.removed, tt.removed)
			}
			if _, inView := view.LV("vg1", tt.lv); tt.removed && inView {
				t.Error("the removed LV is still in the view")
			}
		})
	}
}
