package vgview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/lvm"
)

// TestClassAvailabilitySeries: every configured class has a
// carve_device_class_available series, 0 with the reason code when it
// cannot take volumes (its volume group gone included, which had no series
// at all before), 1 otherwise.
func TestClassAvailabilitySeries(t *testing.T) {
	cfg, good := fastOnVG2(1)
	tests := []struct {
		name   string
		change func(r *lvm.Report, rep *fakeReporter)
		// failRun records a failed periodic refresh (Run's timeout).
		failRun error
		want    map[string]string // class -> reason; absent: available
	}{
		{name: "all available", change: func(*lvm.Report, *fakeReporter) {}},
		{name: "volume group missing", change: func(r *lvm.Report, _ *fakeReporter) {
			r.VolumeGroups = slices.DeleteFunc(r.VolumeGroups, func(vg lvm.VolumeGroup) bool { return vg.Name == "vg2" })
		}, want: map[string]string{"fast": ReasonVGMissing}},
		{name: "volume group unreadable", change: func(_ *lvm.Report, rep *fakeReporter) {
			rep.vgErr = map[string]error{"vg2": errors.New("checksum error")}
		}, want: map[string]string{"fast": ReasonVGUnreadable}},
		{name: "physical volume missing", change: func(r *lvm.Report, _ *fakeReporter) {
			r.VolumeGroups[0].MissingPVs = 1
		}, want: map[string]string{"thick": ReasonPVMissing, "thin": ReasonPVMissing}},
		{name: "thin pool missing", change: func(r *lvm.Report, _ *fakeReporter) {
			r.ThinPools = nil
		}, want: map[string]string{"thin": ReasonThinPoolMissing}},
		{name: "thin pool failed", change: func(r *lvm.Report, _ *fakeReporter) {
			r.LogicalVolumes[0].Attr.Health = lvm.HealthFailed
		}, want: map[string]string{"thin": ReasonThinPoolUnusable}},
		{name: "metadata area full", change: func(r *lvm.Report, _ *fakeReporter) {
			r.VolumeGroups[2].MetadataAreaSize, r.VolumeGroups[2].MetadataAreaFree = 1044480, lvm.LVMetadataBytes-1
		}, want: map[string]string{"fast": ReasonMetadataFull}},
		{name: "lvm timed out", change: func(*lvm.Report, *fakeReporter) {}, failRun: context.DeadlineExceeded,
			want: map[string]string{"thick": ReasonLVMTimeout, "thin": ReasonLVMTimeout, "fast": ReasonLVMTimeout}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			rep := &fakeReporter{report: good()}
			v := New(rep, cfg, metrics.NewRecorder(reg))
			if err := v.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			r := good()
			tt.change(&r, rep)
			rep.set(r, nil)
			if err := v.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			if tt.failRun != nil {
				v.fail(tt.failRun)
			}
			var want strings.Builder
			want.WriteString("# HELP carve_device_class_available " + availableHelp + "\n# TYPE carve_device_class_available gauge\n")
			for _, c := range []struct{ name, vg string }{{"fast", "vg2"}, {"thick", "vg1"}, {"thin", "vg1"}} {
				value := 1
				if tt.want[c.name] != "" {
					value = 0
				}
				fmt.Fprintf(&want, "carve_device_class_available{device_class=%q,reason=%q,volume_group=%q} %d\n", c.name, tt.want[c.name], c.vg, value)
			}
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want.String()), "carve_device_class_available"); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestClassAvailabilityBeforeTheFirstRefresh: the series exist, at 0
// (not loaded), before the first refresh.
func TestClassAvailabilityBeforeTheFirstRefresh(t *testing.T) {
	reg := prometheus.NewRegistry()
	New(&fakeReporter{report: testReport()}, testConfig(), metrics.NewRecorder(reg))
	want := "# HELP carve_device_class_available " + availableHelp + "\n# TYPE carve_device_class_available gauge\n" +
		`carve_device_class_available{device_class="thick",reason="not-loaded",volume_group="vg1"} 0` + "\n" +
		`carve_device_class_available{device_class="thin",reason="not-loaded",volume_group="vg1"} 0` + "\n"
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "carve_device_class_available"); err != nil {
		t.Error(err)
	}
}

const availableHelp = "1 when a device class of this node can take new volumes; 0 when it cannot, with reason the code of why (vg-missing, vg-unreadable, pv-missing, thin-pool-missing, thin-pool-unusable, metadata-full, lvm-error, lvm-timeout, not-loaded). One series per configured class."
