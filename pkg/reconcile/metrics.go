package reconcile

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	carvemetrics "github.com/carve-csi/carve/pkg/metrics"
)

// Class is a device class and its volume group, as the gauges label them.
type Class struct {
	Name, VolumeGroup string
}

// metrics are the audit's gauges and counters; every one of them is
// exported (at zero) from the start, so that a dashboard and an alert see
// them before the first finding.
type metrics struct {
	orphans     *prometheus.GaugeVec
	orphanBytes *prometheus.GaugeVec
	removed     *prometheus.CounterVec
	missing     *prometheus.GaugeVec
	lastRun     *prometheus.GaugeVec
	classes     []Class
}

func newMetrics(reg prometheus.Registerer, classes []Class) *metrics {
	m := &metrics{
		orphans: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_orphaned_volumes",
			Help: "carve LVs on this node that no PersistentVolume has pointed at for longer than the grace period, by device class and volume group.",
		}, []string{"device_class", "volume_group"}),
		orphanBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_orphaned_volume_bytes",
			Help: "Size in bytes of the orphaned carve LVs on this node, by device class and volume group.",
		}, []string{"device_class", "volume_group"}),
		removed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_orphaned_volumes_removed_total",
			Help: "Orphaned carve LVs removed by this node's plugin (only with --remove-orphans), by device class, volume group and result (success or error).",
		}, []string{"device_class", "volume_group", "result"}),
		missing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_volumes_missing",
			Help: "PersistentVolumes of carve pinned to this node whose LV has been gone from the volume group for longer than the grace period, by volume group.",
		}, []string{"volume_group"}),
		lastRun: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_audit_timestamp_seconds",
			Help: "Unix time of the last audit of this node's LVs against the PersistentVolumes, by result (success or error); 0 until the first.",
		}, []string{"result"}),
		classes: classes,
	}
	reg.MustRegister(m.orphans, m.orphanBytes, m.removed, m.missing, m.lastRun)
	for _, r := range []string{"success", "error"} {
		m.lastRun.WithLabelValues(r)
	}
	m.publish(nil, nil)
	return m
}

// publish replaces the gauges with one pass's findings; the configured
// classes and their volume groups show zero when they have none.
func (m *metrics) publish(orphans []Orphan, missing []Missing) {
	m.orphans.Reset()
	m.orphanBytes.Reset()
	m.missing.Reset()
	for _, c := range m.classes {
		m.orphans.WithLabelValues(c.Name, c.VolumeGroup)
		m.orphanBytes.WithLabelValues(c.Name, c.VolumeGroup)
		m.missing.WithLabelValues(c.VolumeGroup)
		m.removed.WithLabelValues(c.Name, c.VolumeGroup, "success")
	}
	for _, o := range orphans {
		m.orphans.WithLabelValues(o.Class, o.VolumeGroup).Inc()
		m.orphanBytes.WithLabelValues(o.Class, o.VolumeGroup).Add(float64(o.Size))
	}
	for _, x := range missing {
		vg, _, _ := cut(x.Handle)
		m.missing.WithLabelValues(vg).Inc()
	}
}

func (m *metrics) ran(at time.Time, err error) {
	m.lastRun.WithLabelValues(carvemetrics.Result(err)).Set(float64(at.UnixNano()) / 1e9)
}
