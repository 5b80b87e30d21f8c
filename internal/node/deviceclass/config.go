// Package deviceclass reads carve's device-class file: which volume groups (and
// thin pools) StorageClasses can ask for, and how much of each to keep free.
package deviceclass

import (
	"slices"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/internal/node/lvm"
)

// Config is the device-class file.
type Config struct {
	DeviceClasses []DeviceClass `json:"deviceClasses"`
}

// DeviceClass is one kind of volume a StorageClass can ask for with the
// carve.dev/device-class parameter.
type DeviceClass struct {
	// Name is what StorageClasses name; a DNS-1123 label.
	Name string `json:"name"`
	// VolumeGroup holds this class's LVs; it must exist at start-up.
	VolumeGroup string `json:"volumeGroup"`
	// Default marks the class used when a StorageClass names none; at most
	// one class is the default.
	Default bool `json:"default,omitempty"`
	// Spare is kept free: never given to volumes, never reported as capacity.
	Spare *resource.Quantity `json:"spare,omitempty"`
	// ThinPool makes this a thin class; the pool must exist in VolumeGroup.
	ThinPool string `json:"thinPool,omitempty"`
	// OverprovisionRatio bounds the virtual size of a thin class's volumes
	// to pool size x ratio; default 1; thin classes only.
	OverprovisionRatio float64 `json:"overprovisionRatio,omitempty"`
	// LVCreateOptions are extra lvcreate options from the lvm package's
	// allow-list; thick classes only.
	LVCreateOptions lvm.LVOptions `json:"lvcreateOptions,omitempty"`
	// Erase is how a new raw-block volume of a thick class is zeroed before
	// it is handed out (erase.ZeroOut, erase.Write or erase.None; empty
	// means erase.ZeroOut). Thick classes only: a thin volume reads zeros
	// where it was never written when its pool zeroes new blocks.
	Erase erase.Method `json:"erase,omitempty"`
	// SnapshotSpacePercent is the copy-on-write space of a thick class's
	// snapshot, in percent of its volume's size: the share of the volume
	// that may change while the snapshot lives. Default
	// DefaultSnapshotSpacePercent; 1-100; thick classes only.
	SnapshotSpacePercent int `json:"snapshotSpacePercent,omitempty"`
	// MkfsOptions are the options mkfs gets when it makes a filesystem of
	// this class, per filesystem (ext4, xfs, btrfs): argv items in order, a
	// flag and its value as separate items, from internal/node/fs's allow-list. A
	// filesystem not listed gets fs.DefaultMkfsOptions (mountable on
	// fs.OldestKernel); an empty list gives the tool's own defaults.
	MkfsOptions map[string][]string `json:"mkfsOptions,omitempty"`
}

// MkfsArgs are the mkfs options of fsType for this class: the class's own
// when it lists fsType, else the default.
func (d *DeviceClass) MkfsArgs(fsType string) []string {
	if opts, ok := d.MkfsOptions[fsType]; ok {
		return slices.Clone(opts)
	}
	return fs.DefaultMkfsOptions(fsType)
}

// DefaultSnapshotSpacePercent is SnapshotSpacePercent when unset.
const DefaultSnapshotSpacePercent = 20

// EraseMethod is the class's erase method with its default applied: none
// for thin classes, zeroout for thick ones.
func (d *DeviceClass) EraseMethod() erase.Method {
	switch {
	case d.Thin():
		return erase.None
	case d.Erase == "":
		return erase.ZeroOut
	}
	return d.Erase
}

// Thin tells whether the class carves thin LVs.
func (d *DeviceClass) Thin() bool { return d.ThinPool != "" }
