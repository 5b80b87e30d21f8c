package plugintest

import (
	"fmt"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
)

// MountCapability is a single-node-writer filesystem capability.
func MountCapability(fsType string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// DevicePath is the device node of a carve volume: its ID is
// "<volume group>/<LV name>" (docs/architecture.md).
func DevicePath(volumeID string) (string, error) {
	vg, lv, ok := strings.Cut(volumeID, "/")
	if !ok || vg == "" || lv == "" || strings.Contains(lv, "/") {
		return "", fmt.Errorf("volume ID %q is not <vg>/<lv>", volumeID)
	}
	return "/dev/" + vg + "/" + lv, nil
}
