package provision

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/marks"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/node/volumelock"
	"github.com/carve-csi/carve/internal/volume"
)

// vg1 is the one volume group of the orphan and copy tests: 10 GiB, 8
// GiB of it free.
var vg1 = lvm.VolumeGroup{Name: "vg1", Size: 10 << 30, Free: 8 << 30, ExtentSize: 4 << 20, PhysicalVolumes: []string{provisiontest.PVOf("vg1")}}

// newVG1LVM is an LVM holding vg1 and lvs.
func newVG1LVM(lvs ...lvm.LogicalVolume) *provisiontest.LVM {
	f := provisiontest.NewLVM()
	f.SetReport(lvm.Report{VolumeGroups: []lvm.VolumeGroup{vg1}, LogicalVolumes: lvs})
	return f
}

// orphanProvisioner is a Provisioner over f with marks in a temporary
// directory.
func orphanProvisioner(t *testing.T, f *provisiontest.LVM) (*Provisioner, *vgview.View, *volumelock.Locks, *marks.Marks) {
	t.Helper()
	cfg := classesOf(t, fastVG1)
	view := refreshedView(t, f, cfg)
	m := tempMarks(t)
	locks := volumelock.New()
	return New(Config{NodeName: "node-a", Classes: cfg, LVM: f, View: view, Locks: locks, Marks: m}), view, locks, m
}

func claimed(name string) []string {
	return volume.VolumeTags(name, "fast", map[string]string{volume.ParamPVCNamespace: "ns", volume.ParamPVCName: "data"})
}

func quarantined(t *testing.T, name string, at time.Time) lvm.LogicalVolume {
	t.Helper()
	lvName := volume.LVNameFor(name)
	q, ok := volume.QuarantineName(lvName)
	if !ok {
		t.Fatalf("no quarantine name for %s", lvName)
	}
	return lvm.LogicalVolume{VolumeGroup: "vg1", Name: q, Size: 1 << 30, Tags: append(claimed(name), volume.OrphanTags(lvName, at)...)}
}

// RemoveOrphan, what the audit calls through its Orphans interface,
// removes only a quarantined carve volume, the one quarantined from the
// name the audit saw, that nothing is working on and that has no
// snapshots; one that is gone is success.
func TestRemoveOrphan(t *testing.T) {
	at := time.Unix(1_800_000_000, 0)
	vol := func(name string, tags ...string) lvm.LogicalVolume {
		return lvm.LogicalVolume{VolumeGroup: "vg1", Name: name, Size: 1 << 30, Tags: tags}
	}
	orphan := quarantined(t, "pvc-orphan", at)
	snapped := quarantined(t, "pvc-snapped", at)
	toolSnapped := quarantined(t, "pvc-tool-snapped", at)
	toolSnap := vol("tool-snap")
	toolSnap.Origin = toolSnapped.Name
	notQuarantined := volume.LVNameFor("pvc-live")
	lvs := []lvm.LogicalVolume{
		toolSnapped,
		toolSnap,
		orphan,
		vol(notQuarantined, claimed("pvc-live")...),
		snapped,
		vol(volume.SnapshotLVNameFor("snap-1"), volume.SnapshotTags("snap-1", "fast", snapped.Name)...),
		vol("foreign"),
	}
	of := func(lv lvm.LogicalVolume) string {
		q, _ := volume.QuarantinedFrom(lv.Name, lv.Tags)
		return q.Original
	}
	gone, _ := volume.QuarantineName(volume.LVNameFor("pvc-gone"))
	for _, tt := range []struct {
		name     string
		lv, of   string
		busy     bool
		wantErr  string
		removed  bool
		markGone bool
	}{
		{name: "a quarantined orphan is removed, and the marks of its old name", lv: orphan.Name, of: of(orphan), removed: true, markGone: true},
		{name: "one that is gone is success", lv: gone, of: volume.LVNameFor("pvc-gone")},
		{name: "one in flight is left", lv: orphan.Name, of: of(orphan), busy: true, wantErr: "in flight"},
		{name: "an LV without carve's tag is left", lv: "foreign", of: "foreign", wantErr: "does not carry carve's tag"},
		{name: "a volume not quarantined is left", lv: notQuarantined, of: notQuarantined, wantErr: "not an orphan quarantined"},
		{name: "a controller that names no original removes nothing", lv: orphan.Name, wantErr: "not an orphan quarantined"},
		{name: "one quarantined from another name is left", lv: orphan.Name, of: volume.LVNameFor("pvc-x"), wantErr: "not an orphan quarantined"},
		{name: "a volume with snapshots is left", lv: snapped.Name, of: of(snapped), wantErr: "has snapshots"},
		{name: "a volume with another tool's snapshot is left", lv: toolSnapped.Name, of: of(toolSnapped), wantErr: "vg1/tool-snap"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			f := newVG1LVM(lvs...)
			p, view, locks, m := orphanProvisioner(t, f)
			if tt.of != "" {
				if err := m.Mark("vg1", tt.of); err != nil {
					t.Fatal(err)
				}
			}
			if tt.busy {
				locks.TryAcquire(tt.lv)
			}
			if p.Busy(tt.lv) != tt.busy {
				t.Errorf("Busy = %v, want %v", p.Busy(tt.lv), tt.busy)
			}
			err := p.RemoveOrphan(ctx, "vg1", tt.lv, tt.of)
			if (err != nil) != (tt.wantErr != "") || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("RemoveOrphan: %v, want an error saying %q", err, tt.wantErr)
			}
			if got := len(f.Removals) > 0; got != tt.removed {
				t.Errorf("removed %v, want an LV removed: %v", f.Removals, tt.removed)
			}
			if _, inView := view.LV("vg1", tt.lv); tt.removed && inView {
				t.Error("the removed LV is still in the view")
			}
			if tt.of != "" {
				has, err := m.Has("vg1", tt.of)
				if err != nil || has == tt.markGone {
					t.Errorf("mark of %s there %v (%v), want gone %v", tt.of, has, err, tt.markGone)
				}
			}
		})
	}
}

// TestQuarantineOrphan: the first step deactivates, tags and renames a
// carve volume with a claim tag, and refuses what it must not touch.
func TestQuarantineOrphan(t *testing.T) {
	at := time.Unix(1_800_000_000, 0)
	earlier := at.Add(-30 * 24 * time.Hour)
	vol := func(name string, tags ...string) lvm.LogicalVolume {
		return lvm.LogicalVolume{VolumeGroup: "vg1", Name: name, Size: 1 << 30, Tags: tags, Attr: lvm.Attributes{Active: true}}
	}
	orphan := volume.LVNameFor("pvc-orphan")
	noClaim := volume.LVNameFor("pvc-noclaim")
	open := volume.LVNameFor("pvc-open")
	snapped := volume.LVNameFor("pvc-snapped")
	restored := volume.LVNameFor("pvc-restored") // renamed back by hand once, old tags kept
	done := volume.LVNameFor("pvc-done")
	doneQ := quarantined(t, "pvc-done", at)
	lvs := []lvm.LogicalVolume{
		vol(orphan, claimed("pvc-orphan")...),
		vol(noClaim, volume.VolumeTags("pvc-noclaim", "fast", nil)...),
		vol(open, claimed("pvc-open")...),
		vol(snapped, claimed("pvc-snapped")...),
		vol(volume.SnapshotLVNameFor("snap-1"), volume.SnapshotTags("snap-1", "fast", snapped)...),
		vol(restored, append(claimed("pvc-restored"), volume.OrphanTags(restored, earlier)...)...),
		doneQ,
		vol("foreign", volume.ClaimTag("ns", "x")),
	}
	for _, tt := range []struct {
		name    string
		lv      string
		busy    string
		wantErr string
		// wantQuarantined is the name of the quarantined LV after the
		// call; empty when the LV must be as it was.
		wantQuarantined string
	}{
		{name: "an orphan with a claim tag is quarantined", lv: orphan, wantQuarantined: "carve-orphan-" + orphan[len("carve-"):]},
		{name: "old orphan tags are replaced: the second grace runs from now", lv: restored, wantQuarantined: "carve-orphan-" + restored[len("carve-"):]},
		{name: "a repeat after it was done is success", lv: done, wantQuarantined: doneQ.Name},
		{name: "one that is gone is success", lv: volume.LVNameFor("pvc-gone")},
		{name: "no claim tag: never touched", lv: noClaim, wantErr: "no claim tag"},
		{name: "an LV without carve's tag is left", lv: "foreign", wantErr: "not the name of a carve volume"},
		{name: "an open LV is left", lv: open, wantErr: "in use"},
		{name: "a volume with snapshots is left", lv: snapped, wantErr: "has snapshots"},
		{name: "one in flight is left", lv: orphan, busy: orphan, wantErr: "in flight"},
		{name: "its quarantine name in flight is left", lv: orphan, busy: "carve-orphan-" + orphan[len("carve-"):], wantErr: "in flight"},
		{name: "a quarantined one is not quarantined again", lv: doneQ.Name, wantErr: "quarantined already"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			f := newVG1LVM(lvs...)
			f.LVs["vg1/"+open].Attr.Open = true
			p, view, locks, _ := orphanProvisioner(t, f)
			if tt.busy != "" {
				locks.TryAcquire(tt.busy)
			}
			got, err := p.QuarantineOrphan(ctx, "vg1", tt.lv, at)
			if (err != nil) != (tt.wantErr != "") || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("QuarantineOrphan: %v, want an error saying %q", err, tt.wantErr)
			}
			if got != tt.wantQuarantined {
				t.Errorf("new name %q, want %q", got, tt.wantQuarantined)
			}
			if len(f.Removals) > 0 {
				t.Errorf("removed %v: the first step never removes", f.Removals)
			}
			if tt.wantQuarantined == "" {
				if _, there := f.LVTags("vg1", tt.lv); tt.wantErr != "" && !there {
					t.Errorf("refused, yet %s is gone", tt.lv)
				}
				return
			}
			lv, err := f.GetLV(ctx, "vg1", tt.wantQuarantined)
			if err != nil {
				t.Fatalf("quarantined LV: %v", err)
			}
			q, ok := volume.QuarantinedFrom(lv.Name, lv.Tags)
			if !ok || q.Original != tt.lv || !q.At.Equal(at) || lv.Attr.Active {
				t.Errorf("quarantined LV %s: %+v %v, active %v, tags %v; want from %s at %v, inactive", lv.Name, q, ok, lv.Attr.Active, lv.Tags, tt.lv, at)
			}
			if n := len(slices.DeleteFunc(slices.Clone(lv.Tags), func(t string) bool { return !volume.IsOrphanTag(t) })); n != 2 {
				t.Errorf("%d orphan tags %v, want 2", n, lv.Tags)
			}
			if !volume.IsCarve(lv.Tags) {
				t.Error("the quarantined LV lost carve's owner tag")
			}
			if _, ok := view.LV("vg1", tt.lv); ok {
				t.Error("the old name is still in the view")
			}
			if _, ok := view.LV("vg1", tt.wantQuarantined); !ok {
				t.Error("the quarantined LV is not in the view (the inventory would miss it)")
			}
		})
	}
}
