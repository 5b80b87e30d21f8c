package lvm

import (
	"errors"
	"strings"
	"testing"
)

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
