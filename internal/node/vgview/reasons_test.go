package vgview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/node/lvm"
)

// TestReadyReasons: every way Ready fails carries a reason code, the only
// thing /readyz tells an unauthenticated caller.
func TestReadyReasons(t *testing.T) {
	tests := []struct {
		name   string
		change func(v *View, r *lvm.Report, rep *fakeReporter)
		after  func(v *View) // after the refresh
		want   []string
	}{
		{"ready", nil, nil, nil},
		{"volume group missing", func(_ *View, r *lvm.Report, _ *fakeReporter) {
			r.VolumeGroups = r.VolumeGroups[1:]
		}, nil, []string{ReasonVGMissing}},
		{"volume group unreadable", func(_ *View, _ *lvm.Report, rep *fakeReporter) {
			rep.vgErr = map[string]error{"vg1": errors.New("/dev/sdb: checksum error")}
		}, nil, []string{ReasonVGUnreadable}},
		{"physical volume missing", func(_ *View, r *lvm.Report, _ *fakeReporter) {
			r.VolumeGroups[0].MissingPVs = 1
		}, nil, []string{ReasonPVMissing}},
		{"thin pool missing", func(_ *View, r *lvm.Report, _ *fakeReporter) {
			r.ThinPools = nil
		}, nil, []string{ReasonThinPoolMissing}},
		{"thin pool failed", func(_ *View, r *lvm.Report, _ *fakeReporter) {
			r.LogicalVolumes[0].Attr.Health = lvm.HealthFailed
		}, nil, []string{ReasonThinPoolUnusable}},
		{"stale view", nil, func(v *View) {
			v.StaleAfter(time.Minute)
			v.now = func() time.Time { return time.Now().Add(time.Hour) }
		}, []string{ReasonLVMTimeout}},
		{"refresh timed out", nil, func(v *View) {
			v.fail(fmt.Errorf("read LVM state: %w", context.DeadlineExceeded))
		}, []string{ReasonLVMTimeout}},
		{"refresh failed", nil, func(v *View) {
			v.fail(errors.New("read LVM state: exit code 5"))
		}, []string{ReasonLVMError}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := &fakeReporter{report: testReport()}
			v := New(rep, testConfig(), nil)
			r := testReport()
			if tt.change != nil {
				tt.change(v, &r, rep)
			}
			rep.set(r, nil)
			if err := v.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			if tt.after != nil {
				tt.after(v)
			}
			if got := Reasons(v.Ready()); !slices.Equal(got, tt.want) {
				t.Errorf("Reasons(%v) = %q, want %q", v.Ready(), got, tt.want)
			}
		})
	}
	t.Run("not loaded", func(t *testing.T) {
		v := New(&fakeReporter{report: testReport()}, testConfig(), nil)
		if got := Reasons(v.Ready()); !slices.Equal(got, []string{ReasonNotLoaded}) {
			t.Errorf("Reasons = %q", got)
		}
	})
	t.Run("two classes, two reasons, sorted once each", func(t *testing.T) {
		err := fmt.Errorf("wrapped: %w", errors.Join(notReady(ReasonVGMissing, errors.New("a")), errors.New("no reason"), notReady(ReasonVGMissing, errors.New("b"))))
		if got, want := Reasons(err), []string{ReasonUnknown, ReasonVGMissing}; !slices.Equal(got, want) {
			t.Errorf("Reasons = %q, want %q", got, want)
		}
	})
}
