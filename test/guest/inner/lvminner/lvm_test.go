//go:build guestinner

package lvminner

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/test/harness/lvmtest"
)

func newClient(vg *lvmtest.LoopVG) *lvm.Client {
	return lvm.New(lvm.Options{Timeout: 2 * time.Minute, Env: vg.Env()})
}

// newThinLV is a new 1 GiB volume group with the thin pool "pool" of
// poolSize, a client of it, and the thin LV name of size made in the pool.
func newThinLV(t *testing.T, poolSize uint64, name string, size uint64) (*lvmtest.LoopVG, *lvm.Client, *lvm.LogicalVolume) {
	t.Helper()
	vg := newVG(t, gib)
	newThinPool(t, vg, "pool", poolSize)
	c := newClient(vg)
	lv, err := c.CreateLV(testContext(t), lvm.CreateRequest{VolumeGroup: vg.Name, Name: name, Size: size, ThinPool: "pool"})
	if err != nil {
		t.Fatal(err)
	}
	return vg, c, lv
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestActivation: with device-mapper, a created LV is active and has its
// device node, and removing it takes the node away.
func TestActivation(t *testing.T) {
	ctx := testContext(t)
	vg := newVG(t, gib)
	c := newClient(vg)
	tests := []struct {
		name     string
		size     uint64
		wantSize uint64
		tags     []string
	}{
		{name: "exact", size: 8 * mib, wantSize: 8 * mib, tags: []string{"carve.dev/v=a"}},
		{name: "rounded", size: 10*mib + 1, wantSize: 12 * mib},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lv, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: vg.Name, Name: "act-" + tt.name, Size: tt.size, Tags: tt.tags})
			if err != nil {
				t.Fatal(err)
			}
			if !isBlockDevice(lv.Path) {
				t.Fatalf("%s is not a block device after CreateLV", lv.Path)
			}
			got, err := c.GetLV(ctx, vg.Name, lv.Name)
			if err != nil {
				t.Fatal(err)
			}
			if !got.Attr.Active || got.Attr.Type != lvm.TypeThick || got.Size != tt.wantSize {
				t.Errorf("GetLV = active %v type %s size %d, want active thick %d (attr %q)",
					got.Attr.Active, got.Attr.Type, got.Size, tt.wantSize, got.Attr.Raw)
			}
			if err := c.RemoveLV(ctx, vg.Name, lv.Name); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(lv.Path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s still there after RemoveLV: %v", lv.Path, err)
			}
			if _, err := c.GetLV(ctx, vg.Name, lv.Name); !errors.Is(err, lvm.ErrNotFound) {
				t.Errorf("GetLV after RemoveLV = %v, want ErrNotFound", err)
			}
		})
	}
}

// TestThinVolumeAndPoolUsage: a thin LV larger than its pool is created and
// active, and after data is written Report shows the pool's usage.
func TestThinVolumeAndPoolUsage(t *testing.T) {
	ctx := testContext(t)
	vg, c, lv := newThinLV(t, 128*mib, "thin1", 512*mib)
	if !isBlockDevice(lv.Path) {
		t.Fatalf("%s is not a block device", lv.Path)
	}
	fill(t, lv.Path, 0x5a, int(32*mib))

	r, err := c.Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := r.FindLV(vg.Name, "thin1")
	if got == nil || got.Attr.Type != lvm.TypeThin || got.Pool != "pool" || !got.Attr.Active || got.Size != 512*mib {
		t.Fatalf("Report LV thin1 = %+v, want an active thin LV of 512 MiB in pool", got)
	}
	p := r.FindThinPool(vg.Name, "pool")
	if p == nil {
		t.Fatalf("Report has no thin pool %s/pool: %+v", vg.Name, r.ThinPools)
	}
	t.Logf("pool: size %d data %.2f%% metadata %.2f%% virtual %d thin volumes %d", p.Size, p.DataPercent, p.MetadataPercent, p.VirtualSize, p.ThinVolumes)
	// 32 MiB of 128 MiB written: 25% (LVM rounds to chunks).
	if p.Size != 128*mib || p.DataPercent < 20 || p.DataPercent > 30 {
		t.Errorf("pool size %d data %.2f%%, want 128 MiB and about 25%%", p.Size, p.DataPercent)
	}
	if p.MetadataPercent <= 0 || p.MetadataPercent >= 100 {
		t.Errorf("pool metadata %.2f%%, want between 0 and 100", p.MetadataPercent)
	}
	if p.VirtualSize != 512*mib || p.ThinVolumes != 1 {
		t.Errorf("pool virtual size %d with %d thin volumes, want 512 MiB and 1", p.VirtualSize, p.ThinVolumes)
	}
}

// TestThinSnapshot: a snapshot is active on creation and keeps the origin's
// data from the moment it was taken while the origin changes.
func TestThinSnapshot(t *testing.T) {
	ctx := testContext(t)
	vg, c, origin := newThinLV(t, 256*mib, "origin", 64*mib)
	fill(t, origin.Path, 'A', int(4*mib))
	snap, err := c.CreateThinSnapshot(ctx, vg.Name, "origin", "snap", []string{"carve.dev/snapshot"})
	if err != nil {
		t.Fatal(err)
	}
	fill(t, origin.Path, 'B', int(4*mib))

	if !isBlockDevice(snap.Path) {
		t.Fatalf("snapshot %s is not a block device: activation was skipped", snap.Path)
	}
	if got := readHead(t, snap.Path, int(4*mib)); !bytes.Equal(got, bytes.Repeat([]byte{'A'}, int(4*mib))) {
		t.Errorf("snapshot does not hold the origin's data from before the snapshot (first byte %q)", got[0])
	}
	if got := readHead(t, origin.Path, 1); got[0] != 'B' {
		t.Errorf("origin reads %q after the rewrite, want B", got[0])
	}
	lv, err := c.GetLV(ctx, vg.Name, "snap")
	if err != nil {
		t.Fatal(err)
	}
	if lv.Attr.Type != lvm.TypeThin || lv.Origin != "origin" || lv.Pool != "pool" || lv.Size != 64*mib || lv.Attr.ActivationSkip {
		t.Errorf("GetLV(snap) = %+v, want a thin LV of 64 MiB with origin origin in pool, activation not skipped", lv)
	}
	found, err := c.FindByTag(ctx, vg.Name, "carve.dev/snapshot")
	if err != nil || len(found) != 1 || found[0].Name != "snap" {
		t.Errorf("FindByTag = %v, %v, want the snapshot", found, err)
	}
}

// TestOnlineExtendExt4: a mounted ext4 on a thick LV grows with ExtendLV
// and resize2fs while its data stays readable.
func TestOnlineExtendExt4(t *testing.T) {
	ctx := testContext(t)
	vg := newVG(t, gib)
	c := newClient(vg)
	lv, dir := newMountedExt4(t, ctx, c, vg.Name, "grow")
	data := bytes.Repeat([]byte("carve"), 1000)
	if err := os.WriteFile(filepath.Join(dir, "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	before := fsSize(t, dir)

	grown, err := c.ExtendLV(ctx, vg.Name, "grow", 200*mib)
	if err != nil {
		t.Fatal(err)
	}
	if grown.Size != 200*mib {
		t.Errorf("ExtendLV size = %d, want %d", grown.Size, 200*mib)
	}
	run(t, "resize2fs", lv.Path)
	after := fsSize(t, dir)
	t.Logf("filesystem size %d -> %d bytes", before, after)
	if before > 64*mib || after < 180*mib {
		t.Errorf("filesystem size %d -> %d, want <= 64 MiB then >= 180 MiB", before, after)
	}
	got, err := os.ReadFile(filepath.Join(dir, "f"))
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("file after the resize: %v, equal %v", err, bytes.Equal(got, data))
	}
	// Asking again for a size it already has changes nothing.
	again, err := c.ExtendLV(ctx, vg.Name, "grow", 100*mib)
	if err != nil || again.Size != 200*mib {
		t.Errorf("ExtendLV to a smaller size = %+v, %v, want the LV unchanged at 200 MiB", again, err)
	}
}

// TestFilesystemSmoke: each filesystem carve offers is made on a created
// LV, mounted, written, unmounted, mounted again and read back.
func TestFilesystemSmoke(t *testing.T) {
	ctx := testContext(t)
	vg := newVG(t, 2*gib)
	c := newClient(vg)
	tests := []struct {
		fs   string
		size uint64
		mkfs []string
	}{
		{fs: "ext4", size: 64 * mib, mkfs: []string{"mkfs.ext4", "-q", "-F"}},
		// mkfs.xfs refuses filesystems smaller than 300 MiB.
		{fs: "xfs", size: 320 * mib, mkfs: []string{"mkfs.xfs", "-q", "-f"}},
		{fs: "btrfs", size: 256 * mib, mkfs: []string{"mkfs.btrfs", "-q", "-f"}},
	}
	for _, tt := range tests {
		t.Run(tt.fs, func(t *testing.T) {
			lv, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: vg.Name, Name: "fs-" + tt.fs, Size: tt.size})
			if err != nil {
				t.Fatal(err)
			}
			run(t, tt.mkfs[0], append(tt.mkfs[1:], lv.Path)...)
			if got := run(t, "blkid", "-o", "value", "-s", "TYPE", lv.Path); got != tt.fs+"\n" {
				t.Errorf("blkid TYPE = %q, want %s", got, tt.fs)
			}
			data := bytes.Repeat([]byte{0xc3}, int(3*mib))
			dir := mount(t, lv.Path, tt.fs)
			if err := os.WriteFile(filepath.Join(dir, "data"), data, 0o644); err != nil {
				t.Fatal(err)
			}
			unmount(t, dir)
			dir = mount(t, lv.Path, tt.fs)
			got, err := os.ReadFile(filepath.Join(dir, "data"))
			if err != nil || !bytes.Equal(got, data) {
				t.Errorf("data after remount: %v, equal %v", err, bytes.Equal(got, data))
			}
			unmount(t, dir)
			if err := c.RemoveLV(ctx, vg.Name, lv.Name); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRemoveOpenLV: an LV that is mounted cannot be removed, and stays.
func TestRemoveOpenLV(t *testing.T) {
	ctx := testContext(t)
	vg := newVG(t, gib)
	c := newClient(vg)
	newMountedExt4(t, ctx, c, vg.Name, "busy")
	if err := c.RemoveLV(ctx, vg.Name, "busy"); err == nil {
		t.Fatal("RemoveLV of a mounted LV succeeded")
	}
	got, err := c.GetLV(ctx, vg.Name, "busy")
	if err != nil || !got.Attr.Open {
		t.Errorf("GetLV after the refused remove = %+v, %v, want it there and open", got, err)
	}
}

// newMountedExt4 creates a 64 MiB thick LV name in vg, makes ext4 on it
// and mounts it; it returns the LV and the mount point.
func newMountedExt4(t *testing.T, ctx context.Context, c *lvm.Client, vg, name string) (*lvm.LogicalVolume, string) {
	t.Helper()
	lv, err := c.CreateLV(ctx, lvm.CreateRequest{VolumeGroup: vg, Name: name, Size: 64 * mib})
	if err != nil {
		t.Fatal(err)
	}
	run(t, "mkfs.ext4", "-q", "-F", lv.Path)
	return lv, mount(t, lv.Path, "ext4")
}

// mount mounts dev on a new directory and unmounts it when the test ends
// (unless the test did).
func mount(t *testing.T, dev, fstype string) string {
	t.Helper()
	dir, err := os.MkdirTemp(t.TempDir(), "mnt")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(dev, dir, fstype, 0, ""); err != nil {
		t.Fatalf("mount %s on %s (%s): %v", dev, dir, fstype, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, 0); err != nil && !errors.Is(err, syscall.EINVAL) {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

func unmount(t *testing.T, dir string) {
	t.Helper()
	if err := syscall.Unmount(dir, 0); err != nil {
		t.Fatalf("unmount %s: %v", dir, err)
	}
}

// fsSize is the filesystem's total size in bytes.
func fsSize(t *testing.T, dir string) uint64 {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * uint64(st.Bsize)
}
