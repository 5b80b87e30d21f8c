// Package metrics defines carve's own Prometheus metrics (carve_*), beside
// csi-lib-utils' csi_plugin_operations_seconds.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Phase names: one per CSI operation carve times.
const (
	PhaseCreate    = "create"
	PhaseDelete    = "delete"
	PhaseStage     = "stage"
	PhasePublish   = "publish"
	PhaseUnpublish = "unpublish"
	PhaseUnstage   = "unstage"
	PhaseExpand    = "expand"
	PhaseCapacity  = "capacity"
	// PhaseSnapshot is CreateSnapshot, PhaseSnapshotDelete DeleteSnapshot.
	PhaseSnapshot       = "snapshot"
	PhaseSnapshotDelete = "snapshot_delete"
	// PhaseRestore and PhaseClone are CreateVolume from a snapshot or volume.
	PhaseRestore = "restore"
	PhaseClone   = "clone"
)

// Step names: the parts of a phase that take time.
const (
	StepLVCreate       = "lvcreate"
	StepLVRemove       = "lvremove"
	StepErase          = "erase"
	StepLVExtend       = "lvextend"
	StepSignatureCheck = "signature_check"
	StepMkfs           = "mkfs"
	StepMount          = "mount"
	StepBindMount      = "bind_mount"
	StepUnmount        = "unmount"
	StepFilesystemGrow = "fs_grow"
	// StepCopy copies data into a new thick LV (restore, clone).
	StepCopy = "copy"
	// StepLUKSFormat, StepLUKSOpen and StepCryptoErase time an encrypted volume's LUKS steps.
	StepLUKSFormat  = "luks_format"
	StepLUKSOpen    = "luks_open"
	StepCryptoErase = "crypto_erase"
)

// Buckets from 1 ms to about 2 minutes, as mkfs of a large volume takes a minute.
var durationBuckets = prometheus.ExponentialBuckets(0.001, 2, 18)

// Recorder holds carve's metrics. A nil *Recorder records nothing.
type Recorder struct {
	phaseDuration *prometheus.HistogramVec
	stepDuration  *prometheus.HistogramVec
	lvmDuration   *prometheus.HistogramVec
	copiedBytes   *prometheus.CounterVec

	vgSize            *prometheus.GaugeVec
	vgFree            *prometheus.GaugeVec
	capacity          *prometheus.GaugeVec
	thinDataPercent   *prometheus.GaugeVec
	thinMetaPercent   *prometheus.GaugeVec
	thinZeroing       *prometheus.GaugeVec
	mdaSize, mdaFree  *prometheus.GaugeVec
	volumes           *prometheus.GaugeVec
	lastRefreshResult *prometheus.GaugeVec

	snapshotCOWUsed *prometheus.GaugeVec
	snapshotInvalid *prometheus.GaugeVec

	classAvailable *prometheus.GaugeVec

	ioLimitsSupported   *prometheus.GaugeVec
	ioLimitApplications *prometheus.CounterVec
	luksOpens           *prometheus.CounterVec
}

// NewRecorder creates the metrics and registers them with reg.
func NewRecorder(reg prometheus.Registerer) *Recorder {
	r := &Recorder{
		phaseDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "carve_phase_duration_seconds",
			Help:    "Duration of a CSI phase (create, delete, stage, publish, unpublish, unstage, expand, capacity, snapshot, snapshot_delete, restore, clone) by device class and result (a gRPC code name).",
			Buckets: durationBuckets,
		}, []string{"phase", "device_class", "result"}),
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "carve_step_duration_seconds",
			Help:    "Duration of one step of a phase (lvcreate, erase, signature_check, mkfs, mount, bind_mount, lvextend, fs_grow, lvremove, unmount, copy, luks_format, luks_open, crypto_erase) by device class and result (success or error).",
			Buckets: durationBuckets,
		}, []string{"phase", "step", "device_class", "result"}),
		lvmDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "carve_lvm_command_duration_seconds",
			Help:    "Duration of an lvm2 command by command (lvcreate, lvremove, lvextend, fullreport, ...) and result (success or error).",
			Buckets: durationBuckets,
		}, []string{"command", "result"}),
		copiedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "carve_copy_bytes_total",
			Help: "Bytes of the source copied into new volumes by restores and clones (the copy step; zeros a copy into a thin class skips count too), by phase (restore, clone) and device class.",
		}, []string{"phase", "device_class"}),
		vgSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_volume_group_size_bytes",
			Help: "Size of the volume group of a device class.",
		}, []string{"device_class", "volume_group"}),
		vgFree: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_volume_group_free_bytes",
			Help: "Free space of the volume group of a device class, as LVM reports it (spare included).",
		}, []string{"device_class", "volume_group"}),
		capacity: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_capacity_available_bytes",
			Help: "Capacity reported to Kubernetes through GetCapacity for a device class (free space minus spare; for thin classes bounded by the overprovision ratio).",
		}, []string{"device_class"}),
		thinDataPercent: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_thin_pool_data_percent",
			Help: "Used share (0-100) of the data of a thin class's pool.",
		}, []string{"device_class", "volume_group", "thin_pool"}),
		thinMetaPercent: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_thin_pool_metadata_percent",
			Help: "Used share (0-100) of the metadata of a thin class's pool.",
		}, []string{"device_class", "volume_group", "thin_pool"}),
		mdaSize: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_volume_group_metadata_area_bytes",
			Help: "Size of the smallest LVM metadata area of the volume group of a device class (vg_mda_size).",
		}, []string{"device_class", "volume_group"}),
		mdaFree: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_volume_group_metadata_free_bytes",
			Help: "Room left for more LVM metadata in the volume group of a device class (vg_mda_free); each volume takes about 500 bytes, and the class has no capacity below 2048.",
		}, []string{"device_class", "volume_group"}),
		thinZeroing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_thin_pool_zeroing",
			Help: "1 when the pool of a thin class zeroes new blocks before their first use, 0 when it does not (a new thin volume can then read what a removed one wrote).",
		}, []string{"device_class", "volume_group", "thin_pool"}),
		volumes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_volumes",
			Help: "Number of carve volumes (LVs with carve's tags) of a device class; quarantined orphans (carve_quarantined_volumes) are not counted.",
		}, []string{"device_class"}),
		lastRefreshResult: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "carve_state_refresh_timestamp_seconds",
			Help: "Unix time of the last refresh of the in-memory volume-group view, by result (success or error).",
		}, []string{"result"}),
	}
	r.snapshotCOWUsed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "carve_snapshot_cow_used_ratio",
		Help: "Used share (0-1) of the copy-on-write space of a thick snapshot (lvs snap_percent / 100); at 1 the snapshot is lost.",
	}, snapshotLabels)
	r.snapshotInvalid = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "carve_snapshot_invalid",
		Help: "1 when a thick snapshot ran out of its copy-on-write space (or LVM marks it invalid): its content is lost and no restore reads it; 0 otherwise.",
	}, snapshotLabels)
	r.classAvailable = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "carve_device_class_available",
		Help: "1 when a device class of this node can take new volumes; 0 when it cannot, with reason the code of why (vg-missing, vg-unreadable, pv-missing, thin-pool-missing, thin-pool-unusable, metadata-full, lvm-error, lvm-timeout, not-loaded). One series per configured class.",
	}, []string{"device_class", "volume_group", "reason"})
	r.registerIOLimits(reg)
	r.registerLUKS(reg)
	reg.MustRegister(r.snapshotCOWUsed, r.snapshotInvalid, r.classAvailable)
	reg.MustRegister(r.phaseDuration, r.stepDuration, r.lvmDuration, r.copiedBytes, r.vgSize, r.vgFree,
		r.capacity, r.thinDataPercent, r.thinMetaPercent, r.thinZeroing, r.mdaSize, r.mdaFree, r.volumes, r.lastRefreshResult)
	return r
}

func (r *Recorder) observePhase(phase, deviceClass string, d time.Duration, result string) {
	if r == nil {
		return
	}
	r.phaseDuration.WithLabelValues(phase, deviceClass, result).Observe(d.Seconds())
}

func (r *Recorder) ObserveStep(phase, step, deviceClass string, d time.Duration, err error) {
	if r == nil {
		return
	}
	r.stepDuration.WithLabelValues(phase, step, deviceClass, Result(err)).Observe(d.Seconds())
}

func (r *Recorder) AddCopiedBytes(phase, deviceClass string, n uint64) {
	if r == nil {
		return
	}
	r.copiedBytes.WithLabelValues(phase, deviceClass).Add(float64(n))
}

// ObserveCommand records one lvm command; Recorder is an lvm.Observer.
func (r *Recorder) ObserveCommand(command string, d time.Duration, err error) {
	if r == nil {
		return
	}
	r.lvmDuration.WithLabelValues(command, Result(err)).Observe(d.Seconds())
}

// ClassState is what the gauges show for one device class.
type ClassState struct {
	DeviceClass       string
	VolumeGroup       string
	VGSize, VGFree    uint64
	AvailableCapacity uint64
	Volumes           int
	// ThinPool is empty for thick classes, whose percents are not read.
	ThinPool                         string
	ThinDataPercent, ThinMetaPercent float64
	ThinZeroing                      bool
	// MetadataAreaSize and MetadataAreaFree are the VG's; no series when the size is 0.
	MetadataAreaSize, MetadataAreaFree uint64
}

// SetClassStates replaces the per-class gauges, dropping removed classes.
func (r *Recorder) SetClassStates(states []ClassState) {
	if r == nil {
		return
	}
	for _, g := range []*prometheus.GaugeVec{r.vgSize, r.vgFree, r.capacity, r.thinDataPercent, r.thinMetaPercent, r.thinZeroing, r.mdaSize, r.mdaFree, r.volumes} {
		g.Reset()
	}
	for _, s := range states {
		r.vgSize.WithLabelValues(s.DeviceClass, s.VolumeGroup).Set(float64(s.VGSize))
		r.vgFree.WithLabelValues(s.DeviceClass, s.VolumeGroup).Set(float64(s.VGFree))
		r.capacity.WithLabelValues(s.DeviceClass).Set(float64(s.AvailableCapacity))
		r.volumes.WithLabelValues(s.DeviceClass).Set(float64(s.Volumes))
		if s.MetadataAreaSize > 0 {
			r.mdaSize.WithLabelValues(s.DeviceClass, s.VolumeGroup).Set(float64(s.MetadataAreaSize))
			r.mdaFree.WithLabelValues(s.DeviceClass, s.VolumeGroup).Set(float64(s.MetadataAreaFree))
		}
		// At 0 from the start, so a rate is defined before the first copy.
		r.copiedBytes.WithLabelValues(PhaseRestore, s.DeviceClass)
		r.copiedBytes.WithLabelValues(PhaseClone, s.DeviceClass)
		if s.ThinPool != "" {
			r.thinDataPercent.WithLabelValues(s.DeviceClass, s.VolumeGroup, s.ThinPool).Set(s.ThinDataPercent)
			r.thinMetaPercent.WithLabelValues(s.DeviceClass, s.VolumeGroup, s.ThinPool).Set(s.ThinMetaPercent)
			zeroing := 0.0
			if s.ThinZeroing {
				zeroing = 1
			}
			r.thinZeroing.WithLabelValues(s.DeviceClass, s.VolumeGroup, s.ThinPool).Set(zeroing)
		}
	}
}

// ClassAvailability is whether a device class can take new volumes.
type ClassAvailability struct {
	DeviceClass, VolumeGroup string
	// Reason is "" when available, else vgview's reason code.
	Reason string
}

// SetClassAvailability replaces carve_device_class_available, one series per class.
func (r *Recorder) SetClassAvailability(states []ClassAvailability) {
	if r == nil {
		return
	}
	r.classAvailable.Reset()
	for _, s := range states {
		available := 0.0
		if s.Reason == "" {
			available = 1
		}
		r.classAvailable.WithLabelValues(s.DeviceClass, s.VolumeGroup, s.Reason).Set(available)
	}
}

// snapshotLabels: one series per thick snapshot, bounded by the VolumeSnapshots.
var snapshotLabels = []string{"device_class", "volume_group", "snapshot"}

// SnapshotState is what the gauges show for one thick snapshot.
type SnapshotState struct {
	DeviceClass string
	VolumeGroup string
	// Snapshot is the snapshot's LV name.
	Snapshot string
	// COWUsedRatio is the used share of its copy-on-write space, 0-1.
	COWUsedRatio float64
	Invalid      bool
}

// SetSnapshotStates replaces the per-snapshot gauges.
func (r *Recorder) SetSnapshotStates(states []SnapshotState) {
	if r == nil {
		return
	}
	r.snapshotCOWUsed.Reset()
	r.snapshotInvalid.Reset()
	for _, s := range states {
		r.snapshotCOWUsed.WithLabelValues(s.DeviceClass, s.VolumeGroup, s.Snapshot).Set(s.COWUsedRatio)
		invalid := 0.0
		if s.Invalid {
			invalid = 1
		}
		r.snapshotInvalid.WithLabelValues(s.DeviceClass, s.VolumeGroup, s.Snapshot).Set(invalid)
	}
}

func (r *Recorder) ObserveRefresh(at time.Time, err error) {
	if r == nil {
		return
	}
	r.lastRefreshResult.WithLabelValues(Result(err)).Set(float64(at.UnixNano()) / 1e9)
}

// Result is "success" for nil, else "error".
func Result(err error) string {
	if err != nil {
		return "error"
	}
	return "success"
}

// SetIOLimitSupport records reason "ok" or why IO limits cannot apply.
func (r *Recorder) SetIOLimitSupport(reason string) {
	if r == nil {
		return
	}
	r.ioLimitsSupported.Reset()
	v := 0.0
	if reason == "ok" {
		v = 1
	}
	r.ioLimitsSupported.WithLabelValues(reason).Set(v)
}

func (r *Recorder) CountIOLimitApplication(result string) {
	if r == nil {
		return
	}
	r.ioLimitApplications.WithLabelValues(result).Inc()
}

// IOLimitApplications is the counter of one result, for tests.
func (r *Recorder) IOLimitApplications(result string) prometheus.Counter {
	return r.ioLimitApplications.WithLabelValues(result)
}

// IOLimitsSupported is the gauge of one reason, for tests.
func (r *Recorder) IOLimitsSupported(reason string) prometheus.Gauge {
	return r.ioLimitsSupported.WithLabelValues(reason)
}

// LUKSOpenResults are carve_encrypted_volume_opens_total's results (docs/metrics.md).
var LUKSOpenResults = []string{"opened", "refused", "wrong_key", "no_header", "unavailable", "error"}

func (r *Recorder) CountLUKSOpen(result string) {
	if r == nil {
		return
	}
	r.luksOpens.WithLabelValues(result).Inc()
}

// LUKSOpens is the counter of one result, for tests.
func (r *Recorder) LUKSOpens(result string) prometheus.Counter {
	return r.luksOpens.WithLabelValues(result)
}

func (r *Recorder) registerLUKS(reg prometheus.Registerer) {
	r.luksOpens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "carve_encrypted_volume_opens_total",
		Help: "Opens of encrypted volumes by NodeStageVolume, by result: opened, refused (carve controller released no key), wrong_key, no_header (an LV marked encrypted without its LUKS2 header or carve's token), unavailable (no controller connected), error.",
	}, []string{"result"})
	for _, result := range LUKSOpenResults {
		r.luksOpens.WithLabelValues(result)
	}
	reg.MustRegister(r.luksOpens)
}

func (r *Recorder) registerIOLimits(reg prometheus.Registerer) {
	r.ioLimitsSupported = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "carve_io_limits_supported",
		Help: "1 when this node can apply volumes' IO limits to pods (cgroup v2 with the io controller); 0 when it cannot, with reason no-cgroup-v2, no-io-controller or disabled (no --cgroup-root). One series.",
	}, []string{"reason"})
	r.ioLimitApplications = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "carve_io_limit_applications_total",
		Help: "IO limits written into a pod's io.max for a volume (at publish, at a ControllerModifyVolume, at the agent's start), by result: ok, unsupported (the node cannot apply limits), no-pod (the pod's cgroup was not found), error.",
	}, []string{"result"})
	// Every result from the start, so an alert sees the first failure.
	for _, result := range IOLimitResults {
		r.ioLimitApplications.WithLabelValues(result)
	}
	reg.MustRegister(r.ioLimitsSupported, r.ioLimitApplications)
}

// IOLimitResults are carve_io_limit_applications_total's results.
var IOLimitResults = []string{"ok", "unsupported", "no-pod", "error"}
