package provision

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/volume"
)

// TestDelete: Delete removes a carve volume and gives its room back; one
// that is gone, or in a volume group not of this node, is deleted
// already; an LV not carve's or open is ErrRefused; while the volume
// group is missing the answer is ErrUnavailable, and the retry once it is
// back removes the LV; LVM's other failures come back as they are. A
// second Delete of a deleted volume succeeds.
func TestDelete(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name  string
		setup func(t *testing.T, l *lifecycle) string // returns the ID
		kind  error                                   // nil: success, unless failure is set
		// failure is what an error of no kind (LVM's own) must say.
		failure string
		msg     []string
		gone    bool // the LV must be gone afterwards
	}{
		{name: "existing", setup: func(t *testing.T, l *lifecycle) string { return l.mustVolume(t, "pvc-1", gib, "fast") }, gone: true},
		{name: "thin", setup: func(t *testing.T, l *lifecycle) string { return l.mustVolume(t, "pvc-1", gib, "thin") }, gone: true},
		{name: "unknown volume", setup: func(*testing.T, *lifecycle) string { return volume.VolumeID("vg1", volume.LVNameFor("never")) }},
		{name: "unknown VG", setup: func(*testing.T, *lifecycle) string { return volume.VolumeID("vg9", volume.LVNameFor("never")) }},
		{name: "not in the view", setup: func(t *testing.T, l *lifecycle) string {
			lv, err := l.lvm.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: "vg1", Name: volume.LVNameFor("x"), Size: 1,
				Tags: []string{volume.TagOwner, volume.VolumeTag("x"), volume.TagClassPrefix + "fast"}})
			if err != nil {
				t.Fatal(err)
			}
			return volume.VolumeID(lv.VolumeGroup, lv.Name)
		}, gone: true},
		{name: "not carve's", setup: func(t *testing.T, l *lifecycle) string {
			if _, err := l.lvm.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: "vg1", Name: "carve-foreign", Size: 1}); err != nil {
				t.Fatal(err)
			}
			return "vg1/carve-foreign"
		}, kind: ErrRefused, msg: []string{volume.TagOwner}},
		{name: "open", setup: func(t *testing.T, l *lifecycle) string {
			id := l.mustVolume(t, "pvc-1", gib, "fast")
			l.lvm.Mu.Lock()
			l.lvm.LVs[id].Attr.Open = true
			l.lvm.Mu.Unlock()
			return id
		}, kind: ErrRefused, msg: []string{"in use"}},
		{name: "lvremove fails", setup: func(t *testing.T, l *lifecycle) string {
			id := l.mustVolume(t, "pvc-1", gib, "fast")
			l.lvm.FailNext = errors.New("lvm crashed")
			return id
		}, failure: "lvm crashed"},
		// The volume group is this node's but missing (disks not seen yet
		// after a reboot, a failed HBA, an lvm.conf filter): the LV may
		// come back with it, so the deletion must be retried, not
		// answered done with the LV (and its data) orphaned.
		{name: "volume group missing", setup: func(t *testing.T, l *lifecycle) string {
			id := l.mustVolume(t, "pvc-1", gib, "other")
			l.lvm.HideVG("vg2")
			if err := l.view.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			return id
		}, kind: ErrUnavailable, msg: []string{"volume group vg2 is missing"}},
		{name: "volume group missing, the view not refreshed yet", setup: func(t *testing.T, l *lifecycle) string {
			id := l.mustVolume(t, "pvc-1", gib, "other")
			l.lvm.HideVG("vg2")
			return id
		}, kind: ErrUnavailable, msg: []string{"volume group vg2 is missing"}},
		{name: "volume group missing, an LV the view never held", setup: func(t *testing.T, l *lifecycle) string {
			l.lvm.HideVG("vg2")
			return volume.VolumeID("vg2", volume.LVNameFor("made-before-a-restart"))
		}, kind: ErrUnavailable, msg: []string{"volume group vg2 is missing"}},
		{name: "volume group unreadable", setup: func(t *testing.T, l *lifecycle) string {
			id := l.mustVolume(t, "pvc-1", gib, "other")
			l.lvm.Unreadable = map[string]error{"vg2": errors.New("checksum error in metadata")}
			if err := l.view.Refresh(ctx); err != nil {
				t.Fatal(err)
			}
			return id
		}, failure: "checksum error"},
		{name: "gone under our feet", setup: func(t *testing.T, l *lifecycle) string {
			id := l.mustVolume(t, "pvc-1", gib, "fast")
			l.lvm.FailNext = fmt.Errorf("lvremove: %w", lvm.ErrNotFound)
			return id
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newLifecycle(t)
			before := l.available(t, "fast")
			id := tt.setup(t, l)
			err := l.deleteVolume(t, id)
			switch {
			case tt.kind != nil:
				wantKind(t, err, tt.kind, tt.msg...)
			case tt.failure != "":
				var kinded *Error
				if err == nil || errors.As(err, &kinded) || !strings.Contains(err.Error(), tt.failure) {
					t.Errorf("Delete = %v, want LVM's own error saying %q", err, tt.failure)
				}
			case err != nil:
				t.Fatalf("Delete: %v", err)
			}
			vg, lvName, _ := volume.ParseVolumeID(id)
			if l.lvm.Hidden["vg2"] != nil || l.lvm.Unreadable != nil {
				// Once the volume group is back the LV is there, and
				// the retried Delete removes it.
				l.lvm.Unreadable = nil
				if l.lvm.Hidden["vg2"] != nil {
					l.lvm.ShowVG("vg2")
				}
				if _, gerr := l.lvm.GetLV(ctx, vg, lvName); gerr == nil {
					if err := l.deleteVolume(t, id); err != nil {
						t.Errorf("Delete once the volume group is back: %v", err)
					}
					if _, gerr := l.lvm.GetLV(ctx, vg, lvName); !errors.Is(gerr, lvm.ErrNotFound) {
						t.Errorf("LV still there after the retried delete: %v", gerr)
					}
				}
			}
			if !tt.gone {
				return
			}
			if _, err := l.lvm.GetLV(ctx, vg, lvName); !errors.Is(err, lvm.ErrNotFound) {
				t.Errorf("LV still there: %v", err)
			}
			if _, ok := l.view.LV(vg, lvName); ok {
				t.Error("the view still holds the LV")
			}
			if after := l.available(t, "fast"); after < before {
				t.Errorf("capacity %d after delete, %d before create", after, before)
			}
			// Idempotent: again is fine.
			if err := l.deleteVolume(t, id); err != nil {
				t.Errorf("second Delete: %v", err)
			}
		})
	}
}

// TestDeleteFlushesTheRemoval: lvm2 leaves its metadata in the disks'
// write caches, so Delete and DeleteSnapshot flush the volume group's PVs
// once lvremove has run, before they return; a flush that fails fails the
// call (with the flush's error, which the edge answers as INTERNAL), and
// its retry, which finds the LV gone, flushes again.
func TestDeleteFlushesTheRemoval(t *testing.T) {
	l := newLifecycle(t)
	var mu sync.Mutex
	var flushes []string // each "path, LV gone|LV still there"
	// watched is the LV (vg/name) whose removal the flushes must follow.
	var watched string
	l.eraser.Observe = func(path string, m erase.Method) {
		if m != erase.Flush || watched == "" {
			return
		}
		vg, name, _ := strings.Cut(watched, "/")
		state := "LV gone"
		if _, ok := l.lvm.LVTags(vg, name); ok {
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

	for _, class := range []string{"fast", "thin"} {
		id := l.mustVolume(t, "pvc-"+class, gib, class)
		check("Create") // not watched: a create flushes the LV's own device
		watched = id
		if err := l.deleteVolume(t, id); err != nil {
			t.Fatal(err)
		}
		check("Delete "+id, provisiontest.PVOf("vg1")+", LV gone")
		watched = ""
	}

	id := l.mustVolume(t, "pvc-flush-fails", gib, "fast")
	watched = id
	gone := errors.New("the disk is gone")
	l.eraser.Mu.Lock()
	l.eraser.Fail = gone
	l.eraser.Mu.Unlock()
	err := l.deleteVolume(t, id)
	var kinded *Error
	if !errors.Is(err, gone) || errors.As(err, &kinded) {
		t.Errorf("Delete whose flush fails = %v, want the flush's error, of no kind", err)
	}
	check("Delete whose flush fails", provisiontest.PVOf("vg1")+", LV gone")
	l.eraser.Mu.Lock()
	l.eraser.Fail = nil
	l.eraser.Mu.Unlock()
	if err := l.deleteVolume(t, id); err != nil {
		t.Fatal(err)
	}
	check("the retry", provisiontest.PVOf("vg1")+", LV gone")
	watched = ""

	vol := l.mustVolume(t, "pvc-snapped", gib, "thin")
	snap := l.mustSnapshot(t, "snap-1", vol)
	check("Snapshot")
	watched = snap.VolumeGroup + "/" + snap.Name
	if err := l.deleteSnapshot(snap); err != nil {
		t.Fatal(err)
	}
	check("DeleteSnapshot", provisiontest.PVOf("vg1")+", LV gone")
}
