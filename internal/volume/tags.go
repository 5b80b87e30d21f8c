package volume

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"

	"github.com/carve-csi/carve/internal/lvmname"
)

// Tags carve puts on every LV it makes, e.g. carve.dev/name=pvc-...,
// carve.dev/class=fast, carve.dev/pvc=default/data-pg-0. Every byte is VG
// metadata, whose area bounds how many volumes a VG holds: values are short
// and readable where they can be.
const (
	// TagOwner marks an LV as carve's.
	TagOwner = "carve.dev/owner=carve"
	// TagNamePrefix + the escaped CSI volume name (the PV's name): the LV name
	// is a hash of it, so this tag catches a collision and tells whose it is.
	TagNamePrefix = "carve.dev/name="
	// TagClassPrefix + the device class name.
	TagClassPrefix = "carve.dev/class="
	// TagClaimPrefix + the escaped "<namespace>/<name>" of the PVC, when given.
	TagClaimPrefix = "carve.dev/pvc="
	// TagPVPrefix + the escaped PV name, only when it differs from the CSI name
	// (never with external-provisioner).
	TagPVPrefix = "carve.dev/pv="
)

// MaxNameLength bounds CSI volume and snapshot names, well above the CSI
// spec's 128; a name too long for its tag is cut and hashed (fitTag).
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

// tagEscape and two upper-case hex digits escape a byte; ':' is in LVM's
// tag alphabet, in no Kubernetes name, and inert in a shell.
const tagEscape = ':'

// tagTruncated separates a cut value's head from its hash; an escaped value
// never holds it, so a cut value is never read as whole.
const tagTruncated = "::"

const tagHashHexDigits = 32

// isTagValueByte tells whether b stands for itself in an escaped value; '/'
// is escaped so it can separate a claim's namespace from its name.
func isTagValueByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' ||
		b == '+' || b == '_' || b == '.' || b == '-'
}

// escapeTagValue writes s in the tag alphabet, one to one.
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

// unescapeTagValue accepts only what escapeTagValue writes, so every value
// has one spelling and tags compare as strings.
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

// fitTag returns prefix+value when LVM takes it, else the value's head
// (never splitting an escape), tagTruncated and 128 bits of its SHA-256.
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

// readTag unescapes a fitTag value and says whether it is whole.
func readTag(value string) (s string, whole, ok bool) {
	head, _, cut := strings.Cut(value, tagTruncated)
	s, ok = unescapeTagValue(head)
	return s, !cut, ok
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

// VolumeNameFromTags returns the CSI volume name in the tags; whole is false
// when it was cut (HasVolumeName still matches the full name).
func VolumeNameFromTags(tags []string) (name string, whole, ok bool) {
	for _, t := range tags {
		if v, found := strings.CutPrefix(t, TagNamePrefix); found {
			return readTag(v)
		}
	}
	return "", false, false
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
