package provision

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/carve-csi/carve/internal/node/dmsnapshot"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/provision/provisiontest"
	"github.com/carve-csi/carve/internal/volume"
)

// TestRestoreByCopy: restores and clones that are not thin snapshots of a
// thin LV in the class's pool copy the data into a new LV, which carries
// the copy-pending tag until the copy is done; a copy cut short is
// redone by the retry; a clone copies from a temporary snapshot, removed
// afterwards.
func TestRestoreByCopy(t *testing.T) {
	tests := []struct {
		name             string
		srcClass, dstCls string
		clone            bool
	}{
		{"thick restore", "fast", "fast", false},
		{"thick clone", "fast", "fast", true},
		{"thin snapshot restored thick", "thin", "fast", false},
		{"thick snapshot restored thin", "fast", "thin", false},
		{"thin clone into thick", "thin", "fast", true},
	}
	for _, tt := range tests {
		for _, crash := range []bool{false, true} {
			name := tt.name
			if crash {
				name += ", killed mid-copy"
			}
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				l := newLifecycle(t)
				vol := l.mustVolume(t, "pvc-1", gib, tt.srcClass)
				src := &Source{ID: vol}
				wantSrc := l.lv(t, vol).Path
				if !tt.clone {
					snap := l.mustSnapshot(t, "snap-1", vol)
					src = snapshotSource(snap)
					wantSrc = snap.Path
				}
				req := l.request(t, "pvc-new", gib, tt.dstCls, src)
				if crash {
					l.copier.FailNext = true
					_, err := l.p.Create(ctx, req)
					wantKind(t, err, ErrInternal, "a retry copies again")
					lv := l.lv(t, "vg1/"+volume.LVNameFor("pvc-new"))
					if !volume.CopyPending(lv.Tags) {
						t.Fatalf("a half-copied LV lost its copy-pending tag: %v", lv.Tags)
					}
					if _, ok := l.lvm.LVs["vg1/"+volume.CopySourceLVNameFor(lv.Name)]; ok {
						t.Error("a failed copy left its temporary snapshot")
					}
					l.restart(t)
				}
				made, err := l.p.Create(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				lv := l.lv(t, volume.VolumeID(made.VolumeGroup, made.Name))
				if volume.CopyPending(lv.Tags) || lv.Origin != "" {
					t.Errorf("copied LV %+v: want no copy-pending tag, no origin", lv)
				}
				if len(l.copier.Copies) != 1 {
					t.Fatalf("copies %v, want one", l.copier.Copies)
				}
				c := l.copier.Copies[0]
				if c.Dst != lv.Path || c.Size != uint64(gib) {
					t.Errorf("copy %+v: want %d bytes into %s", c, gib, lv.Path)
				}
				if tmp := "/dev/vg1/" + volume.CopySourceLVNameFor(lv.Name); tt.clone && c.Src != tmp || !tt.clone && c.Src != wantSrc {
					t.Errorf("copied from %s; want the %s", c.Src, map[bool]string{true: "temporary snapshot " + tmp, false: "snapshot " + wantSrc}[tt.clone])
				}
				for _, o := range l.lvm.LVs {
					if k, _, _ := volume.Owned(o.Tags); k == volume.KindCopySource {
						t.Errorf("temporary snapshot %s left behind", o.Name)
					}
				}
				// The copied data is never zeroed, not even where
				// signatures live.
				for _, e := range l.eraser.Erasures() {
					if e.Path == lv.Path {
						t.Errorf("the copied volume was erased: %v", e)
					}
				}
				// A repeat copies nothing.
				if _, err := l.p.Create(ctx, req); err != nil || len(l.copier.Copies) != 1 {
					t.Errorf("repeat: %v, copies %d", err, len(l.copier.Copies))
				}
			})
		}
	}
}

// TestCOWSnapshotFillsDuringCopy: a copy-on-write snapshot that runs out of
// space while a restore copies it leaves the copy unfinished.
func TestCOWSnapshotFillsDuringCopy(t *testing.T) {
	ctx := context.Background()
	l := newLifecycle(t)
	vol := l.mustVolume(t, "pvc-1", gib, "fast")
	snap := l.mustSnapshot(t, "snap-1", vol)
	l.copier.During = func() {
		l.lvm.Mu.Lock()
		defer l.lvm.Mu.Unlock()
		l.lvm.LVs["vg1/"+snap.Name].Attr = lvm.ParseAttributes("swi-I-s---")
	}
	req := l.request(t, "pvc-new", gib, "fast", snapshotSource(snap))
	_, err := l.p.Create(ctx, req)
	wantKind(t, err, ErrRefused, "snapshot space")
	if lv := l.lv(t, "vg1/"+volume.LVNameFor("pvc-new")); !volume.CopyPending(lv.Tags) {
		t.Errorf("a copy of a snapshot that filled up meanwhile is marked done: %v", lv.Tags)
	}
	l.copier.During = nil
	_, err = l.p.Create(ctx, req)
	wantKind(t, err, ErrRefused, "copy-on-write space")
}

// kernelSnapshots reads the fake LVM's snapshots as the kernel would show
// them, by device path.
type kernelSnapshots struct {
	lvm   *provisiontest.LVM
	reads int
}

func (f *kernelSnapshots) Read(path string) (dmsnapshot.State, error) {
	f.lvm.Mu.Lock()
	defer f.lvm.Mu.Unlock()
	f.reads++
	lv, ok := f.lvm.LVs[strings.TrimPrefix(path, "/dev/")]
	if !ok {
		return dmsnapshot.State{}, fmt.Errorf("%s: no such device", path)
	}
	if lv.Attr.Type != lvm.TypeSnapshot {
		return dmsnapshot.State{}, nil
	}
	if lv.Attr.SnapshotInvalid {
		return dmsnapshot.State{Snapshot: true, Invalid: true, Status: "Invalid"}, nil
	}
	return dmsnapshot.State{Snapshot: true, Status: "16/2097152 16"}, nil
}

// TestThickRestoreReads: a thick restore whose snapshot the view holds
// and whose LVs have their device nodes reads the snapshot's state once,
// after the copy: from the kernel (no lvm command), or from LVM when the
// kernel's cannot be read (the raw lvcreate + dd + lvchange read neither);
// a snapshot that the view still shows usable but that ran out of space
// leaves the copy unfinished.
func TestThickRestoreReads(t *testing.T) {
	for _, tt := range []struct {
		name     string
		kernel   bool
		full     bool
		lvmReads int
		dmReads  int
	}{
		{"from the kernel", true, false, 0, 1},
		{"from the kernel, full", true, true, 0, 1},
		{"from LVM", false, false, 1, 0},
		{"from LVM, full", false, true, 1, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			l := newLifecycle(t)
			dm := &kernelSnapshots{lvm: l.lvm}
			if tt.kernel {
				l.snapshots = dm
			}
			l.isDeviceNode = func(string) bool { return true }
			l.restart(t)
			vol := l.mustVolume(t, "pvc-1", gib, "fast")
			snap := l.mustSnapshot(t, "snap-1", vol)
			if tt.full {
				l.lvm.LVs["vg1/"+snap.Name].Attr = lvm.ParseAttributes("swi-I-s---")
			}
			gets, activations := l.lvm.Gets, len(l.lvm.Activations)
			_, err := l.p.Create(ctx, l.request(t, "pvc-new", gib, "fast", snapshotSource(snap)))
			if n := l.lvm.Gets - gets; n != tt.lvmReads {
				t.Errorf("the restore read LVM %d times, want %d", n, tt.lvmReads)
			}
			if dm.reads != tt.dmReads {
				t.Errorf("the restore read device-mapper %d times, want %d", dm.reads, tt.dmReads)
			}
			if n := len(l.lvm.Activations) - activations; n != 0 {
				t.Errorf("the restore activated %d LVs that had device nodes", n)
			}
			if !tt.full {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "snapshot space") {
				t.Errorf("restore of a full snapshot: %v, want %v naming the snapshot space", err, ErrRefused)
			}
			if lv := l.lv(t, "vg1/"+volume.LVNameFor("pvc-new")); !volume.CopyPending(lv.Tags) {
				t.Errorf("a copy of a full snapshot is marked done: %v", lv.Tags)
			}
		})
	}
}
