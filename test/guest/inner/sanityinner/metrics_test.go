//go:build guestinner

package sanityinner

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/carve-csi/carve/test/harness/lvmtest"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// phasesRun are the carve phases a sanity run exercises: it creates,
// deletes, stages, publishes, unpublishes, unstages and node-expands
// volumes, asks for capacity, takes and deletes snapshots, restores them
// and clones volumes.
var phasesRun = []string{"create", "delete", "stage", "publish", "unpublish", "unstage", "expand", "capacity",
	"snapshot", "snapshot_delete", "restore", "clone"}

// stepsRun are the steps of those phases that must have run at least once
// (mkfs: sanity stages fresh volumes).
var stepsRun = []struct{ phase, step string }{
	{"create", "lvcreate"},
	{"delete", "lvremove"},
	{"stage", "signature_check"},
	{"stage", "mkfs"},
	{"stage", "mount"},
	{"publish", "bind_mount"},
	{"expand", "lvextend"},
	{"expand", "fs_grow"},
	{"snapshot", "lvcreate"},
	{"snapshot_delete", "lvremove"},
	{"restore", "lvcreate"},
	{"clone", "lvcreate"},
}

// copyStepsRun are the steps a thick default class adds: its restores and
// clones copy the data.
var copyStepsRun = []struct{ phase, step string }{
	{"restore", "copy"},
	{"clone", "copy"},
}

// methodsRun are gRPC methods csi_plugin_operations_seconds must count.
var methodsRun = []string{
	"/csi.v1.Identity/Probe",
	"/csi.v1.Identity/GetPluginInfo",
	"/csi.v1.Controller/CreateVolume",
	"/csi.v1.Controller/DeleteVolume",
	"/csi.v1.Controller/GetCapacity",
	"/csi.v1.Controller/ListVolumes",
	"/csi.v1.Node/NodeStageVolume",
	"/csi.v1.Node/NodePublishVolume",
	"/csi.v1.Node/NodeUnpublishVolume",
	"/csi.v1.Node/NodeUnstageVolume",
	"/csi.v1.Node/NodeExpandVolume",
	"/csi.v1.Node/NodeGetVolumeStats",
	"/csi.v1.Controller/CreateSnapshot",
	"/csi.v1.Controller/DeleteSnapshot",
	"/csi.v1.Controller/ListSnapshots",
	"/csi.v1.Controller/GetSnapshot",
}

// checkMetrics scrapes the plugin after a sanity run: every phase, step and
// method that ran has a non-zero count, and the volume-group gauges match
// `vgs` read at the same moment.
func checkMetrics(ctx context.Context, t *testing.T, p *plugintest.Plugin, vg *lvmtest.LoopVG, defaultClass string) {
	ms, err := p.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, phase := range phasesRun {
		all := ms.HistogramCount("carve_phase_duration_seconds", map[string]string{"phase": phase})
		ok := ms.HistogramCount("carve_phase_duration_seconds", map[string]string{"phase": phase, "result": "OK"})
		t.Logf("carve_phase_duration_seconds{phase=%q}: %d observations, %d OK", phase, all, ok)
		if ok == 0 {
			t.Errorf("carve_phase_duration_seconds has no successful %s phase after sanity ran it (%d in all)", phase, all)
		}
	}
	steps := stepsRun
	if defaultClass == "thick" {
		steps = append(slices.Clone(steps), copyStepsRun...)
		for _, phase := range []string{"restore", "clone"} {
			n, ok, err := ms.Counter("carve_copy_bytes_total", map[string]string{"phase": phase, "device_class": defaultClass})
			if err != nil || !ok || n <= 0 {
				t.Errorf("carve_copy_bytes_total{phase=%q,device_class=%q} = %v (found %v, %v) after sanity copied volumes", phase, defaultClass, n, ok, err)
			}
		}
	}
	for _, s := range steps {
		n := ms.HistogramCount("carve_step_duration_seconds", map[string]string{"phase": s.phase, "step": s.step})
		if n == 0 {
			t.Errorf("carve_step_duration_seconds{phase=%q,step=%q} counted nothing after sanity", s.phase, s.step)
		}
	}
	methods := ms.LabelValues("csi_plugin_operations_seconds", "method_name", nil)
	for _, m := range methodsRun {
		n := ms.HistogramCount("csi_plugin_operations_seconds", map[string]string{"method_name": m})
		if n == 0 {
			t.Errorf("csi_plugin_operations_seconds{method_name=%q} counted nothing; methods seen: %v", m, methods)
		}
	}
	for _, cmd := range []string{"lvcreate", "lvremove", "lvextend"} {
		if n := ms.HistogramCount("carve_lvm_command_duration_seconds", map[string]string{"command": cmd}); n == 0 {
			t.Errorf("carve_lvm_command_duration_seconds{command=%q} counted nothing", cmd)
		}
	}

	// A create and a delete refresh the in-memory view; then the gauges
	// must equal what vgs says. The periodic refresh may land in between,
	// which changes nothing when nobody else touches the VG; retry a few
	// times anyway in case a refresh was in flight.
	mutate(ctx, t, p, vg, defaultClass)
	var last string
	for attempt := 0; attempt < 10; attempt++ {
		if attempt > 0 {
			time.Sleep(time.Second)
		}
		got, err := plugintest.ReadVG(ctx, vg)
		if err != nil {
			t.Fatal(err)
		}
		ms, err = p.Scrape(ctx)
		if err != nil {
			t.Fatal(err)
		}
		last = compareVG(ms, vg.Name, got)
		if last == "" {
			t.Logf("VG gauges match vgs: size %d, free %d", got.Size, got.Free)
			break
		}
	}
	if last != "" {
		t.Errorf("VG gauges do not match vgs after 10 tries: %s", last)
	}
	checkCapacityGauge(ctx, t, p, ms, defaultClass)
}

// compareVG returns "" when every class on vg reports vg's size and free
// space, else what differs.
func compareVG(ms plugintest.Metrics, vg string, want plugintest.VGState) string {
	classes := ms.LabelValues("carve_volume_group_size_bytes", "device_class", map[string]string{"volume_group": vg})
	if len(classes) == 0 {
		return fmt.Sprintf("no carve_volume_group_size_bytes series for volume_group=%q", vg)
	}
	var diffs []string
	for _, c := range classes {
		labels := map[string]string{"device_class": c, "volume_group": vg}
		size, ok1, err1 := ms.Gauge("carve_volume_group_size_bytes", labels)
		free, ok2, err2 := ms.Gauge("carve_volume_group_free_bytes", labels)
		switch {
		case err1 != nil || err2 != nil:
			diffs = append(diffs, fmt.Sprintf("class %s: %v %v", c, err1, err2))
		case !ok1 || !ok2:
			diffs = append(diffs, fmt.Sprintf("class %s: size or free gauge missing", c))
		case uint64(size) != want.Size || uint64(free) != want.Free:
			diffs = append(diffs, fmt.Sprintf("class %s: gauges size %.0f free %.0f, vgs size %d free %d", c, size, free, want.Size, want.Free))
		}
	}
	return strings.Join(diffs, "; ")
}

// mutate creates and deletes one volume through the plugin, checking on the
// way that a request naming no class got an LV of the default class (thin:
// in pool0, as sanity's volumes were).
func mutate(ctx context.Context, t *testing.T, p *plugintest.Plugin, vg *lvmtest.LoopVG, defaultClass string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cc := csi.NewControllerClient(p.Conn)
	vol, err := cc.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               "metrics-refresh",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: volumeSize},
		VolumeCapabilities: []*csi.VolumeCapability{plugintest.MountCapability("ext4")},
	})
	if err != nil {
		t.Fatalf("CreateVolume: %v", err)
	}
	_, lv, _ := strings.Cut(vol.GetVolume().GetVolumeId(), "/")
	pool, err := plugintest.ThinPoolOf(ctx, vg, lv)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"thin": "pool0", "thick": ""}[defaultClass]; pool != want {
		t.Errorf("a volume of the default class %s has thin pool %q, want %q", defaultClass, pool, want)
	}
	if _, err := cc.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: vol.GetVolume().GetVolumeId()}); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
}

// checkCapacityGauge compares carve_capacity_available_bytes with what
// GetCapacity answers for the default class.
func checkCapacityGauge(ctx context.Context, t *testing.T, p *plugintest.Plugin, ms plugintest.Metrics, class string) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rsp, err := csi.NewControllerClient(p.Conn).GetCapacity(ctx, &csi.GetCapacityRequest{
		VolumeCapabilities: []*csi.VolumeCapability{plugintest.MountCapability("ext4")},
		Parameters:         map[string]string{"carve.dev/device-class": class},
		AccessibleTopology: &csi.Topology{Segments: map[string]string{"topology.carve.dev/node": nodeName}},
	})
	if err != nil {
		t.Fatalf("GetCapacity: %v", err)
	}
	got, ok, err := ms.Gauge("carve_capacity_available_bytes", map[string]string{"device_class": class})
	if err != nil || !ok {
		t.Fatalf("carve_capacity_available_bytes{device_class=%q}: found %t, %v", class, ok, err)
	}
	if int64(got) != rsp.GetAvailableCapacity() {
		t.Errorf("carve_capacity_available_bytes{device_class=%q} = %.0f, GetCapacity says %d", class, got, rsp.GetAvailableCapacity())
	}
	if rsp.GetAvailableCapacity() <= 0 || rsp.GetMaximumVolumeSize() == nil {
		t.Errorf("GetCapacity for %s: available %d, maximum_volume_size %v; want both set on an almost empty VG",
			class, rsp.GetAvailableCapacity(), rsp.GetMaximumVolumeSize())
	}
}
