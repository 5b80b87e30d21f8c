//go:build guestinner

package lvminner

import (
	"testing"

	"github.com/carve-csi/carve/internal/node/dmsnapshot"
	"github.com/carve-csi/carve/internal/node/lvm"
)

// TestDMSnapshotState: the kernel's own state of a copy-on-write
// snapshot, read without lvm (the DM_TABLE_STATUS ioctl), agrees with
// LVM's: usable while its space lasts, invalid once the origin is
// rewritten beyond it; a linear LV is no snapshot.
func TestDMSnapshotState(t *testing.T) {
	ctx := testContext(t)
	vg := newVG(t, gib)
	c := newClient(vg)
	r := dmsnapshot.Reader{Control: c.ControlNode()}
	origin, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: vg.Name, Name: "cow-origin", Size: 32 * mib})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := c.CreateSnapshot(ctx, lvm.SnapshotRequest{VolumeGroup: vg.Name, Origin: "cow-origin", Name: "cow-snap", CowSize: 8 * mib})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := r.Read(origin.Path); err != nil || st.Snapshot {
		t.Errorf("Read(origin) = %+v, %v; want no snapshot", st, err)
	}
	st, err := r.Read(snap.Path)
	if err != nil || !st.Snapshot || st.Invalid {
		t.Fatalf("Read(snapshot) = %+v, %v; want a usable snapshot", st, err)
	}
	t.Logf("fresh snapshot: status %q", st.Status)

	fill(t, origin.Path, 'X', int(16*mib))
	st, err = r.Read(snap.Path)
	if err != nil || !st.Snapshot || !st.Invalid {
		t.Fatalf("Read(snapshot) after 16 MiB rewritten over 8 MiB of space = %+v, %v; want invalid", st, err)
	}
	lv, err := c.GetLV(ctx, vg.Name, "cow-snap")
	if err != nil {
		t.Fatal(err)
	}
	if !lv.Attr.SnapshotInvalid && lv.SnapPercent < 100 {
		t.Errorf("LVM shows the snapshot usable (attr %q, %.1f%%) while the kernel says %q", lv.Attr.Raw, lv.SnapPercent, st.Status)
	}
	t.Logf("spent snapshot: status %q, lv_attr %q", st.Status, lv.Attr.Raw)
}
