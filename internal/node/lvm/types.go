package lvm

import (
	"path"
	"time"
)

// VolumeGroup is one volume group as LVM reports it. Sizes are in bytes.
type VolumeGroup struct {
	Name       string
	UUID       string
	Size       uint64
	Free       uint64
	ExtentSize uint64
	// ExtentCount and FreeExtents are the sizes above in extents.
	ExtentCount uint64
	FreeExtents uint64
	// MissingPVs counts physical volumes that LVM could not find (a VG with
	// missing PVs is "partial").
	MissingPVs int
	// PVCount is the number of physical volumes, missing ones included.
	PVCount int
	Tags    []string
	// MetadataAreaSize and MetadataAreaFree are the size and free space of
	// the VG's smallest metadata area (vg_mda_size, vg_mda_free), in
	// bytes. Every LV adds its text to the VG metadata, and when the text
	// no longer fits, every lvcreate fails whatever the free extents: the
	// area bounds how many LVs the VG holds. Zero when not reported.
	MetadataAreaSize uint64
	MetadataAreaFree uint64
	// PhysicalVolumes are the device paths of the PVs LVM found (a
	// missing one is left out), as fullreport reads them; nil from other
	// reads. lvm2 writes the VG's metadata to them with O_DIRECT and no
	// FLUSH: a flush of each makes a metadata change durable.
	PhysicalVolumes []string
}

// LVMetadataBytes bounds the bytes of vg_mda_free one more LV takes: twice the
// text of an LV whose names and tags are as long as LVM allows (with carve's
// usual tags about 480 bytes: 1100 volumes fill a 1 MiB area).
const LVMetadataBytes = 2048

// MetadataFull tells whether the VG's metadata area cannot take one more
// LV. A VG reported without metadata figures (size 0) is never full.
func (vg *VolumeGroup) MetadataFull() bool {
	return vg.MetadataAreaSize > 0 && vg.MetadataAreaFree < LVMetadataBytes
}

// VolumeType tells what kind of logical volume an LV is, decoded from the
// first character of lv_attr (and the segment type).
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

// Health is the health of an LV, decoded from lv_attr's ninth character.
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
	// SnapshotInvalid is set for an old-style (copy-on-write) snapshot
	// whose copy-on-write space ran out (lv_attr's fifth character 'I' or
	// 'S'): its content is gone.
	SnapshotInvalid bool
	// ActivationSkip is set when LVM skips the LV on ordinary activation
	// (lv_attr's tenth character, 'k'); thin snapshots get it by default.
	ActivationSkip bool
	// ZeroNewBlocks is set on a thin pool that zeroes a data block before
	// its first use (lv_attr's eighth character, 'z'): without it, a new
	// thin LV can read what a removed one wrote.
	ZeroNewBlocks bool
	// Raw is lv_attr as LVM printed it, for logs.
	Raw string
}

// LogicalVolume is one LV as LVM reports it.
type LogicalVolume struct {
	Name        string
	VolumeGroup string
	UUID        string
	// Size is the LV's (virtual, for thin LVs) size in bytes.
	Size uint64
	Tags []string
	Attr Attributes
	// Pool is the thin pool of a thin LV, empty otherwise.
	Pool string
	// Origin is the origin LV of a snapshot, empty otherwise.
	Origin string
	// Path is the device node (/dev/<vg>/<lv>); it exists only while the LV
	// is active.
	Path string
	// Layout is LVM's lv_layout ("linear", "striped", "raid,raid1",
	// "thin,sparse", "thin,pool", ...).
	Layout string
	// Time is when LVM created the LV (lv_time, to the second); zero when
	// the report did not carry it.
	Time time.Time
	// SnapPercent is the used share (0-100) of an old-style snapshot's
	// copy-on-write space; 0 for other LVs.
	SnapPercent float64
	// ThinID is a thin LV's thin device ID when its reader asked LVM for
	// it (Client.ThinID); reports leave it 0.
	ThinID uint64
}

// ThinPool is a thin pool with its usage.
type ThinPool struct {
	Name        string
	VolumeGroup string
	// Size is the pool's data size in bytes.
	Size uint64
	// DataPercent and MetadataPercent are the used share, 0-100.
	DataPercent     float64
	MetadataPercent float64
	// MetadataSize is the size of the pool's metadata LV in bytes.
	MetadataSize uint64
	// VirtualSize is the sum of the sizes of the thin LVs in the pool.
	VirtualSize uint64
	// ThinVolumes counts the thin LVs in the pool.
	ThinVolumes int
	// ZeroNewBlocks tells whether the pool zeroes data blocks before their
	// first use (lvcreate --zero y, LVM's default for pools).
	ZeroNewBlocks bool
}

// Report is the state of the volume groups read with one LVM command.
type Report struct {
	VolumeGroups []VolumeGroup
	// LogicalVolumes holds every LV, thin pools and internal LVs included.
	LogicalVolumes []LogicalVolume
	ThinPools      []ThinPool
	// ReadAt is when the report was taken.
	ReadAt time.Time
}

// LVOptions are the extra lvcreate options carve allows (the allow-list).
// The zero value means LVM's defaults.
type LVOptions struct {
	// Stripes is lvcreate --stripes; 0 or 1 means no striping.
	Stripes int `json:"stripes,omitempty"`
	// StripeSize is lvcreate --stripesize in bytes (a power of two); needs
	// Stripes > 1.
	StripeSize uint64 `json:"stripeSize,omitempty"`
	// Mirrors is the number of extra copies of a raid1 LV (lvcreate --type
	// raid1 --mirrors N); 0 means no mirroring.
	Mirrors int `json:"mirrors,omitempty"`
}

// CreateRequest describes one LV to create.
type CreateRequest struct {
	VolumeGroup string
	Name        string
	// Size in bytes; rounded up to whole extents.
	Size uint64
	Tags []string
	// ThinPool, when set, makes a thin LV in that pool (Options must be
	// zero then).
	ThinPool string
	Options  LVOptions
}

// SnapshotRequest describes one snapshot to create.
type SnapshotRequest struct {
	VolumeGroup string
	// Origin is the LV to snapshot.
	Origin string
	Name   string
	Tags   []string
	// CowSize, when set, makes an old-style copy-on-write snapshot of a
	// thick origin with that much space for changed blocks (rounded up to
	// extents); zero makes a thin snapshot of a thin origin.
	CowSize uint64
	// OriginLV, when set, is the origin as the caller last read it (its
	// type, size, pool and layout): CreateSnapshot then does not read it
	// again, and the snapshot costs one lvcreate.
	OriginLV *LogicalVolume
	// ActivationSkip keeps LVM's activation-skip flag on a thin snapshot,
	// so that it stays inactive until activated on purpose; false clears
	// it (a snapshot used as a volume must come up after a reboot).
	ActivationSkip bool
}

// Observer receives the duration of every LVM command that ran. command is
// the lvm subcommand ("lvcreate", "fullreport", ...); err is nil on success.
type Observer interface {
	ObserveCommand(command string, duration time.Duration, err error)
}

// Device is lv's device node: the path LVM reported, else the link LVM
// makes under devDir (<devDir>/<volume group>/<LV name>).
func (lv *LogicalVolume) Device(devDir string) string {
	if lv.Path != "" {
		return lv.Path
	}
	return path.Join(devDir, lv.VolumeGroup, lv.Name)
}
