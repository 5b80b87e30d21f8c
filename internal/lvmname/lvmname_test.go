package lvmname

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
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("%s %q: error %v, want ErrInvalid", kind, tt.name, err)
				} else if !strings.Contains(err.Error(), tt.wantText) {
					t.Errorf("%s %q: error %q does not say %q", kind, tt.name, err, tt.wantText)
				}
			}
			check("VG", VG(tt.name), tt.vgOK)
			check("LV", LV(tt.name), tt.lvOK)
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
			err := Tag(tt.tag)
			if tt.ok != (err == nil) {
				t.Fatalf("Tag(%q) = %v, want ok=%v", tt.tag, err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v is not ErrInvalid", err)
			}
		})
	}
}
