//go:build hosttest

package host

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/test/harness/lvmtest"
)

// The benchmarks time the package against the raw lvm commands on the same
// VG in the same run; compare the ns/op of each pair (the guest tier's
// `make bench` reports the ratio with activation on):
//
//	sudo go test -tags hosttest -run '^$' -bench . ./test/host/

func BenchmarkThickCreateRemove(b *testing.B) {
	v := lvmtest.New(b, lvmtest.Options{Size: 256 * mib})
	ctx := context.Background()
	b.Run("raw", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			rawCreateRemove(ctx, b, v, fmt.Sprintf("raw%d", i), 4194304)
		}
	})
	b.Run("package", func(b *testing.B) {
		c := lvm.New(lvm.Options{Env: v.Env(), Timeout: time.Minute})
		if _, err := c.VolumeGroup(ctx, v.Name); err != nil { // warm the extent-size cache
			b.Fatal(err)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			name := fmt.Sprintf("pkg%d", i)
			if _, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: name, Size: 4 * mib}); err != nil {
				b.Fatal(err)
			}
			if err := c.RemoveLV(ctx, v.Name, name); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkRefresh(b *testing.B) {
	v := lvmtest.New(b, lvmtest.Options{Size: 256 * mib})
	ctx := context.Background()
	c := lvm.New(lvm.Options{Env: v.Env(), Timeout: time.Minute})
	for i := 0; i < 8; i++ {
		if _, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: v.Name, Name: fmt.Sprintf("lv%d", i), Size: mib}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("raw-lvs", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := v.LVM(ctx, "lvs", "--reportformat", "json", "--units", "b", "--nosuffix"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("package-report", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := c.Report(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// rawCreateRemove creates LV name of size bytes in vg with lvcreate, as
// carve creates a thick volume (signatures wiped, zeroed), and removes
// it with lvremove; a failure fails tb.
func rawCreateRemove(ctx context.Context, tb testing.TB, vg *lvmtest.LoopVG, name string, size int64) {
	tb.Helper()
	if _, err := vg.LVM(ctx, "lvcreate", "--yes", "--wipesignatures", "y", "--zero", "y",
		"--name", name, "--size", strconv.FormatInt(size, 10)+"b", vg.Name); err != nil {
		tb.Fatal(err)
	}
	if _, err := vg.LVM(ctx, "lvremove", "--yes", vg.Name+"/"+name); err != nil {
		tb.Fatal(err)
	}
}
