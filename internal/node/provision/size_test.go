package provision

import (
	"errors"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/node/lvm"
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
		r       Range
		fsType  string
		kind    error
		want    uint64
		message []string
	}{
		{name: "linear: one extent fits a limit of one extent", r: Range{Required: 1, Limit: ext}, want: ext},
		{name: "two stripes: one extent asked is two made, above a limit of one", opts: lvm.LVOptions{Stripes: 2},
			r: Range{Required: 1, Limit: ext}, kind: ErrOutOfRange, message: []string{"above limit_bytes 4194304", "8388608"}},
		{name: "three stripes: 10 MiB asked is 12 MiB made, above a limit of 11 MiB", opts: lvm.LVOptions{Stripes: 3},
			r: Range{Required: 10 * m, Limit: 11 * m}, kind: ErrOutOfRange, message: []string{"12582912", "limit_bytes 11534336"}},
		{name: "three stripes: rounded within the limit", opts: lvm.LVOptions{Stripes: 3},
			r: Range{Required: 10 * m, Limit: 12 * m}, want: 12 * m},
		{name: "three stripes without a limit round up", opts: lvm.LVOptions{Stripes: 3},
			r: Range{Required: 1 << 30}, want: 86 * 12 * m},
		{name: "only a limit: the largest multiple of the stripes below it", opts: lvm.LVOptions{Stripes: 3},
			r: Range{Limit: 100 * m}, want: 96 * m},
		{name: "only a limit below one extent per stripe", opts: lvm.LVOptions{Stripes: 4},
			r: Range{Limit: 12 * m}, kind: ErrOutOfRange, message: []string{"smaller than one extent"}},
		{name: "xfs floor rounded to stripes above the limit", opts: lvm.LVOptions{Stripes: 7}, fsType: "xfs",
			r: Range{Required: m, Limit: 300 * m}, kind: ErrOutOfRange, message: []string{"limit_bytes 314572800"}},
		{name: "raid1 is not rounded per image", opts: lvm.LVOptions{Mirrors: 1},
			r: Range{Required: 5 * m, Limit: 8 * m}, want: 8 * m},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := VolumeSize(tt.r, tt.opts.SizeUnit(ext), tt.fsType)
			if tt.kind != nil {
				if !errors.Is(err, tt.kind) {
					t.Fatalf("err = %v, want %v", err, tt.kind)
				}
				for _, p := range tt.message {
					if !strings.Contains(err.Error(), p) {
						t.Errorf("message %q does not mention %q", err.Error(), p)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("volumeSize: %v", err)
			}
			if got != tt.want {
				t.Errorf("size = %d, want %d", got, tt.want)
			}
			if lim := tt.r.Limit; lim > 0 && got > uint64(lim) {
				t.Errorf("size %d is above limit_bytes %d", got, lim)
			}
		})
	}
}
