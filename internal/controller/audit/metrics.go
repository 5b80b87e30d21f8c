package audit

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	carvemetrics "github.com/carve-csi/carve/internal/metrics"
)

// Class is a device class and its volume group, as the gauges label them.
type Class struct {
	Name, VolumeGroup string
}

// metrics are the audit's series per node, exported at zero from its first
// pass so alerts see them early, dropped when the agent disconnects.
type metrics struct {
	orphans          *prometheus.GaugeVec
	orphanBytes      *prometheus.GaugeVec
	removed          *prometheus.CounterVec
	missing          *prometheus.GaugeVec
	lastRun          *prometheus.GaugeVec
	quarantined      *prometheus.GaugeVec
	quarantinedBytes *prometheus.GaugeVec
	quarantinedTotal *prometheus.CounterVec
	abnormal         *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		orphans: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_orphaned_volumes",
			Help: "carve LVs on a node that no PersistentVolume has pointed at for longer than the grace period, by node, device class and volume group.",
		}, []string{"node", "device_class", "volume_group"}),
		orphanBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_orphaned_volume_bytes",
			Help: "Size in bytes of the orphaned carve LVs on a node, by node, device class and volume group.",
		}, []string{"node", "device_class", "volume_group"}),
		removed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_orphaned_volumes_removed_total",
			Help: "Quarantined orphans removed by the controller's audit through the node's agent after --orphan-removal-grace-period (only with --remove-orphans), by node, device class, volume group and result (success or error).",
		}, []string{"node", "device_class", "volume_group", "result"}),
		quarantined: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_quarantined_volumes",
			Help: "Orphaned carve LVs in quarantine on a node (deactivated, renamed carve-orphan-<hex>, data kept), by node, device class and volume group.",
		}, []string{"node", "device_class", "volume_group"}),
		quarantinedBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_quarantined_volume_bytes",
			Help: "Size in bytes of the orphaned carve LVs in quarantine on a node, by node, device class and volume group.",
		}, []string{"node", "device_class", "volume_group"}),
		quarantinedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_orphaned_volumes_quarantined_total",
			Help: "Orphaned carve LVs quarantined by the controller's audit through the node's agent (only with --remove-orphans), by node, device class, volume group and result (success or error).",
		}, []string{"node", "device_class", "volume_group", "result"}),
		missing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_volumes_missing",
			Help: "PersistentVolumes of carve pinned to a node whose LV has been gone from the volume group for longer than the grace period, by node and volume group.",
		}, []string{"node", "volume_group"}),
		lastRun: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_audit_timestamp_seconds",
			Help: "Unix time of the last audit of a node's LVs against the PersistentVolumes, by node and result (success or error).",
		}, []string{"node", "result"}),
	}
	m.abnormal = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "carve_volumes_abnormal",
		Help: "PersistentVolumes of carve on a node whose volume is abnormal (its node reports a health problem: LV failed or degraded, a physical volume missing, thin pool nearly full; or its LV has been missing for the grace period), by node and volume group; each turn is a VolumeAbnormal Event on the claim.",
	}, []string{"node", "volume_group"})
	reg.MustRegister(m.abnormal)
	reg.MustRegister(m.orphans, m.orphanBytes, m.removed, m.missing, m.lastRun, m.quarantined, m.quarantinedBytes, m.quarantinedTotal)
	return m
}

func (m *metrics) publish(node string, classes []Class, orphans []Orphan, missing []Missing, quarantined []Quarantined) {
	only := prometheus.Labels{"node": node}
	m.orphans.DeletePartialMatch(only)
	m.orphanBytes.DeletePartialMatch(only)
	m.missing.DeletePartialMatch(only)
	m.quarantined.DeletePartialMatch(only)
	m.quarantinedBytes.DeletePartialMatch(only)
	for _, c := range classes {
		m.orphans.WithLabelValues(node, c.Name, c.VolumeGroup)
		m.orphanBytes.WithLabelValues(node, c.Name, c.VolumeGroup)
		m.missing.WithLabelValues(node, c.VolumeGroup)
		m.removed.WithLabelValues(node, c.Name, c.VolumeGroup, "success")
		m.quarantined.WithLabelValues(node, c.Name, c.VolumeGroup)
		m.quarantinedBytes.WithLabelValues(node, c.Name, c.VolumeGroup)
		m.quarantinedTotal.WithLabelValues(node, c.Name, c.VolumeGroup, "success")
	}
	for _, q := range quarantined {
		m.quarantined.WithLabelValues(node, q.Class, q.VolumeGroup).Inc()
		m.quarantinedBytes.WithLabelValues(node, q.Class, q.VolumeGroup).Add(float64(q.Size))
	}
	for _, o := range orphans {
		m.orphans.WithLabelValues(node, o.Class, o.VolumeGroup).Inc()
		m.orphanBytes.WithLabelValues(node, o.Class, o.VolumeGroup).Add(float64(o.Size))
	}
	for _, x := range missing {
		vg, _, _ := cut(x.Handle)
		m.missing.WithLabelValues(node, vg).Inc()
	}
}

func (m *metrics) ran(node string, at time.Time, err error) {
	for _, r := range []string{"success", "error"} {
		m.lastRun.WithLabelValues(node, r)
	}
	m.lastRun.WithLabelValues(node, carvemetrics.Result(err)).Set(float64(at.UnixNano()) / 1e9)
}

func (m *metrics) publishAbnormal(node string, classes []Class, counts map[string]int) {
	m.abnormal.DeletePartialMatch(prometheus.Labels{"node": node})
	for _, c := range classes {
		m.abnormal.WithLabelValues(node, c.VolumeGroup)
	}
	for vg, n := range counts {
		m.abnormal.WithLabelValues(node, vg).Set(float64(n))
	}
}

func (m *metrics) forget(node string) {
	only := prometheus.Labels{"node": node}
	m.abnormal.DeletePartialMatch(only)
	m.orphans.DeletePartialMatch(only)
	m.orphanBytes.DeletePartialMatch(only)
	m.removed.DeletePartialMatch(only)
	m.missing.DeletePartialMatch(only)
	m.lastRun.DeletePartialMatch(only)
	m.quarantined.DeletePartialMatch(only)
	m.quarantinedBytes.DeletePartialMatch(only)
	m.quarantinedTotal.DeletePartialMatch(only)
}
