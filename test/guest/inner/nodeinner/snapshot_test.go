//go:build guestinner

package nodeinner

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/node/directio"
	"github.com/carve-csi/carve/internal/volume"
	"github.com/carve-csi/carve/test/harness/plugintest"
)

// The snapshot tests run the real plugin on one volume group with a thick
// default class and a thin class, on real device-mapper thin and
// copy-on-write snapshots, real filesystems and real copies.

// snapClasses are the classes beside newEnv's thick default one (whose
// snapshots get the default 20 % of their volume): a thin one, and a thick
// one whose snapshots can hold a whole rewrite of their volume.
const snapClasses = `  - name: thin
    volumeGroup: $VG
    thinPool: pool0
    overprovisionRatio: 4
  - name: thick-full
    volumeGroup: $VG
    snapshotSpacePercent: 100
`

func newSnapEnv(t *testing.T, name string) *env {
	t.Helper()
	e := newEnvWith(t, name, 2048*mib, snapClasses)
	// The pool must exist before the plugin reads its classes: stop,
	// make it, start again.
	e.stop()
	if err := e.vg.CreateThinPool(context.Background(), "pool0", 768*mib); err != nil {
		t.Fatal(err)
	}
	e.start()
	return e
}

// snapshot takes a snapshot of a volume and deletes it when the test ends
// (before the volume: cleanups run last first).
func (e *env) snapshot(name, source string) *csi.Snapshot {
	e.t.Helper()
	ctx, cancel := e.ctx()
	defer cancel()
	rsp, err := e.controller().CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: source})
	if err != nil {
		e.t.Fatalf("CreateSnapshot %s of %s: %v", name, source, err)
	}
	snap := rsp.GetSnapshot()
	if !snap.GetReadyToUse() {
		e.t.Fatalf("snapshot %s is not ready to use: %v", name, snap)
	}
	e.cleanupWhileServed("DeleteSnapshot "+snap.GetSnapshotId(), func(ctx context.Context) error {
		_, err := e.controller().DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: snap.GetSnapshotId()})
		return err
	})
	return snap
}

// blockVolume is createInClass of a block volume; it returns its ID and
// its device.
func (e *env) blockVolume(name string, size int64, deviceClass string) (id, dev string) {
	e.t.Helper()
	id = e.createInClass(name, size, blockCapability(), deviceClass)
	return id, plugintest.MustDevicePath(e.t, id)
}

// fromSource is createInClass from a content source; it returns the
// volume ID or the error.
func (e *env) fromSource(name string, size int64, capability *csi.VolumeCapability, deviceClass string, src *csi.VolumeContentSource) (string, error) {
	e.t.Helper()
	v, err := e.createVolume(&csi.CreateVolumeRequest{
		Name:                name,
		CapacityRange:       &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities:  []*csi.VolumeCapability{capability},
		Parameters:          map[string]string{"carve.dev/device-class": deviceClass},
		VolumeContentSource: src,
	})
	if err != nil {
		return "", err
	}
	return v.GetVolumeId(), nil
}

func snapshotSource(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

func volumeSource(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
}

// readDevice reads n bytes at off of a device with O_DIRECT: what the disk
// holds, past any page cache.
func readDevice(t *testing.T, dev string, off, n int64) []byte {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer closeRead(t, f)
	buf := directio.Aligned(int(n))
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("reading %s: %v", dev, err)
	}
	return buf
}

// hashDevice is the SHA-256 of the first size bytes of a device, read with
// O_DIRECT in 4 MiB chunks.
func hashDevice(t *testing.T, dev string, size int64) [32]byte {
	t.Helper()
	f, err := os.OpenFile(dev, os.O_RDONLY|syscall.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer closeRead(t, f)
	buf, release, err := directio.Buffer(4 * int(mib))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	h := sha256.New()
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := f.ReadAt(buf, off); err != nil {
			t.Fatalf("reading %s at %d: %v", dev, off, err)
		}
		h.Write(buf)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// closeRead closes a file that was only read.
func closeRead(t *testing.T, f *os.File) {
	t.Helper()
	if err := f.Close(); err != nil {
		t.Error(err)
	}
}

func random(n int64) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// TestSnapshotRestoreData: data written before a snapshot is in the volume
// restored from it, data written after is not, for ext4, xfs and raw
// block, from thin and thick classes; a restore asked bigger than the
// snapshot gets a filesystem grown to its device.
func TestSnapshotRestoreData(t *testing.T) {
	t.Parallel()
	e := newSnapEnv(t, "snaprestore")
	for _, class := range []string{"thin", "thick"} {
		for _, fsType := range []string{"ext4", "xfs", "block"} {
			e.run(class+"/"+fsType, func(t *testing.T) {
				size, larger := 64*mib, 96*mib
				capability := blockCapability()
				if fsType != "block" {
					capability = plugintest.MountCapability(fsType)
				}
				if fsType == "xfs" {
					size, larger = 320*mib, 352*mib
				}
				name := "snap-" + class + "-" + fsType
				id := e.createInClass(name, size, capability, class)
				before, after := random(mib), random(mib)
				dev := plugintest.MustDevicePath(t, id)
				var p paths
				var sourceFS int64
				if fsType == "block" {
					writeDevice(t, dev, before)
				} else {
					p = e.paths(name)
					e.stagePublish(id, p, capability)
					sourceFS = fsSize(t, p.target)
					writeSynced(t, filepath.Join(p.target, "before.bin"), before)
					syscall.Sync()
				}
				snap := e.snapshot(name+"-snap", id)
				if fsType == "block" {
					writeDevice(t, dev, after)
				} else {
					writeSynced(t, filepath.Join(p.target, "before.bin"), after)
					writeSynced(t, filepath.Join(p.target, "after.bin"), after)
					e.unpublishUnstage(id, p)
				}

				rid, err := e.fromSource(name+"-restored", larger, capability, class, snapshotSource(snap.GetSnapshotId()))
				if err != nil {
					t.Fatalf("restore: %v", err)
				}
				rdev := plugintest.MustDevicePath(t, rid)
				if fsType == "block" {
					if got := readDevice(t, rdev, 0, mib); !bytes.Equal(got, before) {
						t.Error("the restored block volume does not hold the data written before the snapshot")
					}
					return
				}
				rp := e.paths(name + "-restored")
				e.stagePublish(rid, rp, capability)
				got, err := os.ReadFile(filepath.Join(rp.target, "before.bin"))
				if err != nil || !bytes.Equal(got, before) {
					t.Errorf("before.bin in the restored volume: %d bytes, equal to what was written before the snapshot: %v (%v)", len(got), bytes.Equal(got, before), err)
				}
				if _, err := os.Stat(filepath.Join(rp.target, "after.bin")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("after.bin, written after the snapshot, is in the restored volume (%v)", err)
				}
				// The filesystem was grown to the bigger device at stage.
				if fs := fsSize(t, rp.target); fs < sourceFS+(larger-size)/2 {
					t.Errorf("restored %s filesystem is %d bytes on a %d-byte volume (its source's, on %d bytes, %d): not grown", fsType, fs, larger, size, sourceFS)
				}
				e.unpublishUnstage(rid, rp)
			})
		}
	}
}

// TestSnapshotCloneWhileWriting: a thick clone of a volume that is being
// written is one moment of it. The writer stamps every 4 KiB block of the
// volume, in order, round after round, with the round number (O_DIRECT,
// O_SYNC): a copy of one moment has rounds that never grow along the
// device and differ by at most one, where a copy of the live device would
// show blocks of rounds written after others it missed.
func TestSnapshotCloneWhileWriting(t *testing.T) {
	t.Parallel()
	e := newSnapEnv(t, "snapclone")
	const size = 64 * mib
	const block = 4096
	// The writer rewrites the whole volume round after round: the clone's
	// temporary snapshot must hold all of it.
	id, dev := e.blockVolume("clone-source", size, "thick-full")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var rounds uint64
	var writeErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		f, err := os.OpenFile(dev, os.O_WRONLY|syscall.O_DIRECT|syscall.O_SYNC, 0)
		if err != nil {
			writeErr = err
			return
		}
		defer func() {
			if err := f.Close(); err != nil && writeErr == nil {
				writeErr = err
			}
		}()
		buf := directio.Aligned(64 * block)
		for round := uint64(1); ; round++ {
			for off := int64(0); off < size; off += int64(len(buf)) {
				select {
				case <-stop:
					rounds = round
					return
				default:
				}
				for b := 0; b < len(buf); b += block {
					binary.LittleEndian.PutUint64(buf[b:], round)
					binary.LittleEndian.PutUint64(buf[b+8:], uint64(off)+uint64(b))
				}
				if _, err := f.WriteAt(buf, off); err != nil {
					writeErr = err
					return
				}
			}
		}
	}()
	time.Sleep(time.Second)
	cid, err := e.fromSource("clone-copy", size, blockCapability(), "thick-full", volumeSource(id))
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatalf("clone: %v", err)
	}
	if writeErr != nil {
		t.Fatalf("the writer failed: %v", writeErr)
	}
	cdev := plugintest.MustDevicePath(t, cid)
	data := readDevice(t, cdev, 0, size)
	var prev, lo, hi uint64
	for off := int64(0); off < size; off += block {
		round := binary.LittleEndian.Uint64(data[off:])
		if at := binary.LittleEndian.Uint64(data[off+8:]); round != 0 && at != uint64(off) {
			t.Fatalf("clone block at %d holds the stamp of offset %d", off, at)
		}
		if off == 0 {
			lo, hi = round, round
		}
		lo, hi = min(lo, round), max(hi, round)
		if off > 0 && round > prev {
			t.Fatalf("clone block at %d is of round %d, the block before of round %d: not one moment of the source", off, round, prev)
		}
		prev = round
	}
	if hi-lo > 1 || hi == 0 {
		t.Errorf("clone holds rounds %d to %d: not one moment of the source", lo, hi)
	}
	t.Logf("the writer ran %d rounds; the clone holds rounds %d-%d", rounds, lo, hi)
	out, err := e.vg.LVM(context.Background(), "lvs", "--noheadings", "-o", "lv_name", e.vg.Name)
	if err != nil {
		t.Fatal(err)
	}
	if tmp := volume.CopySourceLVNameFor(lvName(t, cid)); strings.Contains(string(out), tmp) {
		t.Errorf("the clone's temporary snapshot %s is left", tmp)
	}
}

// TestSnapshotCopyKilled: the plugin killed in the middle of a thick
// restore's copy leaves an LV marked unfinished; the retried CreateVolume
// copies again and the volume holds the snapshot's data whole.
func TestSnapshotCopyKilled(t *testing.T) {
	t.Parallel()
	e := newSnapEnv(t, "snapkill")
	// Big enough that the copy is caught in flight (it copies at about
	// 200 MiB/s in the guest; the poll below is 20 ms).
	const size = 256 * mib
	id, dev := e.blockVolume("kill-source", size, "thick")
	head, tail := random(mib), random(mib)
	writeDevice(t, dev, head)
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(tail, size-mib); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	syscall.Sync()
	snap := e.snapshot("kill-snap", id)
	want := hashDevice(t, dev, size)

	done := make(chan error, 1)
	go func() {
		_, err := e.fromSource("kill-restored", size, blockCapability(), "thick", snapshotSource(snap.GetSnapshotId()))
		done <- err
	}()
	target := volume.LVNameFor("kill-restored")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if time.Now().After(deadline) {
			t.Fatal("the copy did not start within 2 minutes")
		}
		ctx, cancel := e.ctx()
		ms, err := e.plugin.Scrape(ctx)
		cancel()
		if err == nil {
			if n, _, _ := ms.Counter("carve_copy_bytes_total", map[string]string{"phase": "restore", "device_class": "thick"}); n > 0 {
				break
			}
		}
		select {
		case err := <-done:
			t.Fatalf("the restore ended before it could be killed mid-copy (%v); copy too fast for this test", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := e.plugin.Kill(); err != nil {
		t.Fatal(err)
	}
	e.plugin = nil
	if err := <-done; err == nil {
		t.Fatal("the restore succeeded although the plugin was killed during its copy")
	}
	if tags := e.lvField(target, "lv_tags"); !strings.Contains(tags, volume.TagCopyPending) {
		t.Fatalf("the half-copied LV %s does not carry %s: %q", target, volume.TagCopyPending, tags)
	}
	e.start()
	rid, err := e.fromSource("kill-restored", size, blockCapability(), "thick", snapshotSource(snap.GetSnapshotId()))
	if err != nil {
		t.Fatalf("retried restore: %v", err)
	}
	rdev := plugintest.MustDevicePath(t, rid)
	if got := hashDevice(t, rdev, size); got != want {
		t.Error("the restored volume differs from the snapshot after the retried copy")
	}
	if tags := e.lvField(target, "lv_tags"); strings.Contains(tags, volume.TagCopyPending) {
		t.Errorf("the finished LV still carries %s: %q", volume.TagCopyPending, tags)
	}
}

// TestSnapshotCOWFull: a thick snapshot whose copy-on-write space runs out
// is reported not ready, and no restore reads it.
func TestSnapshotCOWFull(t *testing.T) {
	t.Parallel()
	e := newSnapEnv(t, "snapfull")
	const size = 64 * mib
	id, dev := e.blockVolume("full-source", size, "thick")
	// 20 % of 64 MiB is 13 MiB, 16 MiB in extents: rewriting the whole
	// volume overflows it.
	snap := e.snapshot("full-snap", id)
	writeDevice(t, dev, random(size))
	ctx, cancel := e.ctx()
	defer cancel()
	got, err := e.controller().GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: snap.GetSnapshotId()})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetSnapshot().GetReadyToUse() {
		t.Errorf("a copy-on-write snapshot whose space ran out is ready to use (lv_attr %s)", e.lvAttr(snap.GetSnapshotId()[strings.LastIndex(snap.GetSnapshotId(), "/")+1:]))
	}
	_, err = e.fromSource("full-restored", size, blockCapability(), "thick", snapshotSource(snap.GetSnapshotId()))
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("restore of a full copy-on-write snapshot: %v, want FailedPrecondition", err)
	}
}
