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
	// KindCopySource is a clone's temporary source snapshot.
	KindCopySource
)

// IsCarve tells whether tags mark an LV as carve's.
func IsCarve(tags []string) bool { return slices.Contains(tags, TagOwner) }

// Owned reads from an LV's tags whether it is carve's, its kind and its
// device class. A snapshot LV carries a snapshot tag; every other owned LV
// is a volume.
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
