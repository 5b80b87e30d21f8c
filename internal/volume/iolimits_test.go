package volume

import (
	"errors"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/lvmname"
)

func TestParseIOLimits(t *testing.T) {
	base := IOLimits{ReadBPS: 1, WriteIOPS: 7}
	for _, tc := range []struct {
		name    string
		params  map[string]string
		others  bool
		want    IOLimits
		wantErr string
	}{
		{name: "none keeps base", params: nil, want: base},
		{name: "every one", params: map[string]string{
			ParamReadBytesPerSecond: "20Mi", ParamWriteBytesPerSecond: "1000000",
			ParamReadIOPS: "100", ParamWriteIOPS: "max"},
			want: IOLimits{ReadBPS: 20 << 20, WriteBPS: 1000000, ReadIOPS: 100}},
		{name: "decimal suffix", params: map[string]string{ParamWriteBytesPerSecond: "1G"}, want: IOLimits{ReadBPS: 1, WriteBPS: 1e9, WriteIOPS: 7}},
		{name: "max lifts", params: map[string]string{ParamReadBytesPerSecond: "max"}, want: IOLimits{WriteIOPS: 7}},
		{name: "other keys ignored", params: map[string]string{ParamDeviceClass: "fast", ParamReadIOPS: "5"}, others: true, want: IOLimits{ReadBPS: 1, ReadIOPS: 5, WriteIOPS: 7}},
		{name: "other keys refused", params: map[string]string{"XXX_FakeKey": "x"}, wantErr: "XXX_FakeKey: not a mutable parameter of carve; allowed: carve.dev/read-bytes-per-second, carve.dev/read-iops"},
		{name: "zero", params: map[string]string{ParamWriteIOPS: "0"}, wantErr: `carve.dev/write-iops: "0" is not a limit; allowed: a whole number from 1 to 4294967294, or "max" for none`},
		{name: "negative bytes", params: map[string]string{ParamWriteBytesPerSecond: "-1Mi"}, wantErr: `carve.dev/write-bytes-per-second: "-1Mi" is not a limit; allowed: bytes per second`},
		{name: "fraction of a byte", params: map[string]string{ParamWriteBytesPerSecond: "0.5"}, wantErr: "is not a limit"},
		{name: "too many iops", params: map[string]string{ParamReadIOPS: "4294967295"}, wantErr: "is not a limit"},
		{name: "iops with suffix", params: map[string]string{ParamReadIOPS: "1k"}, wantErr: "is not a limit"},
		{name: "too many bytes", params: map[string]string{ParamReadBytesPerSecond: "5Ei"}, wantErr: "is not a limit"},
		{name: "empty", params: map[string]string{ParamReadBytesPerSecond: ""}, wantErr: "is not a limit"},
		{name: "Max spelled otherwise", params: map[string]string{ParamReadIOPS: "MAX"}, wantErr: "is not a limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseIOLimits(tc.params, base, tc.others)
			if tc.wantErr != "" {
				var le *IOLimitError
				if err == nil || !errors.As(err, &le) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want an *IOLimitError with %q", err, tc.wantErr)
				}
				if got != base {
					t.Errorf("a refused value changed the limits to %+v", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseIOLimits = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestIOLimitTagsRoundTrip(t *testing.T) {
	for _, l := range []IOLimits{{}, {ReadBPS: 1}, {WriteBPS: MaxBytesPerSecond, ReadIOPS: MaxIOPS, WriteIOPS: 3, ReadBPS: 4096}} {
		tags := IOLimitTags(l)
		if len(tags) > 4 || (len(tags) == 0) == l.Any() {
			t.Errorf("IOLimitTags(%+v) = %v", l, tags)
		}
		for _, tag := range tags {
			if err := lvmname.Tag(tag); err != nil {
				t.Errorf("tag %q: %v", tag, err)
			}
			if !IsIOLimitTag(tag) {
				t.Errorf("IsIOLimitTag(%q) = false", tag)
			}
		}
		if got := IOLimitsFromTags(append([]string{TagOwner, "carve.dev/rbps=junk"}, tags...)); got != l {
			t.Errorf("IOLimitsFromTags(IOLimitTags(%+v)) = %+v", l, got)
		}
	}
	if IsIOLimitTag(TagOwner) {
		t.Error("the owner tag is an IO limit tag")
	}
	if got := IOLimitsFromTags([]string{"carve.dev/wiops=0", "carve.dev/riops=4294967295"}); got.Any() {
		t.Errorf("out of bounds tags read as %+v", got)
	}
}

func TestIOLimitsString(t *testing.T) {
	if got, want := (IOLimits{WriteBPS: 10485760, ReadIOPS: 50}).String(), "rbps=max wbps=10485760 riops=50 wiops=max"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}
