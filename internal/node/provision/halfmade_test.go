package provision

import (
	"context"
	"testing"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// halfMake turns the snapshot LV vg/name into what a crash between
// lvcreate's two commits leaves: its copy-on-write store, a plain LV with
// every tag of the snapshot and no origin.
func (l *lifecycle) halfMake(vg, name string) {
	l.lvm.Mu.Lock()
	defer l.lvm.Mu.Unlock()
	lv := l.lvm.LVs[vg+"/"+name]
	lv.Attr = lvm.ParseAttributes("-wi-------")
	lv.Origin = ""
}

// A copy-on-write snapshot that a crash left half made (after the agent's
// restart, LVM shows its store as a plain LV with the snapshot's tags) is
// neither ready nor restorable; CreateSnapshot again replaces it with a
// snapshot of the origin.
func TestHalfMadeSnapshotIsMadeAgain(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	vol := l.mustVolume(t, "pvc-1", gib, "fast")
	snap := l.mustSnapshot(t, "snap-1", vol)
	l.halfMake(snap.VolumeGroup, snap.Name)
	l.restart(t)

	half := l.lv(t, volume.SnapshotID("node-a", snap.VolumeGroup, snap.Name))
	if err := SnapshotUsable(half); err == nil {
		t.Error("a half-made snapshot is usable (it would be ReadyToUse)")
	}
	_, err := l.p.Create(ctx, l.request(t, "pvc-restored", gib, "fast", snapshotSource(snap)))
	wantKind(t, err, ErrRefused, "never completed")
	if _, ok := l.lvm.LVTags("vg1", volume.LVNameFor("pvc-restored")); ok {
		t.Error("a restore from a half-made snapshot left its volume behind")
	}

	again := l.mustSnapshot(t, "snap-1", vol)
	_, origin, _ := volume.ParseVolumeID(vol)
	if again.Attr.Type != lvm.TypeSnapshot || again.Origin != origin || again.Name != snap.Name {
		t.Errorf("CreateSnapshot again gave %s/%s (%s, origin %q), want the snapshot of %s", again.VolumeGroup, again.Name, again.Attr.Type, again.Origin, origin)
	}
	if err := SnapshotUsable(l.lv(t, volume.SnapshotID("node-a", snap.VolumeGroup, snap.Name))); err != nil {
		t.Errorf("the snapshot made again: %v", err)
	}
}

// A half-made snapshot LVM holds but the view has not seen is removed when
// lvcreate finds its name taken, and the next attempt makes the snapshot.
func TestHalfMadeSnapshotUnseenByTheView(t *testing.T) {
	l := newLifecycle(t)
	vol := l.mustVolume(t, "pvc-1", gib, "fast")
	snap := l.mustSnapshot(t, "snap-1", vol)
	l.halfMake(snap.VolumeGroup, snap.Name)
	l.view.Removed(snap.VolumeGroup, snap.Name)

	vg, origin, _ := volume.ParseVolumeID(vol)
	_, _, err := l.p.Snapshot(context.Background(), SnapshotRequest{Name: "snap-1", SourceID: vol, VolumeGroup: vg, Origin: origin})
	wantKind(t, err, ErrBusy, "half-made")
	if _, ok := l.lvm.LVTags(snap.VolumeGroup, snap.Name); ok {
		t.Error("the half-made snapshot LV is still there")
	}
	if again := l.mustSnapshot(t, "snap-1", vol); again.Attr.Type != lvm.TypeSnapshot || again.Origin != origin {
		t.Errorf("the next attempt gave %s, origin %q, want a snapshot of %s", again.Attr.Type, again.Origin, origin)
	}
}
