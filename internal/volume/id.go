// Package volume is carve's volume model: how a CSI volume or snapshot maps
// to an LV (its name, its ID, its tags, its device node) and back, and
// which volume capabilities carve serves. It knows LVM's rules and the CSI
// messages, never gRPC codes, so the CSI servers, the state view, the
// tests' tiers and tools share one reading of what carve wrote.
package volume

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/carve-csi/carve/internal/lvmname"
)

// A carve volume ID is "<volume group>/<LV name>": the node side finds the
// device (/dev/<vg>/<lv>) from the ID alone, with no state of its own.
// LV names are derived from the CSI volume name, never the raw name: CSI
// names can be longer than LVM allows and use characters it does not.

const lvNamePrefix = "carve-"

// LVNameFor derives the LV name of a CSI volume name: the prefix and 32 hex
// digits of its SHA-256 (128 bits, so two names never meet in practice).
// The LV's tags (tags.go) say whose it is.
func LVNameFor(volumeName string) string {
	sum := sha256.Sum256([]byte(volumeName))
	return lvNamePrefix + hex.EncodeToString(sum[:16])
}

// VolumeID builds the ID of the LV lv in volume group vg.
func VolumeID(vg, lv string) string { return vg + "/" + lv }

// ParseVolumeID splits a volume ID into volume group and LV name. It does
// not check that they exist, only that the ID has carve's form and names
// LVM accepts: a device path built from them stays under the device
// directory ("../carve-x" is not an ID).
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

// ID is a volume ID read once: the volume group and LV name it names.
// A call reads the ID it is given with ParseID and hands the ID on.
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

// String is the volume ID itself: ParseID(id.String()) is id.
func (id ID) String() string { return VolumeID(id.VG, id.LV) }
