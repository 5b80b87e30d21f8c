// Package deviceclass reads carve's device-class file: which volume groups
// and thin pools StorageClasses can ask for, and how much to keep free.
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

// DeviceClass is what a StorageClass names with carve.dev/device-class.
type DeviceClass struct {
	Name        string `json:"name"`
	VolumeGroup string `json:"volumeGroup"`
	// Default marks the class of StorageClasses that name none; at most one.
	Default bool `json:"default,omitempty"`
	// Spare is kept free: never given to volumes, never reported as capacity.
	Spare    *resource.Quantity `json:"spare,omitempty"`
	ThinPool string             `json:"thinPool,omitempty"`
	// OverprovisionRatio bounds a thin class's virtual size to pool size x
	// ratio; default 1.
	OverprovisionRatio float64 `json:"overprovisionRatio,omitempty"`
	// LVCreateOptions are lvm's allow-listed options; thick classes only.
	LVCreateOptions lvm.LVOptions `json:"lvcreateOptions,omitempty"`
	// Erase is how a thick class's new raw-block volume is zeroed (default
	// erase.ZeroOut). A thin volume reads zeros where never written when its
	// pool zeroes new blocks.
	Erase erase.Method `json:"erase,omitempty"`
	// SnapshotSpacePercent is a thick snapshot's copy-on-write space in percent
	// of its volume: the share that may change while it lives. 1-100.
	SnapshotSpacePercent int `json:"snapshotSpacePercent,omitempty"`
	// MkfsOptions are mkfs's argv items per filesystem, from fs's allow-list. An
	// unlisted filesystem gets fs.DefaultMkfsOptions (mountable on
	// fs.OldestKernel); an empty list gives the tool's own defaults.
	MkfsOptions map[string][]string `json:"mkfsOptions,omitempty"`
}

// MkfsArgs are the class's mkfs options for fsType, else the default.
func (d *DeviceClass) MkfsArgs(fsType string) []string {
	if opts, ok := d.MkfsOptions[fsType]; ok {
		return slices.Clone(opts)
	}
	return fs.DefaultMkfsOptions(fsType)
}

// DefaultSnapshotSpacePercent is SnapshotSpacePercent when unset.
const DefaultSnapshotSpacePercent = 20

// EraseMethod is the erase method with its default: none for thin classes,
// zeroout for thick ones.
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
