//go:build hosttest

package host

import (
	"errors"
	"slices"
	"testing"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/test/harness/lvmtest"
)

// TestRenameAndRetag: what the audit's quarantine of an orphan runs on
// real lvm2 (issue 22 item 5): one lvchange that deletes and adds tags
// together, lvrename to a free name, and each failure classified (the LV
// gone, the name taken).
func TestRenameAndRetag(t *testing.T) {
	v, c, obs := setup(t, lvmtest.Options{Size: 64 * mib})
	ctx := ctxFor(t)
	for _, name := range []string{"carve-q", "carve-taken"} {
		if _, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: name, Size: 4 * mib,
			Tags: []string{"carve.dev/owner=carve", "carve.dev/orphaned-at=1"}}); err != nil {
			t.Fatal(err)
		}
	}
	obs.take()
	if err := c.ChangeTags(ctx, v.Name, "carve-q", []string{"carve.dev/orphan-of=carve-q", "carve.dev/orphaned-at=2"},
		[]string{"carve.dev/orphaned-at=1", "not-there"}); err != nil {
		t.Fatalf("ChangeTags: %v", err)
	}
	if got := obs.take(); !slices.Equal(got, []string{"lvchange"}) {
		t.Errorf("ChangeTags ran %v, want one lvchange", got)
	}
	if err := c.RenameLV(ctx, v.Name, "carve-q", "carve-orphan-q"); err != nil {
		t.Fatalf("RenameLV: %v", err)
	}
	lv, err := c.GetLV(ctx, v.Name, "carve-orphan-q")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"carve.dev/orphan-of=carve-q", "carve.dev/orphaned-at=2", "carve.dev/owner=carve"}
	got := slices.Clone(lv.Tags)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("tags after the quarantine %v, want %v", got, want)
	}
	if _, err := c.GetLV(ctx, v.Name, "carve-q"); !errors.Is(err, lvm.ErrNotFound) {
		t.Errorf("the old name after the rename: %v, want ErrNotFound", err)
	}
	if err := c.RenameLV(ctx, v.Name, "carve-q", "carve-other"); !errors.Is(err, lvm.ErrNotFound) {
		t.Errorf("renaming an LV that is gone: %v, want ErrNotFound", err)
	}
	if err := c.RenameLV(ctx, v.Name, "carve-orphan-q", "carve-taken"); !errors.Is(err, lvm.ErrAlreadyExists) {
		t.Errorf("renaming onto a taken name: %v, want ErrAlreadyExists", err)
	}
	if err := c.ChangeTags(ctx, v.Name, "carve-q", []string{"x"}, nil); !errors.Is(err, lvm.ErrNotFound) {
		t.Errorf("retagging an LV that is gone: %v, want ErrNotFound", err)
	}
}
