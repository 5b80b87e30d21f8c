package lvm

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateNames(t *testing.T) {
	tests := []struct {
		name     string
		vgOK     bool
		lvOK     bool
		wantText string // part of the error, when invalid
	}{
		{"vg0", true, true, ""},
		{"carve-0123456789abcdef0123456789abcdef", true, true, ""},
		{"a+b_c.d-e", true, true, ""},
		{"A", true, true, ""},
		{".hidden", true, true, ""},
		{"...", true, true, ""},
		{strings.Repeat("x", 127), true, true, ""},
		{"", false, false, "empty"},
		{".", false, false, "reserved"},
		{"..", false, false, "reserved"},
		{"-y", false, false, "begins with '-'"},
		{"--force", false, false, "begins with '-'"},
		{strings.Repeat("x", 128), false, false, "at most 127"},
		{"a b", false, false, "allowed are"},
		{"a/b", false, false, "allowed are"},
		{"a;rm", false, false, "allowed are"},
		{"ümlaut", false, false, "allowed are"},
		{"a\x00b", false, false, "allowed are"},
		{"snapshot", true, false, "reserved by LVM"},
		{"snapshot1", true, false, "reserved by LVM"},
		{"pvmove0", true, false, "reserved by LVM"},
		{"data_tdata", true, false, "reserved by LVM"},
		{"x_tmeta", true, false, "reserved by LVM"},
		{"x_rimage_0", true, false, "reserved by LVM"},
		{"x_mlog", true, false, "reserved by LVM"},
		{"lvol0_pmspare", true, false, "reserved by LVM"},
		{"a_vorigin", true, false, "reserved by LVM"},
		{"my-snapshot", true, true, ""}, // only the prefix is reserved
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			check := func(kind string, err error, ok bool) {
				if ok {
					if err != nil {
						t.Errorf("%s %q: unexpected error %v", kind, tt.name, err)
					}
					return
				}
				if !errors.Is(err, ErrInvalidArgument) {
					t.Errorf("%s %q: error %v, want ErrInvalidArgument", kind, tt.name, err)
				} else if !strings.Contains(err.Error(), tt.wantText) {
					t.Errorf("%s %q: error %q does not say %q", kind, tt.name, err, tt.wantText)
				}
			}
			check("VG", ValidateVGName(tt.name), tt.vgOK)
			check("LV", ValidateLVName(tt.name), tt.lvOK)
		})
	}
}

func TestValidateTag(t *testing.T) {
	tests := []struct {
		tag string
		ok  bool
	}{
		{"carve.dev/owner=carve", true},
		{"carve.dev/volume=7076632d31", true},
		{"A-Za-z0-9_+.-/=!:&#", true},
		{"-leading-hyphen", true}, // LVM allows it; it is an option value, never an option
		{strings.Repeat("t", 1024), true},
		{"", false},
		{strings.Repeat("t", 1025), false},
		{"a,b", false}, // the separator of lv_tags
		{"a b", false},
		{"a@b", false},
		{"a\"b", false},
		{"a$b", false},
		{"ü", false},
	}
	for _, tt := range tests {
		t.Run(tt.tag, func(t *testing.T) {
			err := ValidateTag(tt.tag)
			if tt.ok != (err == nil) {
				t.Fatalf("ValidateTag(%q) = %v, want ok=%v", tt.tag, err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("error %v is not ErrInvalidArgument", err)
			}
		})
	}
}

func TestValidateOptions(t *testing.T) {
	tests := []struct {
		name string
		o    LVOptions
		want string // "" when valid, else part of the error
	}{
		{"zero", LVOptions{}, ""},
		{"stripes 2", LVOptions{Stripes: 2}, ""},
		{"stripes 1 is linear", LVOptions{Stripes: 1}, ""},
		{"stripes with size", LVOptions{Stripes: 4, StripeSize: 64 << 10}, ""},
		{"mirrors 1", LVOptions{Mirrors: 1}, ""},
		{"mirrors 9", LVOptions{Mirrors: 9}, ""},
		{"stripes 128", LVOptions{Stripes: 128}, ""},
		{"negative stripes", LVOptions{Stripes: -1}, "stripes is -1"},
		{"too many stripes", LVOptions{Stripes: 129}, "stripes is 129"},
		{"negative mirrors", LVOptions{Mirrors: -1}, "mirrors is -1"},
		{"too many mirrors", LVOptions{Mirrors: 10}, "mirrors is 10"},
		{"stripe size without stripes", LVOptions{StripeSize: 64 << 10}, "needs stripes"},
		{"stripe size not power of two", LVOptions{Stripes: 2, StripeSize: 96 << 10}, "power of two"},
		{"stripe size too small", LVOptions{Stripes: 2, StripeSize: 2048}, "power of two"},
		{"raid10 is not allowed", LVOptions{Stripes: 2, Mirrors: 1}, "cannot be combined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantInvalid(t, tt.o.Validate(), tt.want)
		})
	}
}

func TestValidateCreateRequest(t *testing.T) {
	ok := CreateRequest{VolumeGroup: "vg0", Name: "carve-1", Size: 1 << 30, Tags: []string{"carve.dev/owner=carve"}}
	tests := []struct {
		name string
		edit func(*CreateRequest)
		want string
	}{
		{"valid", func(*CreateRequest) {}, ""},
		{"valid thin", func(r *CreateRequest) { r.ThinPool = "pool0" }, ""},
		{"bad vg", func(r *CreateRequest) { r.VolumeGroup = "-vg" }, "volume group name"},
		{"bad name", func(r *CreateRequest) { r.Name = "a b" }, "logical volume name"},
		{"reserved name", func(r *CreateRequest) { r.Name = "snapshot7" }, "reserved"},
		{"bad tag", func(r *CreateRequest) { r.Tags = []string{"ok", "not ok"} }, "tag"},
		{"bad pool", func(r *CreateRequest) { r.ThinPool = "--pool" }, "thin pool"},
		{"thin with stripes", func(r *CreateRequest) { r.ThinPool = "pool0"; r.Options.Stripes = 2 }, "do not apply to thin"},
		{"bad options", func(r *CreateRequest) { r.Options.Mirrors = 12 }, "mirrors"},
		{"huge size", func(r *CreateRequest) { r.Size = 1<<63 + 1 }, "larger than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			r.Tags = append([]string(nil), ok.Tags...)
			tt.edit(&r)
			wantInvalid(t, r.Validate(), tt.want)
		})
	}
}

// wantInvalid fails the test unless err is nil when want is empty, or
// else an ErrInvalidArgument whose message contains want.
func wantInvalid(t *testing.T, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("unexpected error %v", err)
		}
		return
	}
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want ErrInvalidArgument saying %q", err, want)
	}
}

// SizeUnit is the step roundToExtents (what CreateLV asks LVM for) rounds
// to: a size that is a multiple of it is not rounded further.
func TestSizeUnitIsTheStepCreateRoundsTo(t *testing.T) {
	const ext = 4 << 20
	for _, o := range []LVOptions{{}, {Stripes: 1}, {Stripes: 2}, {Stripes: 3, StripeSize: 64 << 10}, {Mirrors: 2}} {
		unit := o.SizeUnit(ext)
		for _, k := range []uint64{1, 2, 7, 250} {
			if got := roundToExtents(k*unit, ext, o.Stripes); got != k*unit {
				t.Errorf("%+v: %d units of %d bytes round to %d", o, k, unit, got)
			}
			if got := roundToExtents(k*unit+1, ext, o.Stripes); got != (k+1)*unit {
				t.Errorf("%+v: %d units and a byte round to %d, want %d", o, k, got, (k+1)*unit)
			}
		}
	}
}
