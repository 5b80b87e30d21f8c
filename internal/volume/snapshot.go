package volume

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/carve-csi/carve/internal/lvmname"
)

// A snapshot's ID is "<node>/<volume group>/<LV name>", so a restore elsewhere knows
// its source's node; restored and cloned volumes tag their source's ID.

const snapshotLVNamePrefix = "carvesnap-"

// Snapshot tags.
const (
	// TagSnapshotPrefix + the escaped CSI snapshot name marks a snapshot LV.
	TagSnapshotPrefix = "carve.dev/snapshot="
	// TagOriginPrefix + the origin's LV name, which LVM forgets when the origin goes.
	TagOriginPrefix = "carve.dev/origin="
	// TagSizePrefix + the origin's size: LVM reports a COW snapshot's size as its COW space.
	TagSizePrefix = "carve.dev/size="
	// TagAskedPrefix + "<asked>/<made>": a restore at the claim's size must fit.
	TagAskedPrefix = "carve.dev/asked="
	// TagFromSnapshotPrefix + the escaped source snapshot ID.
	TagFromSnapshotPrefix = "carve.dev/from-snapshot="
	// TagFromVolumePrefix + the escaped source volume ID.
	TagFromVolumePrefix = "carve.dev/from-volume="
)

// SnapshotLVNameFor derives the LV name of a CSI snapshot name.
func SnapshotLVNameFor(snapshotName string) string {
	sum := sha256.Sum256([]byte(snapshotName))
	return snapshotLVNamePrefix + hex.EncodeToString(sum[:16])
}

// SnapshotID builds the ID of the snapshot LV lv in volume group vg on node.
func SnapshotID(node, vg, lv string) string { return node + "/" + vg + "/" + lv }

// ParseSnapshotID splits a snapshot ID, checking only its form.
func ParseSnapshotID(id string) (node, vg, lv string, err error) {
	parts := strings.Split(id, "/")
	if len(parts) != 3 || !strings.HasPrefix(parts[2], snapshotLVNamePrefix) || !isNodeName(parts[0]) {
		return "", "", "", fmt.Errorf("snapshot ID %q is not of the form <node>/<volume group>/%s<hex>", id, snapshotLVNamePrefix)
	}
	if err := lvmname.VG(parts[1]); err != nil {
		return "", "", "", fmt.Errorf("snapshot ID %q: %w", id, err)
	}
	if err := lvmname.LV(parts[2]); err != nil {
		return "", "", "", fmt.Errorf("snapshot ID %q: %w", id, err)
	}
	return parts[0], parts[1], parts[2], nil
}

func isNodeName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isNodeNameByte(c) {
			return false
		}
	}
	return true
}

func isNodeNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.'
}

// SnapshotTag is the tag that carries a CSI snapshot name.
func SnapshotTag(snapshotName string) string {
	return fitTag(TagSnapshotPrefix, escapeTagValue(snapshotName))
}

// SnapshotTags are the tags of a new snapshot LV of the volume LV origin.
func SnapshotTags(snapshotName, class, origin string) []string {
	return []string{TagOwner, SnapshotTag(snapshotName), TagClassPrefix + class, TagOriginPrefix + origin}
}

// SizeTag is the tag that records the size of a snapshot's volume.
func SizeTag(size uint64) string { return TagSizePrefix + strconv.FormatUint(size, 10) }

// SizeFromTags returns the size a SizeTag recorded.
func SizeFromTags(tags []string) (uint64, bool) {
	for _, t := range tags {
		if v, ok := strings.CutPrefix(t, TagSizePrefix); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// AskedTag is the tag that records a volume made bigger than asked.
func AskedTag(asked, made uint64) string {
	return TagAskedPrefix + strconv.FormatUint(asked, 10) + "/" + strconv.FormatUint(made, 10)
}

// AskedFromTags returns what an AskedTag recorded.
func AskedFromTags(tags []string) (asked, made uint64, ok bool) {
	for _, t := range tags {
		if v, found := strings.CutPrefix(t, TagAskedPrefix); found {
			a, m, cut := strings.Cut(v, "/")
			asked, err1 := strconv.ParseUint(a, 10, 64)
			made, err2 := strconv.ParseUint(m, 10, 64)
			return asked, made, cut && err1 == nil && err2 == nil && asked < made
		}
	}
	return 0, 0, false
}

// IsSnapshot tells whether an LV's tags mark it as a snapshot.
func IsSnapshot(tags []string) bool {
	return slices.ContainsFunc(tags, func(t string) bool { return strings.HasPrefix(t, TagSnapshotPrefix) })
}

// HasSnapshotName tells whether the tags name that CSI snapshot.
func HasSnapshotName(tags []string, snapshotName string) bool {
	return slices.Contains(tags, SnapshotTag(snapshotName))
}

// SnapshotNameFromTags returns the CSI snapshot name; whole is false when it was cut.
func SnapshotNameFromTags(tags []string) (name string, whole, ok bool) {
	return readTag(tags, TagSnapshotPrefix)
}

// OriginFromTags returns the LV name of the volume a snapshot was taken of.
func OriginFromTags(tags []string) (string, bool) {
	for _, t := range tags {
		if v, ok := strings.CutPrefix(t, TagOriginPrefix); ok && v != "" {
			return v, true
		}
	}
	return "", false
}

// FromSnapshotTag is the tag of a volume restored from snapshot ID id.
func FromSnapshotTag(id string) string { return fitTag(TagFromSnapshotPrefix, escapeTagValue(id)) }

// FromVolumeTag is the tag of a volume cloned from volume ID id.
func FromVolumeTag(id string) string { return fitTag(TagFromVolumePrefix, escapeTagValue(id)) }

// SourceTags returns the from-snapshot and from-volume tags a repeat must match.
func SourceTags(tags []string) []string {
	var out []string
	for _, t := range tags {
		if strings.HasPrefix(t, TagFromSnapshotPrefix) || strings.HasPrefix(t, TagFromVolumePrefix) {
			out = append(out, t)
		}
	}
	return out
}

// A copy into a thick LV is tagged TagCopyPending until synced, so a retry
// redoes it and no half copy is reported made.
const (
	// TagCopyPending marks an LV whose data copy has not finished.
	TagCopyPending = "carve.dev/copy=pending"
	// TagCopySourcePrefix + the copy target's LV name marks a temporary snapshot.
	TagCopySourcePrefix    = "carve.dev/copy-source-for="
	copySourceLVNamePrefix = "carvecopy-"
)

// CopySourceLVNameFor names the temporary snapshot a clone into target reads.
func CopySourceLVNameFor(target string) string {
	return copySourceLVNamePrefix + strings.TrimPrefix(target, lvNamePrefix)
}

// CopySourceTags are the temporary snapshot's tags.
func CopySourceTags(target, class string) []string {
	return []string{TagOwner, TagClassPrefix + class, TagCopySourcePrefix + target}
}

// CopyTargetFromTags returns the LV a temporary snapshot is the source of.
func CopyTargetFromTags(tags []string) (string, bool) {
	for _, t := range tags {
		if v, ok := strings.CutPrefix(t, TagCopySourcePrefix); ok && v != "" {
			return v, true
		}
	}
	return "", false
}

// CopyPending tells whether an LV's data copy has not finished.
func CopyPending(tags []string) bool { return slices.Contains(tags, TagCopyPending) }
