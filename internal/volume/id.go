// Package volume is carve's volume model: how a CSI volume or snapshot maps to an LV
// (name, ID, tags, device) and back. It knows LVM's rules and CSI messages, never gRPC
// codes, so every side shares one reading of what carve wrote.
package volume

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/carve-csi/carve/internal/lvmname"
)

// A volume ID is "<volume group>/<LV name>": the node finds the device from the ID alone.

const lvNamePrefix = "carve-"

// LVNameFor hashes the CSI name (128 bits of SHA-256): CSI names break LVM's rules.
func LVNameFor(volumeName string) string {
	sum := sha256.Sum256([]byte(volumeName))
	return lvNamePrefix + hex.EncodeToString(sum[:16])
}

// VolumeID builds the ID of the LV lv in volume group vg.
func VolumeID(vg, lv string) string { return vg + "/" + lv }

// ParseVolumeID checks the ID's form and LVM's rules, so a device path built from it
// stays in the device directory.
func ParseVolumeID(id string) (vg, lv string, err error) {
	vg, lv, ok := strings.Cut(id, "/")
	if !ok || vg == "" || !strings.HasPrefix(lv, lvNamePrefix) || strings.Contains(lv, "/") {
		return "", "", fmt.Errorf("volume ID %q is not of the form <volume group>/%s<hex>", id, lvNamePrefix)
	}
	if err := lvmname.VG(vg); err != nil {
		return "", "", fmt.Errorf("volume ID %q: %w", id, err)
	}
	if err := lvmname.LV(lv); err != nil {
		return "", "", fmt.Errorf("volume ID %q: %w", id, err)
	}
	return vg, lv, nil
}

// ID is a volume ID read once: its volume group and LV name.
type ID struct {
	VG, LV string
}

// ParseID reads a volume ID as ParseVolumeID does.
func ParseID(s string) (ID, error) {
	vg, lv, err := ParseVolumeID(s)
	if err != nil {
		return ID{}, err
	}
	return ID{VG: vg, LV: lv}, nil
}

// String is the volume ID: ParseID(id.String()) is id.
func (id ID) String() string { return VolumeID(id.VG, id.LV) }
