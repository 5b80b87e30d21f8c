package metrics

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestObserveStepAndCommandResult(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRecorder(reg)
	r.ObserveStep(PhaseStage, StepMkfs, "fast", time.Second, nil)
	r.ObserveStep(PhaseStage, StepMkfs, "fast", time.Second, errors.New("mkfs failed"))
	r.ObserveCommand("lvcreate", time.Second, errors.New("exit 5"))
	for _, c := range []struct {
		name   string
		labels map[string]string
	}{
		{"carve_step_duration_seconds", map[string]string{"phase": "stage", "step": "mkfs", "device_class": "fast", "result": "success"}},
		{"carve_step_duration_seconds", map[string]string{"phase": "stage", "step": "mkfs", "device_class": "fast", "result": "error"}},
		{"carve_lvm_command_duration_seconds", map[string]string{"command": "lvcreate", "result": "error"}},
	} {
		if got := sampleCount(t, reg, c.name, c.labels); got != 1 {
			t.Errorf("%s%v: count %d, want 1", c.name, c.labels, got)
		}
	}
}

// sampleCount returns the sample count of the histogram series of name
// whose labels are exactly labels; 0 when there is none.
func sampleCount(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) uint64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue series
				}
			}
			return m.GetHistogram().GetSampleCount()
		}
	}
	return 0
}

func TestSetClassStatesReplacesOldClasses(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRecorder(reg)
	r.SetClassStates([]ClassState{
		{DeviceClass: "fast", VolumeGroup: "vg0", VGSize: 100, VGFree: 60, AvailableCapacity: 50, Volumes: 2},
		{DeviceClass: "thin", VolumeGroup: "vg0", ThinPool: "pool0", ThinDataPercent: 12.5, ThinMetaPercent: 3},
	})
	r.SetClassStates([]ClassState{{DeviceClass: "fast", VolumeGroup: "vg0", VGSize: 100, VGFree: 40, AvailableCapacity: 30, Volumes: 3}})
	want := `
# HELP carve_capacity_available_bytes Capacity reported to Kubernetes through GetCapacity for a device class (free space minus spare; for thin classes bounded by the overprovision ratio).
# TYPE carve_capacity_available_bytes gauge
carve_capacity_available_bytes{device_class="fast"} 30
# HELP carve_volumes Number of carve volumes (LVs with carve's tags) of a device class; quarantined orphans (carve_quarantined_volumes) are not counted.
# TYPE carve_volumes gauge
carve_volumes{device_class="fast"} 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "carve_capacity_available_bytes", "carve_volumes"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(r.thinDataPercent); n != 0 {
		t.Errorf("thin pool gauge kept %d series of a class that is gone", n)
	}
}

func TestNilRecorderRecordsNothing(t *testing.T) {
	var r *Recorder
	r.Begin(PhaseStage, func(error) string { return "OK" }).End(nil)
	r.ObserveStep(PhaseStage, StepMkfs, "c", time.Second, nil)
	r.ObserveCommand("lvcreate", time.Second, nil)
	r.SetClassStates(nil)
	r.ObserveRefresh(time.Now(), nil)
}

// TestRuntimeRegistry: carve_build_info names the version and role, and the
// Go and process collectors are there.
func TestRuntimeRegistry(t *testing.T) {
	reg := NewRuntimeRegistry("v1.2.3", "controller")
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range fams {
		got[f.GetName()] = true
		if f.GetName() != "carve_build_info" {
			continue
		}
		m := f.GetMetric()
		if len(m) != 1 || m[0].GetGauge().GetValue() != 1 {
			t.Fatalf("carve_build_info: %v", m)
		}
		labels := map[string]string{}
		for _, l := range m[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["version"] != "v1.2.3" || labels["role"] != "controller" || !strings.HasPrefix(labels["goversion"], "go") || labels["revision"] == "" {
			t.Errorf("carve_build_info labels %v", labels)
		}
	}
	for _, name := range []string{"carve_build_info", "go_goroutines", "go_memstats_heap_inuse_bytes", "process_start_time_seconds", "process_resident_memory_bytes"} {
		if !got[name] {
			t.Errorf("no %s", name)
		}
	}
}

func TestThinPoolZeroingGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRecorder(reg)
	r.SetClassStates([]ClassState{
		{DeviceClass: "fast", VolumeGroup: "vg0"},
		{DeviceClass: "thin", VolumeGroup: "vg0", ThinPool: "pool0", ThinZeroing: true},
		{DeviceClass: "raw", VolumeGroup: "vg0", ThinPool: "pool1"},
	})
	want := `
# HELP carve_thin_pool_zeroing 1 when the pool of a thin class zeroes new blocks before their first use, 0 when it does not (a new thin volume can then read what a removed one wrote).
# TYPE carve_thin_pool_zeroing gauge
carve_thin_pool_zeroing{device_class="raw",thin_pool="pool1",volume_group="vg0"} 0
carve_thin_pool_zeroing{device_class="thin",thin_pool="pool0",volume_group="vg0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "carve_thin_pool_zeroing"); err != nil {
		t.Error(err)
	}
}
