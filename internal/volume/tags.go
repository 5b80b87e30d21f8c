package volume

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"

	"github.com/carve-csi/carve/internal/lvmname"
)

// Tags on every carve LV. Each byte is VG metadata, which bounds how many
// volumes a VG holds: values stay short.
const (
	// TagOwner marks an LV as carve's.
	TagOwner = "carve.dev/owner=carve"
	// TagNamePrefix + the escaped CSI name: the LV name is its hash, so this catches a collision.
	TagNamePrefix = "carve.dev/name="
	// TagClassPrefix + the device class name.
	TagClassPrefix = "carve.dev/class="
	// TagClaimPrefix + the escaped "<namespace>/<name>" of the PVC, when given.
	TagClaimPrefix = "carve.dev/pvc="
	// TagPVPrefix + the escaped PV name, only when it differs from the CSI name.
	TagPVPrefix = "carve.dev/pv="
)

// MaxNameLength bounds CSI names (the spec asks 128); a name too long for its tag is hashed.
const MaxNameLength = 500

// Parameters csi-provisioner adds with --extra-create-metadata.
const (
	// ParamPVCName is the PVC's name.
	ParamPVCName = "csi.storage.k8s.io/pvc/name"
	// ParamPVCNamespace is the PVC's namespace.
	ParamPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
	// ParamPVName is the PV's name.
	ParamPVName = "csi.storage.k8s.io/pv/name"
)

// tagEscape + two upper-case hex digits escape a byte: ':' is in LVM's alphabet, no k8s name.
const tagEscape = ':'

// tagTruncated separates a cut value's head from its hash; no escaped value holds it.
const tagTruncated = "::"

const tagHashHexDigits = 32

// isTagValueByte: '/' is escaped so it can separate a claim's namespace from its name.
func isTagValueByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' ||
		b == '+' || b == '_' || b == '.' || b == '-'
}

func escapeTagValue(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isTagValueByte(c) {
			b.WriteByte(c)
			continue
		}
		const digits = "0123456789ABCDEF"
		b.WriteByte(tagEscape)
		b.WriteByte(digits[c>>4])
		b.WriteByte(digits[c&0xf])
	}
	return b.String()
}

// unescapeTagValue accepts only escapeTagValue's output: one spelling per value.
func unescapeTagValue(v string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if isTagValueByte(c) {
			b.WriteByte(c)
			continue
		}
		if c != tagEscape || i+2 >= len(v) {
			return "", false
		}
		hi, ok1 := upperHex(v[i+1])
		lo, ok2 := upperHex(v[i+2])
		d := hi<<4 | lo
		if !ok1 || !ok2 || isTagValueByte(d) {
			return "", false
		}
		b.WriteByte(d)
		i += 2
	}
	return b.String(), true
}

func upperHex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// fitTag returns prefix+value, or its head, tagTruncated and 128 bits of its SHA-256.
func fitTag(prefix, value string) string {
	if len(prefix)+len(value) <= lvmname.MaxTagLength {
		return prefix + value
	}
	sum := sha256.Sum256([]byte(value))
	tail := tagTruncated + hex.EncodeToString(sum[:])[:tagHashHexDigits]
	n := lvmname.MaxTagLength - len(prefix) - len(tail)
	for k := n - 1; k >= 0 && k >= n-2; k-- {
		if value[k] == tagEscape {
			n = k
			break
		}
	}
	return prefix + value[:n] + tail
}

// readTag reads the value of the first tag with prefix, a value fitTag
// wrote; whole is false when it was cut.
func readTag(tags []string, prefix string) (s string, whole, ok bool) {
	for _, t := range tags {
		if v, found := strings.CutPrefix(t, prefix); found {
			head, _, cut := strings.Cut(v, tagTruncated)
			s, ok = unescapeTagValue(head)
			return s, !cut, ok
		}
	}
	return "", false, false
}

// VolumeTag is the tag that carries a CSI volume name.
func VolumeTag(volumeName string) string {
	return fitTag(TagNamePrefix, escapeTagValue(volumeName))
}

// ClaimTag is the tag that names the PVC a volume was made for.
func ClaimTag(namespace, name string) string {
	return fitTag(TagClaimPrefix, escapeTagValue(namespace)+"/"+escapeTagValue(name))
}

// HasVolumeName tells whether the tags name that CSI volume.
func HasVolumeName(tags []string, volumeName string) bool {
	return slices.Contains(tags, VolumeTag(volumeName))
}

// VolumeNameFromTags returns the CSI name in the tags; whole is false when it was cut.
func VolumeNameFromTags(tags []string) (name string, whole, ok bool) {
	return readTag(tags, TagNamePrefix)
}

// Claim is the PVC a volume was made for.
type Claim struct {
	Namespace, Name string
}

// String is "<namespace>/<name>", as kubectl names a claim.
func (c Claim) String() string { return c.Namespace + "/" + c.Name }

// ClaimFromTags returns the PVC the tags name; false when none or cut.
func ClaimFromTags(tags []string) (Claim, bool) {
	for _, t := range tags {
		v, found := strings.CutPrefix(t, TagClaimPrefix)
		if !found {
			continue
		}
		ns, name, sep := strings.Cut(v, "/")
		if !sep || strings.Contains(v, tagTruncated) {
			return Claim{}, false
		}
		n, ok1 := unescapeTagValue(ns)
		m, ok2 := unescapeTagValue(name)
		if !ok1 || !ok2 {
			return Claim{}, false
		}
		return Claim{Namespace: n, Name: m}, true
	}
	return Claim{}, false
}

// ClassFromTags returns the device class recorded in an LV's tags.
func ClassFromTags(tags []string) (string, bool) {
	for _, t := range tags {
		if v, ok := strings.CutPrefix(t, TagClassPrefix); ok {
			return v, true
		}
	}
	return "", false
}

// VolumeTags are a new LV's tags, with the claim when the parameters name it.
func VolumeTags(volumeName, class string, params map[string]string) []string {
	tags := []string{TagOwner, VolumeTag(volumeName), TagClassPrefix + class}
	ns, name := params[ParamPVCNamespace], params[ParamPVCName]
	if ns != "" && name != "" {
		tags = append(tags, ClaimTag(ns, name))
	}
	if pv := params[ParamPVName]; pv != "" && pv != volumeName {
		tags = append(tags, fitTag(TagPVPrefix, escapeTagValue(pv)))
	}
	return tags
}

// Owner is what an LV's tags say of whose it is, as the audits read it.
type Owner struct {
	// Class is the device class; empty when the tag is missing.
	Class string
	// VolumeName is the CSI volume name, only when held whole.
	VolumeName string
	// Claim is <namespace>/<name> of the claim, when known.
	Claim string
}

// OwnerFromTags reads an LV's Owner from its tags.
func OwnerFromTags(tags []string) Owner {
	var o Owner
	o.Class, _ = ClassFromTags(tags)
	if name, whole, ok := VolumeNameFromTags(tags); ok && whole {
		o.VolumeName = name
	}
	if c, ok := ClaimFromTags(tags); ok {
		o.Claim = c.String()
	}
	return o
}
