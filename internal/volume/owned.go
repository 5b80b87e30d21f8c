package volume

import (
	"slices"

	"github.com/carve-csi/carve/internal/node/lvm"
)

// Kind is what a carve LV stands for.
type Kind int

// The kinds of carve LV.
const (
	// KindVolume is a CSI volume.
	KindVolume Kind = iota + 1
	// KindSnapshot is a CSI snapshot.
	KindSnapshot
	// KindCopySource is the temporary snapshot a clone into a thick
	// volume copies from; it lives only while the copy runs.
	KindCopySource
)

// IsCarve tells whether tags mark an LV as carve's.
func IsCarve(tags []string) bool { return slices.Contains(tags, TagOwner) }

// Owned tells whether an LV is carve's, what it stands for and of which
// device class. An LV carve made for a snapshot carries a snapshot tag;
// every other LV with the owner tag is a volume (also those of carve
// releases that knew no snapshots).
func Owned(lv lvm.LogicalVolume) (kind Kind, class string, ok bool) {
	if !IsCarve(lv.Tags) {
		return 0, "", false
	}
	class, _ = ClassFromTags(lv.Tags)
	if IsSnapshot(lv.Tags) {
		return KindSnapshot, class, true
	}
	if _, ok := CopyTargetFromTags(lv.Tags); ok {
		return KindCopySource, class, true
	}
	return KindVolume, class, true
}
