package volume

import (
	"slices"
)

// Kind is what a carve LV stands for.
type Kind int

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

// Owned reads whether an LV is carve's, its kind and its class; an owned LV that is
// neither a snapshot nor a copy source is a volume.
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
