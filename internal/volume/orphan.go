package volume

import (
	"strconv"
	"strings"
	"time"
)

// A quarantined orphan is deactivated, renamed carve-orphan-<hex> (no volume hashes to it)
// and tagged; it is removed after a second grace (docs/operations.md, "Orphaned volumes").

const orphanLVNamePrefix = lvNamePrefix + "orphan-"

const (
	// TagOrphanOfPrefix + the LV name before the quarantine.
	TagOrphanOfPrefix = "carve.dev/orphan-of="
	// TagOrphanedAtPrefix + the quarantine's Unix time; the second grace runs from it.
	TagOrphanedAtPrefix = "carve.dev/orphaned-at="
)

// QuarantineName is an orphan LV's quarantine name; false for a name not a volume's.
func QuarantineName(lvName string) (string, bool) {
	rest, ok := strings.CutPrefix(lvName, lvNamePrefix)
	if !ok || rest == "" || IsQuarantineName(lvName) {
		return "", false
	}
	return orphanLVNamePrefix + rest, true
}

// IsQuarantineName tells whether an LV name is a quarantined orphan's.
func IsQuarantineName(lvName string) bool {
	return strings.HasPrefix(lvName, orphanLVNamePrefix) && len(lvName) > len(orphanLVNamePrefix)
}

// OrphanTags are a quarantined orphan's tags: its old name and time.
func OrphanTags(original string, at time.Time) []string {
	return []string{TagOrphanOfPrefix + original, TagOrphanedAtPrefix + strconv.FormatInt(at.Unix(), 10)}
}

// IsOrphanTag tells whether a tag is one of OrphanTags'.
func IsOrphanTag(tag string) bool {
	return strings.HasPrefix(tag, TagOrphanOfPrefix) || strings.HasPrefix(tag, TagOrphanedAtPrefix)
}

// Quarantined is what an LV's name and tags say of a quarantined orphan.
type Quarantined struct {
	// Original is the LV name before the quarantine.
	Original string
	// At is when it was quarantined; zero when untagged (renamed by hand).
	At time.Time
}

// QuarantinedFrom reads a quarantined orphan; an LV renamed back is a volume again.
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
