package volume

import (
	"slices"
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

// Owned tells, from an LV's tags, whether it is carve's, what it stands for and of which
// device class. An LV carve made for a snapshot carries a snapshot tag;
// every other LV with the owner tag is a volume (also those of carve
// releases that knew no snapshots).
func Owned(tags []string) (kind Kind, class string, ok bool) {
	if !IsCarve(tags) {
		return 0, "", false
	}
	class, _ = ClassFromTags(tags)
	if IsSnapshot(tags) {
		return KindSnapshot, class, true
	}
	if _, ok := CopyTargetFromTags(tags); ok {
		return KindCopySource, class, true
	}
	return KindVolume, class, true
}
