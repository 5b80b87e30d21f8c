package deviceclass

import (
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/carve-csi/carve/internal/lvmname"
	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/internal/node/lvm"
)

// Load reads and validates the device-class file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path) //nolint:gosec // G304: the file the operator names with --config
	if err != nil {
		return nil, fmt.Errorf("read device-class file: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("device-class file %s: %w", path, err)
	}
	return cfg, nil
}

// Parse decodes a device-class file, rejecting unknown keys, and validates.
func Parse(data []byte) (*Config, error) {
	// The case-sensitive strict decoder rejects "thinpool" for "thinPool":
	// yaml.UnmarshalStrict's encoding/json matches keys ignoring case.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	var cfg Config
	strictErrs, err := kjson.UnmarshalStrict(js, &cfg, kjson.DisallowUnknownFields, kjson.DisallowDuplicateFields)
	if err != nil {
		return nil, fmt.Errorf("decode: %w", err)
	}
	if len(strictErrs) > 0 {
		return nil, fmt.Errorf("decode: %w", errors.Join(strictErrs...))
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

var dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// IsClassName tells whether name is a DNS-1123 label.
func IsClassName(name string) bool {
	return len(name) <= 63 && dns1123Label.MatchString(name)
}

// Validate checks the file without looking at the machine; every problem is
// reported, naming the class and key.
func (c *Config) Validate() error {
	var errs []error
	if len(c.DeviceClasses) == 0 {
		errs = append(errs, errors.New("deviceClasses: at least one device class is needed"))
	}
	seen := map[string]bool{}
	defaults := []string{}
	for i := range c.DeviceClasses {
		d := &c.DeviceClasses[i]
		where := fmt.Sprintf("deviceClasses[%d]", i)
		if d.Name != "" {
			where = fmt.Sprintf("deviceClasses[%d] (%s)", i, d.Name)
		}
		if err := d.validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
		}
		if d.Name != "" {
			if seen[d.Name] {
				errs = append(errs, fmt.Errorf("%s: name %q is used by more than one device class", where, d.Name))
			}
			seen[d.Name] = true
		}
		if d.Default {
			defaults = append(defaults, d.Name)
		}
	}
	if len(defaults) > 1 {
		errs = append(errs, fmt.Errorf("deviceClasses: at most one class may be the default, found %d: %q", len(defaults), defaults))
	}
	return errors.Join(errs...)
}

func (d *DeviceClass) validate() error {
	var errs []error
	switch {
	case d.Name == "":
		errs = append(errs, errors.New("name: must be set"))
	case !IsClassName(d.Name):
		errs = append(errs, fmt.Errorf("name %q: must be a DNS-1123 label (lower-case letters, digits and '-', at most 63 characters)", d.Name))
	}
	if d.VolumeGroup == "" {
		errs = append(errs, errors.New("volumeGroup: must be set"))
	} else if err := lvmname.VG(d.VolumeGroup); err != nil {
		errs = append(errs, fmt.Errorf("volumeGroup: %w", err))
	}
	switch {
	case d.Spare == nil:
	case d.Spare.Sign() < 0:
		errs = append(errs, fmt.Errorf("spare %s: must not be negative", d.Spare))
	case d.Spare.Cmp(*resource.NewQuantity(lvm.MaxSize, resource.BinarySI)) > 0:
		// Quantity.Value of a larger spare overflows int64 (1e30 reads as 0).
		errs = append(errs, fmt.Errorf("spare %s: at most %d bytes (the largest size carve gives LVM)", d.Spare, int64(lvm.MaxSize)))
	}
	if d.Thin() {
		if err := lvmname.LV(d.ThinPool); err != nil {
			errs = append(errs, fmt.Errorf("thinPool: %w", err))
		}
		if d.OverprovisionRatio != 0 && (d.OverprovisionRatio < 1 || math.IsInf(d.OverprovisionRatio, 0) || math.IsNaN(d.OverprovisionRatio)) {
			errs = append(errs, fmt.Errorf("overprovisionRatio %v: must be at least 1", d.OverprovisionRatio))
		}
		if d.LVCreateOptions != (lvm.LVOptions{}) {
			errs = append(errs, errors.New("lvcreateOptions: only thick classes (no thinPool) take lvcreate options"))
		}
		if d.Erase != "" {
			errs = append(errs, errors.New("erase: only thick classes (no thinPool) take an erase method; a thin volume reads zeros where it was never written when its pool zeroes new blocks"))
		}
		if d.SnapshotSpacePercent != 0 {
			errs = append(errs, errors.New("snapshotSpacePercent: only thick classes (no thinPool) take a snapshot space; a thin snapshot shares its pool"))
		}
	} else {
		if d.OverprovisionRatio != 0 {
			errs = append(errs, errors.New("overprovisionRatio: only thin classes (with thinPool) take an overprovision ratio"))
		}
		if err := d.LVCreateOptions.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("lvcreateOptions: %w", err))
		}
		if d.Erase != "" && !erase.IsMethod(string(d.Erase)) {
			errs = append(errs, fmt.Errorf("erase %q: must be one of %v", d.Erase, erase.Methods))
		}
		if p := d.SnapshotSpacePercent; p < 0 || p > 100 {
			errs = append(errs, fmt.Errorf("snapshotSpacePercent %d: must be 1-100 (0 or unset: %d)", p, DefaultSnapshotSpacePercent))
		}
	}
	for _, t := range sortedKeys(d.MkfsOptions) {
		if !slices.Contains(fs.MkfsTypes, t) {
			errs = append(errs, fmt.Errorf("mkfsOptions.%s: not a filesystem carve makes; allowed: %s", t, strings.Join(fs.MkfsTypes, ", ")))
		} else if err := fs.ValidateMkfsOptions(t, d.MkfsOptions[t]); err != nil {
			errs = append(errs, fmt.Errorf("mkfsOptions.%s%w", t, err))
		}
	}
	return errors.Join(errs...)
}

func sortedKeys(m map[string][]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Class returns the class named name, or the default for "".
func (c *Config) Class(name string) (*DeviceClass, bool) {
	for i := range c.DeviceClasses {
		d := &c.DeviceClasses[i]
		if (name == "" && d.Default) || (name != "" && d.Name == name) {
			return d, true
		}
	}
	return nil, false
}

// VolumeGroups lists the classes' volume groups once each, in file order.
func (c *Config) VolumeGroups() []string {
	var vgs []string
	for _, d := range c.DeviceClasses {
		if !slices.Contains(vgs, d.VolumeGroup) {
			vgs = append(vgs, d.VolumeGroup)
		}
	}
	return vgs
}

// HasVolumeGroup tells whether a class uses volume group vg.
func (c *Config) HasVolumeGroup(vg string) bool { return slices.Contains(c.VolumeGroups(), vg) }

// Names lists the class names in file order.
func (c *Config) Names() []string {
	names := make([]string, 0, len(c.DeviceClasses))
	for _, d := range c.DeviceClasses {
		names = append(names, d.Name)
	}
	return names
}

// SpareBytes is the spare in bytes (0 when unset).
func (d *DeviceClass) SpareBytes() uint64 {
	if d.Spare == nil || d.Spare.Sign() <= 0 {
		return 0
	}
	return uint64(d.Spare.Value())
}

// Ratio is the overprovision ratio with its default of 1 applied.
func (d *DeviceClass) Ratio() float64 {
	if d.OverprovisionRatio == 0 {
		return 1
	}
	return d.OverprovisionRatio
}

// SnapshotCowSize is the copy-on-write space of a snapshot of a thick volume
// of size bytes: SnapshotSpacePercent of it, plus 1/128 for the store's own
// metadata (16 bytes per 4 KiB chunk, twice over), so 100 % holds a rewrite
// of the whole volume.
func (d *DeviceClass) SnapshotCowSize(size uint64) uint64 {
	p := uint64(d.SnapshotSpacePercent)
	if p == 0 {
		p = DefaultSnapshotSpacePercent
	}
	// size is at most lvm.MaxSize (2^62), so nothing here overflows.
	data := size/100*p + (size%100*p+99)/100
	return data + (data+127)/128
}
