package provision

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/volume"
)

// A snapshot is an LV beside its volume: a thin snapshot in the pool for a
// thin class, a copy-on-write one for a thick class. Its identity is in its
// name and tags alone. A thin snapshot keeps LVM's activation-skip flag: it
// takes no device until a restore needs it.

// SnapshotRequest is one snapshot to take, checked by the caller.
type SnapshotRequest struct {
	Name string
	// SourceID is the source volume's ID, in VolumeGroup/Origin.
	SourceID, VolumeGroup, Origin string
}

// Snapshot takes a snapshot, or returns the one of the same name and source
// (another source is ErrMismatch); class is returned even on errors.
func (p *Provisioner) Snapshot(ctx context.Context, r SnapshotRequest) (lv *lvm.LogicalVolume, class string, err error) {
	vg, origin, name := r.VolumeGroup, r.Origin, r.Name
	snapLV := volume.SnapshotLVNameFor(name)
	unlock, err := p.Lock(snapLV, "snapshot "+name)
	if err != nil {
		return nil, "", err
	}
	defer unlock()
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithValues("snapshot", name, "lv", snapLV, "sourceVolumeID", r.SourceID))
	if existing, ok := p.findSnapshotLV(vg, snapLV); ok {
		if err := snapshotCompatible(&existing, name, vg, origin); err != nil {
			return nil, "", err
		}
		c, _ := volume.ClassFromTags(existing.Tags)
		if !halfMade(&existing) {
			klog.FromContext(ctx).V(2).Info("Snapshot exists already")
			return &existing, c, nil
		}
		if err := p.removeHalfMade(ctx, &existing); err != nil {
			return nil, c, err
		}
	}
	src, err := p.sourceLV(ctx, vg, origin, r.SourceID)
	if err != nil {
		return nil, "", err
	}
	className, _ := volume.ClassFromTags(src.Tags)
	d, ok := p.cfg.Classes.Class(className)
	if !ok || d.VolumeGroup != vg {
		return nil, className, errorf(ErrRefused, "source volume %s is of device class %q, which node %s does not configure in volume group %s now", r.SourceID, className, p.cfg.NodeName, vg)
	}
	if d.Thin() != (src.Attr.Type == lvm.TypeThin) {
		return nil, className, errorf(ErrRefused, "source volume %s is a %s LV, its device class %s is not; carve snapshots only volumes it made", r.SourceID, src.Attr.Type, d.Name)
	}
	lv, err = p.takeSnapshot(ctx, r, d, src)
	return lv, className, err
}

func (p *Provisioner) takeSnapshot(ctx context.Context, r SnapshotRequest, class *deviceclass.DeviceClass, src *lvm.LogicalVolume) (*lvm.LogicalVolume, error) {
	vg, origin, name := r.VolumeGroup, r.Origin, r.Name
	snapLV := volume.SnapshotLVNameFor(name)
	unlockRoom, err := p.cfg.View.LockRoom(ctx, vg)
	if err != nil {
		return nil, wrap(err, "snapshot "+name)
	}
	defer unlockRoom()
	sreq := lvm.SnapshotRequest{VolumeGroup: vg, Origin: origin, Name: snapLV,
		Tags: volume.SnapshotTags(name, class.Name, origin), ActivationSkip: true, OriginLV: src}
	if err := p.snapshotRoom(class, src, &sreq); err != nil {
		return nil, err
	}
	if volume.Encrypted(src.Tags) {
		// The origin's ciphertext: a restore must be encrypted too.
		sreq.Tags = append(sreq.Tags, volume.TagEncrypted)
	}
	if asked, made, ok := volume.AskedFromTags(src.Tags); ok && src.Size == made {
		// Not grown since: the snapshot reports what its claim asked.
		sreq.Tags = append(sreq.Tags, volume.AskedTag(asked, made))
	}
	stepStart := time.Now()
	lv, err := p.cfg.LVM.CreateSnapshot(ctx, sreq)
	p.cfg.Metrics.ObserveStep(metrics.PhaseSnapshot, metrics.StepLVCreate, class.Name, time.Since(stepStart), err)
	switch {
	case errors.Is(err, lvm.ErrAlreadyExists):
		got, gerr := p.cfg.LVM.GetLV(ctx, vg, snapLV)
		if gerr != nil {
			return nil, wrap(gerr, "looking up existing snapshot LV "+vg+"/"+snapLV)
		}
		if err := snapshotCompatible(got, name, vg, origin); err != nil {
			return nil, err
		}
		if halfMade(got) {
			if err := p.removeHalfMade(ctx, got); err != nil {
				return nil, err
			}
			return nil, errorf(ErrBusy, "snapshot %q: a half-made snapshot LV %s/%s was found and removed; it is made again on the next attempt", name, vg, snapLV)
		}
		p.cfg.View.Created(*got)
		return got, nil
	case errors.Is(err, lvm.ErrInsufficientSpace):
		p.refreshAfter(ctx, "an out-of-space snapshot")
		return nil, errorf(ErrNoRoom, "snapshot %q of %s: %v", name, r.SourceID, err)
	case err != nil:
		return nil, wrap(err, "creating snapshot LV "+vg+"/"+snapLV)
	}
	p.cfg.View.Created(*lv)
	klog.FromContext(ctx).Info("Created snapshot", "cowSize", sreq.CowSize)
	return lv, nil
}

// snapshotRoom checks room for a snapshot of src: a thin one counts src's
// size against the overprovision ratio, a copy-on-write one takes its space
// from the volume group.
func (p *Provisioner) snapshotRoom(class *deviceclass.DeviceClass, src *lvm.LogicalVolume, sreq *lvm.SnapshotRequest) error {
	room, err := p.cfg.View.Capacity(class)
	if errors.Is(err, vgview.ErrClassUnavailable) {
		return errorf(ErrUnavailable, "device class %s on node %s cannot take snapshots now: %v", class.Name, p.cfg.NodeName, err)
	}
	if err != nil {
		return wrap(err, "device class "+class.Name)
	}
	need := src.Size
	if !class.Thin() {
		sreq.CowSize = vgview.RoundUp(class.SnapshotCowSize(src.Size), room.ExtentSize)
		sreq.Tags = append(sreq.Tags, volume.SizeTag(src.Size))
		need = sreq.CowSize
	}
	if need > room.Available {
		return errorf(ErrNoRoom, "device class %s on node %s has %d bytes available (after a spare of %d); a snapshot of %s needs %d",
			class.Name, p.cfg.NodeName, room.Available, class.SpareBytes(), volume.VolumeID(src.VolumeGroup, src.Name), need)
	}
	return nil
}

func (p *Provisioner) findSnapshotLV(vg, name string) (lvm.LogicalVolume, bool) {
	if lv, ok := p.cfg.View.LV(vg, name); ok {
		return lv, true
	}
	return p.cfg.View.FindLV(name)
}

func (p *Provisioner) sourceLV(ctx context.Context, vg, name, id string) (*lvm.LogicalVolume, error) {
	if lv, ok := p.cfg.View.LV(vg, name); ok && p.cfg.Classes.HasVolumeGroup(vg) {
		if k, _, owned := volume.Owned(lv.Tags); owned && k == volume.KindVolume {
			return &lv, nil
		}
	}
	return p.volumeFromLVM(ctx, vg, name, id)
}

func snapshotCompatible(lv *lvm.LogicalVolume, name, vg, origin string) error {
	if !volume.HasSnapshotName(lv.Tags, name) {
		other, _, _ := volume.SnapshotNameFromTags(lv.Tags)
		return errorf(ErrMismatch, "LV %s/%s exists but does not carry snapshot %q in its tags (found %q)", lv.VolumeGroup, lv.Name, name, other)
	}
	if o, _ := volume.OriginFromTags(lv.Tags); o != origin || lv.VolumeGroup != vg {
		return errorf(ErrMismatch, "snapshot %q exists of volume %s; source_volume_id %s asked",
			name, volume.VolumeID(lv.VolumeGroup, o), volume.VolumeID(vg, origin))
	}
	return nil
}

// SnapshotSize is a thin snapshot's own size, a copy-on-write one's origin's.
func SnapshotSize(lv *lvm.LogicalVolume) uint64 {
	if lv.Attr.Type != lvm.TypeSnapshot {
		return lv.Size
	}
	if n, ok := volume.SizeFromTags(lv.Tags); ok {
		return n
	}
	return 0
}

// SnapshotSizeBytes is a snapshot's size_bytes: what its volume's request
// asked when carve made it bigger, else size. csi-provisioner refuses a
// restore asked smaller than this.
func SnapshotSizeBytes(size uint64, lv *lvm.LogicalVolume) uint64 {
	if asked, made, ok := volume.AskedFromTags(lv.Tags); ok && made == size {
		return asked
	}
	return size
}

// halfMade tells a copy-on-write snapshot that LVM holds as a plain LV.
// lvcreate makes one in two commits: the store, an ordinary LV with all the
// tags (the origin's size among them), then the snapshot. A crash between
// leaves a store holding nothing of the origin, which must never pass for
// the snapshot. (A plain LV with snapshot tags but no size tag is a test
// bed's stand-in without device-mapper.)
func halfMade(lv *lvm.LogicalVolume) bool {
	k, _, owned := volume.Owned(lv.Tags)
	_, sized := volume.SizeFromTags(lv.Tags)
	return owned && sized && (k == volume.KindSnapshot || k == volume.KindCopySource) &&
		lv.Attr.Type != lvm.TypeSnapshot && lv.Attr.Type != lvm.TypeThin
}

// removeHalfMade removes a half-made snapshot LV; it holds no data.
func (p *Provisioner) removeHalfMade(ctx context.Context, lv *lvm.LogicalVolume) error {
	klog.FromContext(ctx).Info("Removing a half-made snapshot: LVM holds it as a plain LV, not a snapshot (a crash cut its lvcreate short)", "lv", lv.VolumeGroup+"/"+lv.Name, "lvAttr", lv.Attr.Raw)
	if err := p.cfg.LVM.RemoveLV(ctx, lv.VolumeGroup, lv.Name); err != nil && !errors.Is(err, lvm.ErrNotFound) {
		return wrap(err, "removing the half-made snapshot LV "+lv.VolumeGroup+"/"+lv.Name)
	}
	p.cfg.View.Removed(lv.VolumeGroup, lv.Name)
	return nil
}

// SnapshotUsable is nil unless the snapshot is half-made or overflowed.
func SnapshotUsable(lv *lvm.LogicalVolume) error {
	if halfMade(lv) {
		return fmt.Errorf("snapshot LV %s/%s was never completed: LVM holds it as a plain LV (lv_attr %s), not a snapshot, as when a crash cuts its lvcreate short; it holds nothing of its origin, and taking the snapshot again replaces it", lv.VolumeGroup, lv.Name, lv.Attr.Raw)
	}
	if lv.Attr.SnapshotInvalid || (lv.Attr.Type == lvm.TypeSnapshot && lv.SnapPercent >= 100) {
		return fmt.Errorf("snapshot LV %s/%s ran out of copy-on-write space (lv_attr %s, %.2f%% used): its content is lost; delete it", lv.VolumeGroup, lv.Name, lv.Attr.Raw, lv.SnapPercent)
	}
	return nil
}

// SnapshotByID finds a snapshot of this node by ID (ErrElsewhere,
// ErrNotFound) in LVM, where an overflow shows; viewFirst takes a usable
// one from the view (a restore, whose copy reads LVM after).
func (p *Provisioner) SnapshotByID(ctx context.Context, id string, viewFirst bool) (*lvm.LogicalVolume, error) {
	node, vg, lvName, err := volume.ParseSnapshotID(id)
	if err != nil {
		return nil, errorf(ErrNotFound, "snapshot %q does not exist: %v", id, err)
	}
	if node != p.cfg.NodeName {
		return nil, errorf(ErrElsewhere, "snapshot %s lives on node %s, not on %s: it can be read only there", id, node, p.cfg.NodeName)
	}
	if !p.cfg.Classes.HasVolumeGroup(vg) {
		return nil, errorf(ErrNotFound, "snapshot %s does not exist on node %s: volume group %s is none of its device classes'", id, p.cfg.NodeName, vg)
	}
	if lv, ok := p.cfg.View.LV(vg, lvName); ok && viewFirst && SnapshotUsable(&lv) == nil {
		if k, _, owned := volume.Owned(lv.Tags); owned && k == volume.KindSnapshot {
			return &lv, nil
		}
	}
	// A copy-on-write snapshot can overflow at any moment.
	lv, err := p.cfg.LVM.GetLV(ctx, vg, lvName)
	if errors.Is(err, lvm.ErrNotFound) {
		return nil, errorf(ErrNotFound, "snapshot %s does not exist on node %s", id, p.cfg.NodeName)
	}
	if err != nil {
		return nil, wrap(err, "looking up snapshot "+id)
	}
	if k, _, owned := volume.Owned(lv.Tags); !owned || k != volume.KindSnapshot {
		return nil, errorf(ErrNotFound, "snapshot %s does not exist on node %s: LV %s/%s is not a carve snapshot", id, p.cfg.NodeName, vg, lvName)
	}
	return lv, nil
}
