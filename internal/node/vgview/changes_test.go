package vgview

import (
	"context"
	"errors"
	"testing"

	"github.com/carve-csi/carve/internal/node/lvm"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestChanges: every refresh and every mutation applied to the view closes
// the channel taken before it; reading the view does not.
func TestChanges(t *testing.T) {
	tests := []struct {
		name   string
		act    func(v *View, r *fakeReporter) error
		change bool
	}{
		{"refresh", func(v *View, _ *fakeReporter) error { return v.Refresh(context.Background()) }, true},
		{"failed refresh", func(v *View, r *fakeReporter) error {
			r.set(lvm.Report{}, errors.New("lvm hangs"))
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if v.Refresh(ctx) == nil {
				return errors.New("refresh with an ended context succeeded")
			}
			return nil
		}, true},
		{"created", func(v *View, _ *fakeReporter) error {
			v.Created(lvm.LogicalVolume{VolumeGroup: "vg1", Name: "new", Size: gi})
			return nil
		}, true},
		{"removed", func(v *View, _ *fakeReporter) error { v.Removed("vg1", "b"); return nil }, true},
		{"extended", func(v *View, _ *fakeReporter) error {
			lv, _ := v.LV("vg1", "b")
			grown := lv
			grown.Size += gi
			v.Extended(lv, grown)
			return nil
		}, true},
		{"reads", func(v *View, _ *fakeReporter) error {
			_, err := v.Capacity(&testConfig().DeviceClasses[0])
			v.Volumes()
			v.FindLV("b")
			return err
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &fakeReporter{report: testReport()}
			v := New(r, testConfig(), nil)
			if err := v.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			ch := v.Changes()
			if closed(ch) {
				t.Fatal("closed before any change")
			}
			if err := tt.act(v, r); err != nil {
				t.Fatal(err)
			}
			if got := closed(ch); got != tt.change {
				t.Errorf("closed = %v, want %v", got, tt.change)
			}
			if closed(v.Changes()) {
				t.Error("a channel taken after the change is closed already")
			}
		})
	}
}

// TestChangesCoalesce: changes before the wait wake it once; every watcher
// is woken.
func TestChangesCoalesce(t *testing.T) {
	v := New(&fakeReporter{report: testReport()}, testConfig(), nil)
	a, b := v.Changes(), v.Changes()
	for range 3 {
		v.Removed("vg1", "nothing")
	}
	if !closed(a) || !closed(b) {
		t.Fatal("a watcher was not woken")
	}
	c := v.Changes()
	if closed(c) {
		t.Fatal("the changes before the channel was taken woke it")
	}
	v.Created(lvm.LogicalVolume{VolumeGroup: "vg1", Name: "x"})
	if !closed(c) {
		t.Fatal("not woken by the next change")
	}
}
