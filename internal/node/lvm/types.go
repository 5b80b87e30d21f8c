package lvm

import (
	"path"
	"time"
)

// VolumeGroup is one volume group as LVM reports it. Sizes are in bytes.
type VolumeGroup struct {
	Name        string
	UUID        string
	Size        uint64
	Free        uint64
	ExtentSize  uint64
	ExtentCount uint64
	FreeExtents uint64
	// MissingPVs counts PVs LVM could not find (the VG is "partial").
	MissingPVs int
	// PVCount is the number of physical volumes, missing ones included.
	PVCount int
	Tags    []string
	// MetadataAreaSize and MetadataAreaFree are of the VG's smallest metadata
	// area. Every LV adds its text to it, and when full every lvcreate fails
	// whatever the free extents. Zero when not reported.
	MetadataAreaSize uint64
	MetadataAreaFree uint64
	// PhysicalVolumes are the found PVs' paths (fullreport only). lvm2 writes
	// metadata to them with O_DIRECT and no FLUSH: a flush of each makes a
	// metadata change durable.
	PhysicalVolumes []string
}

// LVMetadataBytes bounds what one more LV takes of vg_mda_free: twice the
// text of an LV with the longest names and tags (carve's usual is about 480
// bytes: 1100 volumes fill 1 MiB).
const LVMetadataBytes = 2048

// MetadataFull tells whether the metadata area cannot take one more LV.
func (vg *VolumeGroup) MetadataFull() bool {
	return vg.MetadataAreaSize > 0 && vg.MetadataAreaFree < LVMetadataBytes
}

// VolumeType is an LV's kind, from lv_attr's first character.
type VolumeType string

// The volume types carve distinguishes.
const (
	TypeThick    VolumeType = "thick"     // linear, striped, raid, mirror
	TypeThin     VolumeType = "thin"      // a thin volume (V)
	TypeThinPool VolumeType = "thin-pool" // a thin pool (t)
	TypeSnapshot VolumeType = "snapshot"  // an old-style COW snapshot (s)
	TypeInternal VolumeType = "internal"  // pool data/metadata, raid images, ... ([..] names)
	TypeOther    VolumeType = "other"
)

// Health is an LV's health, from lv_attr's ninth character.
type Health string

// The health states of lv_attr.
const (
	HealthOK               Health = "ok"
	HealthPartial          Health = "partial"            // p: a PV is missing
	HealthRefreshNeeded    Health = "refresh-needed"     // r
	HealthMismatchesExist  Health = "mismatches-exist"   // m
	HealthWriteMostly      Health = "writemostly"        // w
	HealthReshaping        Health = "reshaping"          // s
	HealthFailed           Health = "failed"             // F
	HealthOutOfData        Health = "out-of-data"        // D (thin pool)
	HealthMetadataReadOnly Health = "metadata-read-only" // M
	HealthUnknown          Health = "unknown"            // X
)

// Attributes is lv_attr decoded into named states.
type Attributes struct {
	Type   VolumeType
	Active bool
	Open   bool
	Health Health
	// SnapshotInvalid: a copy-on-write snapshot's space ran out (lv_attr[4] 'I'
	// or 'S'); its content is gone.
	SnapshotInvalid bool
	// ActivationSkip: lv_attr[9] 'k'; thin snapshots get it by default.
	ActivationSkip bool
	// ZeroNewBlocks: a thin pool zeroes a block before first use (lv_attr[7]
	// 'z'); without it a new thin LV can read what a removed one wrote.
	ZeroNewBlocks bool
	Raw           string
}

// LogicalVolume is one LV as LVM reports it.
type LogicalVolume struct {
	Name        string
	VolumeGroup string
	UUID        string
	Size        uint64
	Tags        []string
	Attr        Attributes
	Pool        string
	Origin      string
	// Path is the device node; it exists only while the LV is active.
	Path string
	// Layout is lv_layout ("linear", "raid,raid1", "thin,sparse", ...).
	Layout string
	// Time is lv_time (to the second); zero when not reported.
	Time time.Time
	// SnapPercent is the used share of a copy-on-write snapshot's space.
	SnapPercent float64
	// ThinID is set only by Client.ThinID; reports leave it 0.
	ThinID uint64
}

// ThinPool is a thin pool with its usage.
type ThinPool struct {
	Name            string
	VolumeGroup     string
	Size            uint64
	DataPercent     float64
	MetadataPercent float64
	MetadataSize    uint64
	VirtualSize     uint64
	ThinVolumes     int
	// ZeroNewBlocks: the pool zeroes blocks before first use (LVM's default).
	ZeroNewBlocks bool
}

// Report is the state of the volume groups read with one LVM command.
type Report struct {
	VolumeGroups   []VolumeGroup
	LogicalVolumes []LogicalVolume
	ThinPools      []ThinPool
	ReadAt         time.Time
}

// LVOptions are the extra lvcreate options carve allows.
type LVOptions struct {
	Stripes    int    `json:"stripes,omitempty"`
	StripeSize uint64 `json:"stripeSize,omitempty"`
	// Mirrors is raid1's extra copies (--mirrors); 0 is none.
	Mirrors int `json:"mirrors,omitempty"`
}

// CreateRequest describes one LV to create.
type CreateRequest struct {
	VolumeGroup string
	Name        string
	Size        uint64
	Tags        []string
	// ThinPool makes a thin LV in that pool (Options must be zero).
	ThinPool string
	Options  LVOptions
}

// SnapshotRequest describes one snapshot to create.
type SnapshotRequest struct {
	VolumeGroup string
	Origin      string
	Name        string
	Tags        []string
	// CowSize makes a copy-on-write snapshot; zero a thin one.
	CowSize uint64
	// OriginLV, when set, saves reading the origin: one lvcreate.
	OriginLV *LogicalVolume
	// ActivationSkip keeps a thin snapshot inactive until activated on
	// purpose; false clears it (a volume must come up after a reboot).
	ActivationSkip bool
}

// Observer receives every lvm command's duration; err is nil on success.
type Observer interface {
	ObserveCommand(command string, duration time.Duration, err error)
}

// Device is lv's device node: the reported path, else <devDir>/<vg>/<lv>.
func (lv *LogicalVolume) Device(devDir string) string {
	if lv.Path != "" {
		return lv.Path
	}
	return path.Join(devDir, lv.VolumeGroup, lv.Name)
}
