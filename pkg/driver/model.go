package driver

import "github.com/carve-csi/carve/pkg/volume"

// Names of the volume model that callers outside the plugin (the e2e
// tier) still take from this package; the model itself is pkg/volume.
const (
	// TagOwner is volume.TagOwner.
	TagOwner = volume.TagOwner
	// TagClassPrefix is volume.TagClassPrefix.
	TagClassPrefix = volume.TagClassPrefix
)

// LVNameFor is volume.LVNameFor.
func LVNameFor(volumeName string) string { return volume.LVNameFor(volumeName) }

// VolumeTag is volume.VolumeTag.
func VolumeTag(volumeName string) string { return volume.VolumeTag(volumeName) }

// ClaimTag is volume.ClaimTag.
func ClaimTag(namespace, name string) string { return volume.ClaimTag(namespace, name) }

// HasVolumeName is volume.HasVolumeName.
func HasVolumeName(tags []string, volumeName string) bool {
	return volume.HasVolumeName(tags, volumeName)
}
