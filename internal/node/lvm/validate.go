package lvm

import (
	"fmt"
	"math/bits"
	"strings"
)

// LVM's own limits (lvm(8) "VALID NAMES", lib/misc/lvm-string.c). Names and
// tags are checked against them before any command runs, so a bad value is
// an ErrInvalidArgument and never becomes an argv element.
const (
	// MaxNameLength is the longest VG or LV name LVM accepts (NAME_LEN - 1).
	MaxNameLength = 127
	// MaxTagLength is the longest tag carve passes to LVM.
	MaxTagLength = 1024
	// MaxStripes is LVM's limit on stripes.
	MaxStripes = 128
	// MaxMirrors is the most extra raid1 images LVM allows (10 images).
	MaxMirrors = 9
	// MaxSize is the largest size, in bytes, carve passes to LVM: it keeps
	// extent arithmetic far from overflow, and LVM's own limit (8 EiB) is
	// more than any disk holds anyway.
	MaxSize = 1 << 62
	// minStripeSize is the smallest stripe size LVM accepts (one page).
	minStripeSize = 4 << 10
)

// reservedLVPrefixes and reservedLVSubstrings are the LV names LVM keeps for
// itself. The list follows lvm(8) and adds the integrity layers (_imeta,
// _idata) of newer releases: refusing a name LVM would accept is harmless,
// the reverse is not.
var (
	reservedLVPrefixes   = []string{"snapshot", "pvmove"}
	reservedLVSubstrings = []string{
		"_cdata", "_cmeta", "_corig", "_idata", "_imeta", "_iorig", "_mimage", "_mlog",
		"_pmspare", "_rimage", "_rmeta", "_tdata", "_tmeta", "_vdata", "_vorigin", "_wcorig",
	}
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

func isNameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '+' || c == '_' || c == '.' || c == '-'
}

func isTagChar(c byte) bool {
	return isNameChar(c) || strings.IndexByte("/=!:&#", c) >= 0
}

// validateName checks what VG and LV names share: LVM's alphabet
// [a-zA-Z0-9+_.-], no leading '-', not "." or "..", at most 127 bytes.
func validateName(kind, name string) error {
	switch {
	case name == "":
		return invalid("%s name is empty", kind)
	case name == "." || name == "..":
		return invalid("%s name %q is reserved", kind, name)
	case name[0] == '-':
		return invalid("%s name %q begins with '-'", kind, name)
	case len(name) > MaxNameLength:
		return invalid("%s name is %d bytes long, at most %d are allowed", kind, len(name), MaxNameLength)
	}
	for i := 0; i < len(name); i++ {
		if !isNameChar(name[i]) {
			return invalid("%s name %q holds %q; allowed are a-z A-Z 0-9 + _ . -", kind, name, name[i])
		}
	}
	return nil
}

// ValidateVGName reports whether name is a volume group name LVM accepts.
func ValidateVGName(name string) error { return validateName("volume group", name) }

// ValidateLVName reports whether name is a logical volume name LVM accepts,
// reserved names included.
func ValidateLVName(name string) error {
	if err := validateName("logical volume", name); err != nil {
		return err
	}
	for _, p := range reservedLVPrefixes {
		if strings.HasPrefix(name, p) {
			return invalid("logical volume name %q: names beginning with %q are reserved by LVM", name, p)
		}
	}
	for _, s := range reservedLVSubstrings {
		if strings.Contains(name, s) {
			return invalid("logical volume name %q: names holding %q are reserved by LVM", name, s)
		}
	}
	return nil
}

// ValidateTag reports whether tag is an LVM tag: 1 to 1024 bytes of
// [A-Za-z0-9_+.-/=!:&#].
func ValidateTag(tag string) error {
	switch {
	case tag == "":
		return invalid("tag is empty")
	case len(tag) > MaxTagLength:
		return invalid("tag is %d bytes long, at most %d are allowed", len(tag), MaxTagLength)
	}
	for i := 0; i < len(tag); i++ {
		if !isTagChar(tag[i]) {
			return invalid("tag %q holds %q; allowed are A-Z a-z 0-9 _ + . - / = ! : & #", tag, tag[i])
		}
	}
	return nil
}

func validateTags(tags []string) error {
	for _, t := range tags {
		if err := ValidateTag(t); err != nil {
			return err
		}
	}
	return nil
}

// Validate reports whether the options are within carve's allow-list and
// LVM's limits: stripes 0-128, a power-of-two stripe size of at least 4 KiB
// only with stripes > 1, raid1 mirrors 0-9, and not striping and mirroring at
// once.
func (o LVOptions) Validate() error {
	switch {
	case o.Stripes < 0 || o.Stripes > MaxStripes:
		return invalid("stripes is %d, allowed are 0 to %d", o.Stripes, MaxStripes)
	case o.Mirrors < 0 || o.Mirrors > MaxMirrors:
		return invalid("mirrors is %d, allowed are 0 to %d", o.Mirrors, MaxMirrors)
	case o.StripeSize != 0 && o.Stripes < 2:
		return invalid("stripeSize needs stripes of 2 or more")
	case o.StripeSize != 0 && (o.StripeSize < minStripeSize || bits.OnesCount64(o.StripeSize) != 1):
		return invalid("stripeSize is %d, it must be a power of two of at least %d bytes", o.StripeSize, minStripeSize)
	case o.Stripes > 1 && o.Mirrors > 0:
		return invalid("stripes and mirrors cannot be combined")
	}
	return nil
}

// SizeUnit is the step LVM rounds the size of an LV with these options to,
// in a volume group of extent-byte extents: one extent, or one per stripe
// for a striped LV (each stripe holds whole extents). A caller that must
// stay within a limit rounds to this, not to the extent alone.
func (o LVOptions) SizeUnit(extent uint64) uint64 {
	if o.Stripes > 1 {
		return extent * uint64(o.Stripes)
	}
	return extent
}

// IsZero reports whether o asks for LVM's defaults.
func (o LVOptions) IsZero() bool { return o == LVOptions{} }

// Validate checks a request before any command runs.
func (r CreateRequest) Validate() error {
	if err := ValidateVGName(r.VolumeGroup); err != nil {
		return err
	}
	if err := ValidateLVName(r.Name); err != nil {
		return err
	}
	if r.Size > MaxSize {
		return invalid("size %d is larger than %d bytes", r.Size, uint64(MaxSize))
	}
	if err := validateTags(r.Tags); err != nil {
		return err
	}
	if err := r.Options.Validate(); err != nil {
		return err
	}
	if r.ThinPool != "" {
		if err := ValidateLVName(r.ThinPool); err != nil {
			return fmt.Errorf("thin pool: %w", err)
		}
		if !r.Options.IsZero() {
			return invalid("options (stripes, stripeSize, mirrors) do not apply to thin volumes in pool %q", r.ThinPool)
		}
	}
	return nil
}
