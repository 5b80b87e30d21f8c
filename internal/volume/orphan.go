package volume

import (
	"strconv"
	"strings"
	"time"
)

// An orphan the audit quarantines (--remove-orphans) keeps its data: it is
// deactivated, renamed from carve-<hex> to carve-orphan-<hex> (a name no
// volume name hashes to) and tagged, and removed only after a second grace
// (docs/operations.md, "Orphaned volumes", says how to restore it).

const orphanLVNamePrefix = lvNamePrefix + "orphan-"

const (
	// TagOrphanOfPrefix + the LV name an orphan had before it was
	// quarantined.
	TagOrphanOfPrefix = "carve.dev/orphan-of="
	// TagOrphanedAtPrefix + the Unix time in seconds (the controller's
	// clock) when the orphan was quarantined: the second grace period
	// runs from it.
	TagOrphanedAtPrefix = "carve.dev/orphaned-at="
)

// QuarantineName is the name an orphaned volume LV gets when it is
// quarantined; false for a name carve's volumes do not have, or one
// quarantined already.
func QuarantineName(lvName string) (string, bool) {
	rest, ok := strings.CutPrefix(lvName, lvNamePrefix)
	if !ok || rest == "" || IsQuarantineName(lvName) {
		return "", false
	}
	return orphanLVNamePrefix + rest, true
}

// IsQuarantineName tells whether an LV name is that of a quarantined
// orphan.
func IsQuarantineName(lvName string) bool {
	return strings.HasPrefix(lvName, orphanLVNamePrefix) && len(lvName) > len(orphanLVNamePrefix)
}

// OrphanTags are the tags a quarantined orphan carries: the name it had
// and when (at) it was quarantined.
func OrphanTags(original string, at time.Time) []string {
	return []string{TagOrphanOfPrefix + original, TagOrphanedAtPrefix + strconv.FormatInt(at.Unix(), 10)}
}

// IsOrphanTag tells whether a tag is one of OrphanTags'.
func IsOrphanTag(tag string) bool {
	return strings.HasPrefix(tag, TagOrphanOfPrefix) || strings.HasPrefix(tag, TagOrphanedAtPrefix)
}

// Quarantined is what an LV's name and tags say of a quarantined orphan.
type Quarantined struct {
	// Original is the LV name before the quarantine: its tag, or else
	// the one its name was made from.
	Original string
	// At is when it was quarantined; zero when no tag says (an LV
	// renamed by hand).
	At time.Time
}

// QuarantinedFrom reads a quarantined orphan's name and tags; false when
// the name is not a quarantined orphan's (an LV renamed back keeps its
// tags but is a volume again).
func QuarantinedFrom(lvName string, tags []string) (Quarantined, bool) {
	if !IsQuarantineName(lvName) {
		return Quarantined{}, false
	}
	q := Quarantined{Original: lvNamePrefix + strings.TrimPrefix(lvName, orphanLVNamePrefix)}
	for _, t := range tags {
		if v, ok := strings.CutPrefix(t, TagOrphanOfPrefix); ok && v != "" {
			q.Original = v
		}
		if v, ok := strings.CutPrefix(t, TagOrphanedAtPrefix); ok {
			if s, err := strconv.ParseInt(v, 10, 64); err == nil && s > 0 {
				q.At = time.Unix(s, 0)
			}
		}
	}
	return q, true
}
