//go:build guestinner

package nodeinner

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/node/directio"
	"github.com/carve-csi/carve/internal/node/marks"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// eraseSize is the size of each volume of the erasure tests: a few extents,
// so that zeroing under TCG takes well under a second.
const eraseSize = 32 * mib

// blockCapability is a single-node-writer raw-block capability.
func blockCapability() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// pattern is what the earlier tenant wrote.
var pattern = bytes.Repeat([]byte{0xA5, 0x5A, 'c', 'a', 'r', 'v', 'e', 0x01}, int(eraseSize)/8)

// writeDevice writes data to a device and flushes it to the disk.
func writeDevice(t *testing.T, dev string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// openDirect opens dev to read with O_DIRECT (past any page cache, so
// what the disk holds) and returns a 1 MiB buffer aligned as O_DIRECT
// asks, and the close the caller defers (an open device cannot be
// removed).
func openDirect(t *testing.T, dev string) (*os.File, []byte, func()) {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	return f, directio.Aligned(int(mib)), func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
	}
}

// nonZeroBytes reads a whole device with O_DIRECT (past any page cache, so
// what the disk holds) and counts the bytes that are not zero.
func nonZeroBytes(t *testing.T, dev string) (n, size int64) {
	t.Helper()
	f, buf, closeDev := openDirect(t, dev)
	defer closeDev()
	for {
		k, err := f.ReadAt(buf, size)
		for _, b := range buf[:k] {
			if b != 0 {
				n++
			}
		}
		size += int64(k)
		if err != nil || k == 0 {
			break
		}
	}
	return n, size
}

// extents is where an LV lies on the PVs (lvs seg_pe_ranges).
func (e *env) extents(lv string) string { return e.lvField(lv, "seg_pe_ranges") }

// TestNoVolumeShowsAnotherVolumesData runs the erasure tests on one VG
// and one plugin (each start costs seconds under TCG).
func TestNoVolumeShowsAnotherVolumesData(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, "erase", 256*mib, "  - {name: written, volumeGroup: $VG, erase: write}\n"+
		"  - {name: kept, volumeGroup: $VG, erase: none}\n")
	t.Run("NewBlockVolumeReadsOnlyZeros", func(t *testing.T) { newBlockVolumeReadsOnlyZeros(t, e) })
	t.Run("CreateVolumeFinishesAHalfMadeLV", func(t *testing.T) { createVolumeFinishesAHalfMadeLV(t, e) })
	t.Run("NewFilesystemVolumeReadsBlank", func(t *testing.T) { newFilesystemVolumeReadsBlank(t, e) })
	t.Run("SignatureAtTheEndIsNeverFormatted", func(t *testing.T) { signatureAtTheEndIsNeverFormatted(t, e) })
}

// The regions where signatures live, as internal/node/erase defines them: the
// first 4 MiB and 4 KiB, the last 2 MiB.
const signatureHead, signatureTail = 4*mib + 4096, 2 * mib

// newFilesystemVolumeReadsBlank: tenant A's filesystem volume is written
// whole with a pattern and deleted; tenant B's new filesystem volume on
// the same extents reads zeros where signatures live (CreateVolume zeroed
// them; lvcreate zeroes only 4 KiB) while the rest still holds A's bytes
// (the control: the extents were not zero to begin with). NodeStage then
// formats it without running blkid, which the plugin logs.
func newFilesystemVolumeReadsBlank(t *testing.T, e *env) {
	c := plugintest.MountCapability("ext4")
	a := e.createInClass("fs-tenant-a", eraseSize, c, class)
	devA, _ := plugintest.DevicePath(a)
	writeDevice(t, devA, pattern)
	where := e.extents(lvName(t, a))
	e.delete(a)

	b := e.createInClass("fs-tenant-b", eraseSize, c, class)
	if got := e.extents(lvName(t, b)); got != where {
		t.Fatalf("the new volume lies on %s, the deleted one on %s: the test needs the same extents", got, where)
	}
	devB, _ := plugintest.DevicePath(b)
	if n := nonZeroIn(t, devB, 0, signatureHead) + nonZeroIn(t, devB, eraseSize-signatureTail, eraseSize); n != 0 {
		t.Errorf("the new filesystem volume has %d non-zero bytes where signatures live", n)
	}
	if n := nonZeroIn(t, devB, signatureHead, eraseSize-signatureTail); n == 0 {
		t.Error("the middle of the new volume reads zeros: the control expected the deleted volume's pattern there")
	}
	mkfs := e.stepCount("mkfs")
	p := e.paths("fs-tenant-b")
	e.stagePublish(b, p, c)
	if got := e.stepCount("mkfs") - mkfs; got != 1 {
		t.Errorf("stage of the new volume ran mkfs %d times, want 1", got)
	}
	e.unpublishUnstage(b, p)
	log, err := os.ReadFile(e.log.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`"Staged volume".*volumeID="` + regexp.QuoteMeta(b) + `".*readAsBlank=true`).Match(log) {
		t.Errorf("the plugin did not log the stage of %s as read blank (readAsBlank=true): blkid ran", b)
	}
	e.delete(b)
}

// signatureAtTheEndIsNeverFormatted: a new filesystem volume that carries
// a signature only near its end (an md 0.90 superblock, 64 KiB before the
// last 64 KiB boundary; its first MiBs zero) is refused by NodeStage,
// FAILED_PRECONDITION naming it, and never formatted: the blank read must
// look at the end too.
func signatureAtTheEndIsNeverFormatted(t *testing.T, e *env) {
	ctx := context.Background()
	c := plugintest.MountCapability("ext4")
	id := e.createInClass("md-at-the-end", eraseSize, c, class)
	dev, _ := plugintest.DevicePath(id)
	sb := make([]byte, 4096)
	for i, v := range []uint32{0xa92b4efc, 0, 90, 0} { // magic, version 0.90.0
		binary.LittleEndian.PutUint32(sb[4*i:], v)
	}
	off := eraseSize&^0xffff - 0x10000
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(sb, off); err != nil {
		t.Fatal(err)
	}
	if err := errors.Join(f.Sync(), f.Close()); err != nil {
		t.Fatal(err)
	}
	// The control: blkid finds it.
	if out, err := plugintest.Run(ctx, "blkid", "-p", "-s", "TYPE", "-o", "value", dev); err != nil || strings.TrimSpace(out) != "linux_raid_member" {
		t.Fatalf("blkid -p of the device = %q, %v; want linux_raid_member", out, err)
	}
	mkfs := e.stepCount("mkfs")
	p := e.paths("md-at-the-end")
	err = e.stage(id, p, c, rpcTimeout)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "linux_raid_member") {
		t.Errorf("NodeStageVolume of a device with an md superblock at its end = %v, want FAILED_PRECONDITION naming linux_raid_member", err)
	}
	if got := e.stepCount("mkfs") - mkfs; got != 0 {
		t.Errorf("mkfs ran %d times on a device with a signature", got)
	}
	if n := nonZeroIn(t, dev, off, off+4096); n == 0 {
		t.Error("the md superblock is gone")
	}
	e.delete(id)
}

// nonZeroIn counts the non-zero bytes of dev in [from, to), read with
// O_DIRECT.
func nonZeroIn(t *testing.T, dev string, from, to int64) int64 {
	t.Helper()
	f, buf, closeDev := openDirect(t, dev)
	defer closeDev()
	var n int64
	for at := from; at < to; {
		k, err := f.ReadAt(buf[:min(int64(len(buf)), (to-at+4095)/4096*4096)], at)
		for _, b := range buf[:min(int64(k), to-at)] {
			if b != 0 {
				n++
			}
		}
		if err != nil || k == 0 {
			break
		}
		at += int64(k)
	}
	return n
}

// newBlockVolumeReadsOnlyZeros: tenant A writes a pattern over the whole
// of a raw-block volume and deletes it; tenant B's new raw-block volume,
// made on the same extents (the test checks they are the same), reads
// zeros only, for each erase method that zeroes. A class with `erase:
// none` is the control: there B reads A's bytes, which is what carve did
// for every class before erasure existed.
func newBlockVolumeReadsOnlyZeros(t *testing.T, e *env) {
	for _, tc := range []struct {
		class    string
		wantZero bool
	}{
		{class, true}, // the default, zeroout
		{"written", true},
		{"kept", false},
	} {
		t.Run(tc.class, func(t *testing.T) {
			c := blockCapability()
			a := e.createInClass("tenant-a-"+tc.class, eraseSize, c, tc.class)
			devA, _ := plugintest.DevicePath(a)
			writeDevice(t, devA, pattern)
			where := e.extents(lvName(t, a))
			e.delete(a)

			b := e.createInClass("tenant-b-"+tc.class, eraseSize, c, tc.class)
			if got := e.extents(lvName(t, b)); got != where {
				t.Fatalf("the new volume lies on %s, the deleted one on %s: the test needs the same extents", got, where)
			}
			devB, _ := plugintest.DevicePath(b)
			n, size := nonZeroBytes(t, devB)
			if size != eraseSize {
				t.Fatalf("read %d bytes of %s, want %d", size, devB, eraseSize)
			}
			switch {
			case tc.wantZero && n != 0:
				t.Errorf("class %s: the new volume shows %d non-zero bytes of the deleted one", tc.class, n)
			case !tc.wantZero && n == 0:
				t.Errorf("class %s (erase: none): the new volume reads all zeros; the control expected the old pattern, so this test would not see a leak", tc.class)
			}
			e.delete(b)
		})
	}
	// Tenants A and B of the two classes that zero; none for erase: none.
	if n := e.stepCountOf("create", "erase"); n != 4 {
		t.Errorf("carve_step_duration_seconds{phase=create,step=erase} counted %d erasures, want 4", n)
	}
}

// createVolumeFinishesAHalfMadeLV: a plugin killed between lvcreate (which
// commits the LV and its tags) and the end of its wipe and zeroing leaves
// an LV marked unfinished (a file in the plugin's state directory) over
// extents that still hold
// a deleted volume's bytes (here: a pattern, and a whole ext4). After a
// restart, the retried CreateVolume zeroes the raw-block one, and makes
// the filesystem one again, so NodeStage formats a new filesystem instead
// of mounting the old one.
func createVolumeFinishesAHalfMadeLV(t *testing.T, e *env) {
	ctx := context.Background()
	marks, err := marks.Open(filepath.Join(e.dir, "unfinished")) // --state-dir's default: the socket's directory
	if err != nil {
		t.Fatal(err)
	}
	halfMade := func(name string) string {
		lv := volume.LVNameFor(name)
		args := []string{"lvcreate", "--yes", "--wipesignatures", "n", "--zero", "n", "--name", lv, "--size", "32m"}
		tags := volume.VolumeTags(name, class, nil)
		if err := marks.Mark(e.vg.Name, lv); err != nil {
			t.Fatal(err)
		}
		for _, tag := range tags {
			args = append(args, "--addtag", tag)
		}
		if _, err := e.vg.LVM(ctx, append(args, e.vg.Name)...); err != nil {
			t.Fatal(err)
		}
		return "/dev/" + e.vg.Name + "/" + lv
	}
	type halfMadeLV struct{ name, dev, oldUUID string }
	var blocks, filesystems []halfMadeLV
	b := halfMadeLV{name: "half-block-marked"}
	b.dev = halfMade(b.name)
	writeDevice(t, b.dev, pattern)
	f := halfMadeLV{name: "half-fs-marked"}
	f.dev = halfMade(f.name)
	if _, err := plugintest.Run(ctx, "mkfs.ext4", "-q", "-F", f.dev); err != nil {
		t.Fatal(err)
	}
	if f.oldUUID, err = plugintest.FilesystemUUID(ctx, f.dev); err != nil || f.oldUUID == "" {
		t.Fatalf("the old filesystem has no UUID (%q, %v)", f.oldUUID, err)
	}
	blocks, filesystems = append(blocks, b), append(filesystems, f)
	// The crash: the plugin comes back and reads LVM afresh.
	e.stop()
	e.start()

	var ids []string
	for _, b := range blocks {
		ids = append(ids, e.createInClass(b.name, eraseSize, blockCapability(), class))
		if n, _ := nonZeroBytes(t, b.dev); n != 0 {
			t.Errorf("the half-made raw-block volume %s was handed out with %d non-zero bytes", b.name, n)
		}
	}
	capability := plugintest.MountCapability("ext4")
	for _, f := range filesystems {
		id := e.createInClass(f.name, eraseSize, capability, class)
		ids = append(ids, id)
		p := e.paths(f.name)
		e.stagePublish(id, p, capability)
		newUUID, err := plugintest.FilesystemUUID(ctx, f.dev)
		if err != nil || newUUID == f.oldUUID {
			t.Errorf("NodeStage mounted the filesystem left on the half-made LV %s (UUID %s, now %s, %v)", f.name, f.oldUUID, newUUID, err)
		}
		e.unpublishUnstage(id, p)
	}
	for _, id := range ids {
		lv := lvName(t, id)
		if marked, err := marks.Has(e.vg.Name, lv); err != nil || marked {
			t.Errorf("%s is still marked unfinished after CreateVolume returned it (%v)", id, err)
		}
	}
}

// delete deletes a volume now (the cleanup createInClass registered finds
// it gone, which DeleteVolume answers with OK).
func (e *env) delete(id string) {
	e.t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	if _, err := e.controller().DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		e.t.Fatalf("DeleteVolume %s: %v", id, err)
	}
}

// stepCountOf is how often the plugin ran a step of a phase since it started.
func (e *env) stepCountOf(phase, step string) uint64 {
	e.t.Helper()
	return e.scrape().HistogramCount("carve_step_duration_seconds", map[string]string{"phase": phase, "step": step})
}
