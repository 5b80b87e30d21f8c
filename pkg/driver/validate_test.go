package driver

import (
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/provision"
)

// A striped LV is rounded by LVM to whole extents per stripe; VolumeSize
// must size it the same way, so that a request never gets a volume larger
// than its limit_bytes.
func TestVolumeSizeStripedClassNeverExceedsLimit(t *testing.T) {
	const (
		m   = 1 << 20
		ext = 4 * m
	)
	tests := []struct {
		name    string
		opts    lvm.LVOptions
		r       *csi.CapacityRange
		fsType  string
		code    codes.Code
		want    uint64
		message []string
	}{
		{name: "linear: one extent fits a limit of one extent", r: &csi.CapacityRange{RequiredBytes: 1, LimitBytes: ext}, code: codes.OK, want: ext},
		{name: "two stripes: one extent asked is two made, above a limit of one", opts: lvm.LVOptions{Stripes: 2},
			r: &csi.CapacityRange{RequiredBytes: 1, LimitBytes: ext}, code: codes.OutOfRange, message: []string{"above limit_bytes 4194304", "8388608"}},
		{name: "three stripes: 10 MiB asked is 12 MiB made, above a limit of 11 MiB", opts: lvm.LVOptions{Stripes: 3},
			r: &csi.CapacityRange{RequiredBytes: 10 * m, LimitBytes: 11 * m}, code: codes.OutOfRange, message: []string{"12582912", "limit_bytes 11534336"}},
		{name: "three stripes: rounded within the limit", opts: lvm.LVOptions{Stripes: 3},
			r: &csi.CapacityRange{RequiredBytes: 10 * m, LimitBytes: 12 * m}, code: codes.OK, want: 12 * m},
		{name: "three stripes without a limit round up", opts: lvm.LVOptions{Stripes: 3},
			r: &csi.CapacityRange{RequiredBytes: 1 << 30}, code: codes.OK, want: 86 * 12 * m},
		{name: "only a limit: the largest multiple of the stripes below it", opts: lvm.LVOptions{Stripes: 3},
			r: &csi.CapacityRange{LimitBytes: 100 * m}, code: codes.OK, want: 96 * m},
		{name: "only a limit below one extent per stripe", opts: lvm.LVOptions{Stripes: 4},
			r: &csi.CapacityRange{LimitBytes: 12 * m}, code: codes.OutOfRange, message: []string{"smaller than one extent"}},
		{name: "xfs floor rounded to stripes above the limit", opts: lvm.LVOptions{Stripes: 7}, fsType: "xfs",
			r: &csi.CapacityRange{RequiredBytes: m, LimitBytes: 300 * m}, code: codes.OutOfRange, message: []string{"limit_bytes 314572800"}},
		{name: "raid1 is not rounded per image", opts: lvm.LVOptions{Mirrors: 1},
			r: &csi.CapacityRange{RequiredBytes: 5 * m, LimitBytes: 8 * m}, code: codes.OK, want: 8 * m},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := provision.VolumeSize(provision.Range{Required: tt.r.GetRequiredBytes(), Limit: tt.r.GetLimitBytes()}, tt.opts.SizeUnit(ext), tt.fsType)
			err = toStatus(err, "")
			if tt.code != codes.OK {
				wantCode(t, err, tt.code, tt.message...)
				return
			}
			if err != nil {
				t.Fatalf("volumeSize: %v", err)
			}
			if got != tt.want {
				t.Errorf("size = %d, want %d", got, tt.want)
			}
			if lim := tt.r.GetLimitBytes(); lim > 0 && got > uint64(lim) {
				t.Errorf("size %d is above limit_bytes %d", got, lim)
			}
		})
	}
}
