package lvm

import (
	"fmt"
	"math/bits"

	"github.com/carve-csi/carve/internal/lvmname"
)

// carve's limits within LVM's, checked before any command runs: a bad value
// is ErrInvalidArgument and never becomes an argv element.
const (
	MaxStripes = 128
	MaxMirrors = 9
	// MaxSize keeps extent arithmetic far from overflow.
	MaxSize       = 1 << 62
	minStripeSize = 4 << 10
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
}

func validateName(kind, name string) error { return lvmname.Validate(kind, name) }

func validateLV(vg, name string) error {
	if err := lvmname.VG(vg); err != nil {
		return err
	}
	return validateName("logical volume", name)
}

func validateTags(tags []string) error {
	for _, t := range tags {
		if err := lvmname.Tag(t); err != nil {
			return err
		}
	}
	return nil
}

// Validate checks o against carve's allow-list and LVM's limits: stripes
// 0-128, a power-of-two stripe size >= 4 KiB with stripes > 1, mirrors 0-9,
// not striping and mirroring at once.
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

// SizeUnit is what LVM rounds an LV's size to; limits round to it.
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
	if err := lvmname.VG(r.VolumeGroup); err != nil {
		return err
	}
	if err := lvmname.LV(r.Name); err != nil {
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
		if err := lvmname.LV(r.ThinPool); err != nil {
			return fmt.Errorf("thin pool: %w", err)
		}
		if !r.Options.IsZero() {
			return invalid("options (stripes, stripeSize, mirrors) do not apply to thin volumes in pool %q", r.ThinPool)
		}
	}
	return nil
}
