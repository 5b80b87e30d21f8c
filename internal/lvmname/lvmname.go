// Package lvmname holds LVM's rules for names and tags (lvm(8) "VALID NAMES"), checked
// before any command runs and on every volume and snapshot ID parsed.
package lvmname

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalid is what every refusal here wraps.
var ErrInvalid = errors.New("invalid argument")

const (
	// MaxNameLength is the longest VG or LV name LVM accepts (NAME_LEN - 1).
	MaxNameLength = 127
	// MaxTagLength is the longest tag carve passes to LVM.
	MaxTagLength = 1024
)

// LV names LVM reserves, with newer releases' integrity layers: refusing a name LVM
// would accept is harmless, the reverse is not.
var (
	reservedLVPrefixes   = []string{"snapshot", "pvmove"}
	reservedLVSubstrings = []string{
		"_cdata", "_cmeta", "_corig", "_idata", "_imeta", "_iorig", "_mimage", "_mlog",
		"_pmspare", "_rimage", "_rmeta", "_tdata", "_tmeta", "_vdata", "_vorigin", "_wcorig",
	}
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

func isNameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '+' || c == '_' || c == '.' || c == '-'
}

func isTagChar(c byte) bool {
	return isNameChar(c) || strings.IndexByte("/=!:&#", c) >= 0
}

// Validate checks what VG and LV names share; kind names the name in the error.
func Validate(kind, name string) error {
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

// VG reports whether name is a volume group name LVM accepts.
func VG(name string) error { return Validate("volume group", name) }

// LV reports whether name is an LV name LVM accepts, reserved names included.
func LV(name string) error {
	if err := Validate("logical volume", name); err != nil {
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

// Tag reports whether tag is an LVM tag.
func Tag(tag string) error {
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
