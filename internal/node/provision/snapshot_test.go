package provision

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// snapshot takes the snapshot name of the volume id.
func (l *lifecycle) snapshot(name, id string) (*lvm.LogicalVolume, error) {
	vg, origin, err := volume.ParseVolumeID(id)
	if err != nil {
		return nil, err
	}
	lv, _, err := l.p.Snapshot(context.Background(), SnapshotRequest{Name: name, SourceID: id, VolumeGroup: vg, Origin: origin})
	return lv, err
}

// snapshotID is the snapshot ID of a snapshot LV of this node.
func snapshotID(lv *lvm.LogicalVolume) string {
	return volume.SnapshotID("node-a", lv.VolumeGroup, lv.Name)
}

// deleteVolume deletes the volume id.
func (l *lifecycle) deleteVolume(t *testing.T, id string) error {
	t.Helper()
	vg, name, err := volume.ParseVolumeID(id)
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.p.Delete(context.Background(), vg, name, id)
	return err
}

// deleteSnapshot deletes the snapshot LV lv.
func (l *lifecycle) deleteSnapshot(lv *lvm.LogicalVolume) error {
	_, err := l.p.DeleteSnapshot(context.Background(), lv.VolumeGroup, lv.Name, snapshotID(lv))
	return err
}

// available is the room class has left, as the view counts it.
func (l *lifecycle) available(t *testing.T, class string) int64 {
	t.Helper()
	c, err := l.view.Capacity(l.class(t, class))
	if err != nil {
		t.Fatal(err)
	}
	return int64(c.Available)
}

// hasVolume tells whether the view lists the volume of name.
func (l *lifecycle) hasVolume(name string) bool {
	return slices.ContainsFunc(l.view.Volumes(), func(lv lvm.LogicalVolume) bool { return lv.Name == volume.LVNameFor(name) })
}

// TestSnapshot: a thin volume's snapshot is a thin LV left inactive until
// needed, a thick one's a copy-on-write LV taking VG space; a snapshot is
// idempotent by name and source, also after a restart, and the same name
// of another source is ErrMismatch naming both.
func TestSnapshot(t *testing.T) {
	tests := []struct {
		name     string
		class    string
		wantType lvm.VolumeType
		// wantVGFree is vg1's free space after the snapshot (10 GiB - 4
		// GiB pool, - the 1 GiB thick volume and its copy-on-write space).
		wantVGFree uint64
	}{
		{"thin", "thin", lvm.TypeThin, 6 << 30},
		// 20% of 1 GiB and 1/128 of that, rounded up to 4 MiB extents:
		// 208 MiB.
		{"thick", "fast", lvm.TypeSnapshot, 5<<30 - 208<<20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLifecycle(t)
			vol := l.mustVolume(t, "pvc-1", gib, tt.class)
			snap := l.mustSnapshot(t, "snap-1", vol)
			if id := snapshotID(snap); !strings.HasPrefix(id, "node-a/vg1/") {
				t.Errorf("snapshot ID %s does not name node and volume group", id)
			}
			lv := l.lv(t, snapshotID(snap))
			if lv.Attr.Type != tt.wantType || lv.Origin != vol[len("vg1/"):] {
				t.Errorf("snapshot LV %+v: want a %s snapshot of %s", lv, tt.wantType, vol)
			}
			if tt.wantType == lvm.TypeThin && (lv.Attr.Active || !lv.Attr.ActivationSkip) {
				t.Errorf("thin snapshot LV active %v, activation skip %v: want inactive until needed", lv.Attr.Active, lv.Attr.ActivationSkip)
			}
			if free := l.lvm.VGs["vg1"].Free; free != tt.wantVGFree {
				t.Errorf("vg1 free %d, want %d", free, tt.wantVGFree)
			}
			if SnapshotUsable(lv) != nil || lv.Time.IsZero() {
				t.Errorf("snapshot LV %+v: want usable, with a creation time", lv)
			}

			// Idempotent by name and source; another source is a conflict.
			if again := l.mustSnapshot(t, "snap-1", vol); snapshotID(again) != snapshotID(snap) {
				t.Errorf("repeat gave %s, want %s", snapshotID(again), snapshotID(snap))
			}
			other := l.mustVolume(t, "pvc-2", gib, tt.class)
			_, err := l.snapshot("snap-1", other)
			wantKind(t, err, ErrMismatch, vol, other)

			// A snapshot is not a volume.
			if vols := l.view.Volumes(); len(vols) != 2 {
				t.Errorf("the view lists %d volumes, want the 2 volumes", len(vols))
			}
			if snaps := l.view.Snapshots(); len(snaps) != 1 || snaps[0].Name != snap.Name {
				t.Errorf("the view lists snapshots %v, want the one", snaps)
			}

			// After a restart, the snapshot is found from LVM alone.
			l.restart(t)
			if again := l.mustSnapshot(t, "snap-1", vol); snapshotID(again) != snapshotID(snap) {
				t.Errorf("after a restart, repeat gave %s", snapshotID(again))
			}
			if n := len(l.view.Snapshots()); n != 1 {
				t.Errorf("%d snapshots after the repeats, want 1", n)
			}
		})
	}
}

// TestSnapshotRoom: a thin snapshot counts against the overprovision
// ratio (4 GiB pool x 2), a copy-on-write one takes VG space.
func TestSnapshotRoom(t *testing.T) {
	l := newLifecycle(t)
	thin := l.mustVolume(t, "big", 5*gib, "thin")
	_, err := l.snapshot("s1", thin)
	wantKind(t, err, ErrNoRoom, "class thin", "snapshot")
	l.mustVolume(t, "thin-2", 2*gib, "thin")
	if got := l.available(t, "thin"); got != gib {
		t.Fatalf("thin capacity %d; want 1 GiB", got)
	}

	thick := l.mustVolume(t, "thick", 4*gib, "fast")
	before := l.available(t, "fast")
	l.mustSnapshot(t, "s2", thick)
	// 20% of 4 GiB and 1/128 of that for metadata, rounded up to
	// extents: 828 MiB.
	if d := before - l.available(t, "fast"); d != 828<<20 {
		t.Errorf("a thick snapshot took %d bytes of capacity, want %d", d, 828<<20)
	}
}

// TestDeleteVolumeWithSnapshots: a thick volume with a snapshot is not
// deleted (lvremove would take the snapshot with it) until the snapshot
// is gone; a thin volume's snapshot outlives it and still names its
// source.
func TestDeleteVolumeWithSnapshots(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	thick := l.mustVolume(t, "thick", gib, "fast")
	snap := l.mustSnapshot(t, "s-thick", thick)
	wantKind(t, l.deleteVolume(t, thick), ErrRefused, snapshotID(snap))
	if err := l.deleteSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	if err := l.deleteVolume(t, thick); err != nil {
		t.Errorf("Delete after its snapshot is gone: %v", err)
	}

	thin := l.mustVolume(t, "thin", gib, "thin")
	tsnap := l.mustSnapshot(t, "s-thin", thin)
	if err := l.deleteVolume(t, thin); err != nil {
		t.Fatalf("Delete of a thin volume with a snapshot: %v", err)
	}
	l.lvm.LVs[tsnap.VolumeGroup+"/"+tsnap.Name].Origin = "" // LVM forgets the removed origin
	l.restart(t)
	got, err := l.p.SnapshotByID(ctx, snapshotID(tsnap), false)
	if err != nil {
		t.Fatalf("snapshot after its volume was deleted: %v", err)
	}
	if origin, _ := volume.OriginFromTags(got.Tags); volume.VolumeID(got.VolumeGroup, origin) != thin || SnapshotUsable(got) != nil {
		t.Errorf("snapshot after its volume was deleted: %+v, usable: %v; want usable, naming %s", got, SnapshotUsable(got), thin)
	}
}

// TestDeleteSnapshot: a snapshot is deleted, again is fine, and its
// volume stays.
func TestDeleteSnapshot(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	vol := l.mustVolume(t, "pvc-1", gib, "thin")
	snap := l.mustSnapshot(t, "snap-1", vol)
	for _, what := range []string{"the snapshot", "again"} {
		if err := l.deleteSnapshot(snap); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	if _, err := l.lvm.GetLV(ctx, "vg1", vol[len("vg1/"):]); err != nil {
		t.Errorf("the volume went with its snapshot: %v", err)
	}
	if n := len(l.view.Snapshots()); n != 0 {
		t.Errorf("%d snapshots left", n)
	}
}

// TestRestoreAndCloneThin: a restore or clone in the thin class of a thin
// volume is a thin snapshot, active, of at least the source's size, made
// without a copy; a repeat is the same volume, and the same name with
// another source, or none, is ErrMismatch.
func TestRestoreAndCloneThin(t *testing.T) {
	tests := []struct {
		name     string
		snapshot bool
		size     int64
		wantSize uint64
	}{
		{"restore", true, gib, 1 << 30},
		{"restore bigger", true, 2 * gib, 2 << 30},
		{"restore asked smaller gets the snapshot's size", true, 100 * mib, 1 << 30},
		{"clone", false, gib, 1 << 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			l := newLifecycle(t)
			vol := l.mustVolume(t, "pvc-1", gib, "thin")
			snap := l.mustSnapshot(t, "snap-1", vol)
			src := &Source{ID: vol}
			if tt.snapshot {
				src = snapshotSource(snap)
			}
			req := l.request(t, "pvc-new", tt.size, "thin", src)
			made, err := l.p.Create(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if made.Size != tt.wantSize {
				t.Errorf("Create made %d bytes, want %d", made.Size, tt.wantSize)
			}
			id := volume.VolumeID(made.VolumeGroup, made.Name)
			lv := l.lv(t, id)
			if lv.Attr.Type != lvm.TypeThin || lv.Origin == "" || lv.Attr.ActivationSkip || lv.Size != tt.wantSize {
				t.Errorf("LV %+v: want a thin snapshot, activation not skipped, of %d bytes", lv, tt.wantSize)
			}
			if len(l.copier.Copies) != 0 {
				t.Errorf("a thin restore copied: %v", l.copier.Copies)
			}
			again, err := l.p.Create(ctx, l.request(t, "pvc-new", tt.size, "thin", src))
			if err != nil || volume.VolumeID(again.VolumeGroup, again.Name) != id {
				t.Errorf("repeat: %v, %v", again, err)
			}
			// The same name from another source is another volume.
			other := l.mustVolume(t, "pvc-other", gib, "thin")
			_, err = l.p.Create(ctx, l.request(t, "pvc-new", tt.size, "thin", &Source{ID: other}))
			wantKind(t, err, ErrMismatch, "content source")
			_, err = l.p.Create(ctx, l.request(t, "pvc-new", tt.size, "thin", nil))
			wantKind(t, err, ErrMismatch, "content source")
		})
	}
}

// TestRestoreSourceRefused: a source on another node is ErrElsewhere, a
// source that is gone or not carve's ErrNotFound, a limit below the
// source's size ErrOutOfRange; nothing is made.
func TestRestoreSourceRefused(t *testing.T) {
	tests := []struct {
		name   string
		source func(vol, snap string) *Source
		kind   error
		msg    []string
	}{
		{"snapshot of another node", func(_, snap string) *Source {
			return &Source{ID: "node-b" + snap[len("node-a"):], Snapshot: true}
		}, ErrElsewhere, []string{"node-b"}},
		{"snapshot gone", func(string, string) *Source {
			return &Source{ID: "node-a/vg1/" + volume.SnapshotLVNameFor("gone"), Snapshot: true}
		}, ErrNotFound, []string{"does not exist"}},
		{"snapshot ID not carve's", func(string, string) *Source { return &Source{ID: "non-existing-snapshot-id", Snapshot: true} }, ErrNotFound, nil},
		{"volume gone", func(string, string) *Source { return &Source{ID: "vg1/" + volume.LVNameFor("gone")} }, ErrNotFound, nil},
		{"a snapshot's ID as a volume", func(_, snap string) *Source { return &Source{ID: snap[len("node-a")+1:]} }, ErrNotFound, nil},
		{"limit below the source", func(_, snap string) *Source { return &Source{ID: snap, Snapshot: true} }, ErrOutOfRange, []string{"limit_bytes"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLifecycle(t)
			vol := l.mustVolume(t, "pvc-1", 2*gib, "thin")
			snap := snapshotID(l.mustSnapshot(t, "snap-1", vol))
			req := l.request(t, "pvc-new", gib, "thin", tt.source(vol, snap))
			req.Range.Limit = gib
			_, err := l.p.Create(context.Background(), req)
			wantKind(t, err, tt.kind, tt.msg...)
			if n := len(l.view.Volumes()); n != 1 {
				t.Errorf("a refused restore left %d volumes, want the source alone", n)
			}
		})
	}
}

// TestRestoreFromFullCOWSnapshot: a copy-on-write snapshot whose space ran
// out is not usable, and no restore reads it.
func TestRestoreFromFullCOWSnapshot(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	vol := l.mustVolume(t, "pvc-1", gib, "fast")
	snap := l.mustSnapshot(t, "snap-1", vol)
	lv := l.lvm.LVs[snap.VolumeGroup+"/"+snap.Name]
	lv.Attr = lvm.ParseAttributes("swi-I-s---")
	lv.SnapPercent = 100
	l.restart(t)
	got, err := l.p.SnapshotByID(ctx, snapshotID(snap), false)
	if err != nil || SnapshotUsable(got) == nil {
		t.Errorf("SnapshotByID of a full COW snapshot = %+v, %v; want it, not usable", got, err)
	}
	if snaps := l.view.Snapshots(); len(snaps) != 1 || SnapshotUsable(&snaps[0]) == nil {
		t.Errorf("the view's snapshots %v; want the snapshot, not usable", snaps)
	}
	_, err = l.p.Create(ctx, l.request(t, "pvc-new", gib, "fast", snapshotSource(snap)))
	wantKind(t, err, ErrRefused, "copy-on-write space")
	if len(l.copier.Copies) != 0 || l.hasVolume("pvc-new") {
		t.Error("a restore from a full COW snapshot made a volume")
	}
}

// TestCloneSourceNotHere: a clone asked on a node that does not hold its
// source volume is ErrNotFound (the controller sends a clone to its
// source's node, or grants a copy from there); nothing is made.
func TestCloneSourceNotHere(t *testing.T) {
	gone := "vg1/" + volume.LVNameFor("gone")
	// Another node's volume group, which this node does not configure.
	foreign := "vg-b/" + volume.LVNameFor("pvc-b")
	for _, source := range []string{gone, foreign} {
		t.Run(source, func(t *testing.T) {
			l := newLifecycle(t)
			l.mustVolume(t, "pvc-1", gib, "fast")
			_, err := l.p.Create(context.Background(), l.request(t, "pvc-clone", gib, "fast", &Source{ID: source}))
			wantKind(t, err, ErrNotFound, "does not exist", "carve controller sends a clone to its source's node")
			if n := len(l.view.Volumes()); n != 1 {
				t.Errorf("a refused clone left %d volumes, want the first alone", n)
			}
		})
	}
}

// TestRestoreWithoutSizeTag: a copy-on-write snapshot whose size tag is
// gone (an lvchange by hand, another tool) holds a volume of unknown
// size; its restore is refused, naming the tag, never answered with an
// empty volume (the copy of 0 bytes and a zeroed tail it was before).
func TestRestoreWithoutSizeTag(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	vol := l.mustVolume(t, "pvc-1", gib, "fast")
	snap := l.mustSnapshot(t, "snap-1", vol)
	lv := l.lvm.LVs[snap.VolumeGroup+"/"+snap.Name]
	lv.Tags = slices.DeleteFunc(lv.Tags, func(t string) bool { return strings.HasPrefix(t, volume.TagSizePrefix) })
	l.restart(t)
	_, err := l.p.Create(ctx, l.request(t, "pvc-new", gib, "fast", snapshotSource(snap)))
	wantKind(t, err, ErrRefused, snapshotID(snap), volume.TagSizePrefix)
	if len(l.copier.Copies) != 0 || l.hasVolume("pvc-new") {
		t.Errorf("a restore from a snapshot of unknown size made a volume (copies %v)", l.copier.Copies)
	}
}

// TestDeleteVolumeWithOthersSnapshots: lvremove --yes takes every
// copy-on-write snapshot of a thick origin with it, not only carve's; a
// volume that is the origin of any LV is not removed, and the answer
// names that LV.
func TestDeleteVolumeWithOthersSnapshots(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	vol := l.mustVolume(t, "pvc-1", gib, "fast")
	lvName := l.lv(t, vol).Name
	// Another tool's snapshot, made after the view's last refresh: no
	// carve tag.
	if _, err := l.lvm.CreateSnapshot(ctx, lvm.SnapshotRequest{VolumeGroup: "vg1", Origin: lvName, Name: "backup-tool-snap", CowSize: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	wantKind(t, l.deleteVolume(t, vol), ErrRefused, "vg1/backup-tool-snap")
	for _, name := range []string{lvName, "backup-tool-snap"} {
		if _, ok := l.lvm.LVs["vg1/"+name]; !ok {
			t.Errorf("LV vg1/%s was removed", name)
		}
	}
	if err := l.lvm.RemoveLV(ctx, "vg1", "backup-tool-snap"); err != nil {
		t.Fatal(err)
	}
	if err := l.deleteVolume(t, vol); err != nil {
		t.Errorf("Delete once the other snapshot is gone: %v", err)
	}
}

// TestSnapshotSizeIsWhatTheClaimAsked: a volume Create made bigger than
// asked (xfs's minimum, whole extents) records the ask; its snapshot's
// size in bytes is the asked size, also read back from LVM's tags alone,
// so that a restore asked at the source claim's size passes
// csi-provisioner's check, and the restored volume still gets the
// source's whole size. A volume made as asked, or grown since it was
// made, has its size.
func TestSnapshotSizeIsWhatTheClaimAsked(t *testing.T) {
	tests := []struct {
		name     string
		fs       string
		asked    int64
		class    string
		grow     int64 // grown to this before the snapshot (0: not)
		made     int64
		reported int64
	}{
		{"xfs minimum, thick", "xfs", 256 * mib, "fast", 0, 300 * mib, 256 * mib},
		{"xfs minimum, thin", "xfs", 256 * mib, "thin", 0, 300 * mib, 256 * mib},
		{"whole extents", "ext4", 101 * mib, "fast", 0, 104 * mib, 101 * mib},
		{"as asked", "ext4", 64 * mib, "fast", 0, 64 * mib, 64 * mib},
		{"grown since", "xfs", 256 * mib, "fast", 512 * mib, 512 * mib, 512 * mib},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			l := newLifecycle(t)
			req := l.request(t, "pvc-1", tt.asked, tt.class, nil)
			req.FSType = tt.fs
			made, err := l.p.Create(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			id := volume.VolumeID(made.VolumeGroup, made.Name)
			if tt.grow > 0 {
				if _, err := l.lvm.ExtendLV(ctx, made.VolumeGroup, made.Name, uint64(tt.grow)); err != nil {
					t.Fatal(err)
				}
				l.restart(t)
			}
			snap := l.mustSnapshot(t, "snap-1", id)
			if got := int64(l.lv(t, id).Size); got != tt.made {
				t.Fatalf("volume made %d bytes, want %d", got, tt.made)
			}
			if got := int64(SnapshotSizeBytes(SnapshotSize(snap), snap)); got != tt.reported {
				t.Errorf("snapshot size in bytes %d, want %d", got, tt.reported)
			}
			l.restart(t) // read back from LVM's tags alone
			back, err := l.p.SnapshotByID(ctx, snapshotID(snap), false)
			if err != nil {
				t.Fatal(err)
			}
			if got := int64(SnapshotSizeBytes(SnapshotSize(back), back)); got != tt.reported {
				t.Errorf("after a restart the snapshot's size in bytes is %d, want %d", got, tt.reported)
			}
			// Restored at the size the snapshot reports: the source's
			// whole size.
			rreq := l.request(t, "pvc-restored", tt.reported, tt.class, snapshotSource(snap))
			rreq.FSType = tt.fs
			restored, err := l.p.Create(ctx, rreq)
			if err != nil {
				t.Fatal(err)
			}
			if int64(restored.Size) != tt.made {
				t.Errorf("restored volume %d bytes, want the source's %d", restored.Size, tt.made)
			}
		})
	}
}
