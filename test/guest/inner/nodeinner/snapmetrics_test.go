//go:build guestinner

package nodeinner

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// snapshotGauge waits (up to 2 minutes: the view is re-read every minute,
// and at once after a volume is made, which poke does) until the gauge
// name of the snapshot LV lv satisfies ok, and returns its last value.
func (e *env) snapshotGauge(name, lv string, ok func(float64) bool, poke string) float64 {
	e.t.Helper()
	e.createInClass(poke, 16*mib, blockCapability(), "thick")
	labels := map[string]string{"device_class": "thick", "volume_group": e.vg.Name, "snapshot": lv}
	deadline := time.Now().Add(2 * time.Minute)
	var last string
	for {
		ctx, cancel := e.ctx()
		ms, err := e.plugin.Scrape(ctx)
		cancel()
		if err != nil {
			last = err.Error()
		} else if v, found, err := ms.Gauge(name, labels); err != nil {
			last = err.Error()
		} else if !found {
			last = "no series"
		} else if ok(v) {
			return v
		} else {
			last = fmt.Sprint(v)
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s%v: %s after 2 minutes", name, labels, last)
		}
		time.Sleep(time.Second)
	}
}

// TestSnapshotSpaceMetrics: a thick snapshot's copy-on-write fill shows in
// carve_snapshot_cow_used_ratio as its volume is written, and its loss in
// carve_snapshot_invalid once the writes overflow it.
func TestSnapshotSpaceMetrics(t *testing.T) {
	t.Parallel()
	e := newSnapEnv(t, "snapmetrics")
	const size = 64 * mib
	id, dev := e.blockVolume("metrics-source", size, "thick")
	// 20 % of 64 MiB: 16 MiB of copy-on-write space, in extents.
	snap := e.snapshot("metrics-snap", id)
	lv := snap.GetSnapshotId()[strings.LastIndex(snap.GetSnapshotId(), "/")+1:]
	if v := e.snapshotGauge("carve_snapshot_invalid", lv, func(v float64) bool { return v == 0 }, "metrics-poke-1"); v != 0 {
		t.Fatalf("carve_snapshot_invalid of a new snapshot is %v", v)
	}
	writeDevice(t, dev, random(6*mib))
	used := e.snapshotGauge("carve_snapshot_cow_used_ratio", lv, func(v float64) bool { return v >= 0.3 }, "metrics-poke-2")
	t.Logf("after 6 MiB written: carve_snapshot_cow_used_ratio %.3f, lvs snap_percent %s", used, e.lvField(lv, "snap_percent"))
	if used >= 1 {
		t.Errorf("carve_snapshot_cow_used_ratio %v after 6 MiB written into 16 MiB of space", used)
	}
	writeDevice(t, dev, random(size))
	e.snapshotGauge("carve_snapshot_invalid", lv, func(v float64) bool { return v == 1 }, "metrics-poke-3")
	t.Logf("after the whole volume was rewritten: lv_attr %s, snap_percent %s", e.lvAttr(lv), e.lvField(lv, "snap_percent"))
}
