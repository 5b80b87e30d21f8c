// The copy of a source's data into a new LV, detached from its request.

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

const copyTimeout = 12 * time.Hour

// removeUnfinishedCopy removes an unfinished copy's thin LV to copy anew.
func (p *Provisioner) removeUnfinishedCopy(ctx context.Context, lv *lvm.LogicalVolume, c *createCall, room *vgview.Capacity) error {
	if err := sameVolume(lv, c.Request); err != nil {
		return err
	}
	id := volume.VolumeID(lv.VolumeGroup, lv.Name)
	if err := p.cfg.LVM.RemoveLV(ctx, lv.VolumeGroup, lv.Name); err != nil && !errors.Is(err, lvm.ErrNotFound) {
		return wrap(err, "removing the unfinished copy "+id)
	}
	p.cfg.View.Removed(lv.VolumeGroup, lv.Name)
	klog.FromContext(ctx).Info("Removed a thin LV whose copy did not finish; making it again", "volumeID", id)
	var err error
	if *room, err = p.cfg.View.Capacity(c.Class); err != nil {
		return wrap(err, "device class "+c.Class.Name)
	}
	return nil
}

// copyInto copies src into copy-pending dst, then removes the tag; a clone
// reads a temporary snapshot. It runs detached and restarts when retried.
func (p *Provisioner) copyInto(ctx context.Context, dst *lvm.LogicalVolume, class *deviceclass.DeviceClass, src *contentSource, phase string, sparse bool) (*lvm.LogicalVolume, error) {
	if src.remote != nil {
		return p.pullInto(ctx, dst, class, src, phase, sparse)
	}
	if p.cfg.Copier == nil {
		return nil, errorf(ErrInternal, "no copier configured")
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), copyTimeout)
	defer cancel()
	log := klog.FromContext(ctx).WithValues("lv", dst.Name, "source", src.id)

	from := src.lv
	var tmp string
	if !src.snapshot {
		var err error
		if from, err = p.copySource(ctx, dst.Name, class, &src.lv); err != nil {
			return nil, err
		}
		tmp = from.Name
		// A retry takes a new snapshot, of the source as it is then.
		defer p.removeCopySource(ctx, dst.VolumeGroup, tmp)
	}
	read, activated, err := p.copyDevice(ctx, &from, "source")
	if err != nil {
		return nil, err
	}
	if activated && src.snapshot {
		// Deactivate again, copied or not, so the device is not left open to writes.
		defer p.deactivateAfterCopy(ctx, read)
	}
	if err := SnapshotUsable(read); err != nil {
		return nil, errorf(ErrRefused, "source %s: %v", src.id, err)
	}
	write, _, err := p.copyDevice(ctx, dst, "target")
	if err != nil {
		return nil, err
	}
	t := time.Now()
	var copied uint64
	res, err := p.cfg.Copier.Copy(ctx, p.devicePath(write), p.devicePath(read), src.size, sparse, func(n uint64) {
		p.cfg.Metrics.AddCopiedBytes(phase, class.Name, n-copied)
		copied = n
	})
	p.cfg.Metrics.ObserveStep(phase, metrics.StepCopy, class.Name, time.Since(t), err)
	// A copy-on-write source that overflowed was read half lost: keep unfinished.
	unusable, aerr := p.sourceSpent(ctx, read)
	if aerr == nil && unusable != nil {
		return nil, errorf(ErrRefused, "source %s ran out of its snapshot space; the copy into %s is not used: %v", src.id, dst.Name, unusable)
	}
	if err != nil {
		return nil, errorf(ErrInternal, "copying %s into %s (%d of %d bytes done; a retry copies again): %v", src.id, dst.Name, res.Bytes, src.size, err)
	}
	if aerr != nil {
		return nil, wrap(aerr, "reading the copy's source "+from.VolumeGroup+"/"+from.Name+" after the copy")
	}
	// Synced: whole. The tag goes first; a crash leaves the temporary snapshot
	// to the retry or DeleteVolume.
	done, err := p.copied(ctx, write)
	if err != nil {
		return nil, err
	}
	log.Info("Copied the volume's data", "bytes", res.Bytes, "skippedZeros", res.Skipped, "duration", res.Duration)
	return done, nil
}

// sourceSpent tells whether copy-on-write snapshot lv overflowed.
func (p *Provisioner) sourceSpent(ctx context.Context, lv *lvm.LogicalVolume) (unusable, err error) {
	if lv.Attr.Type != lvm.TypeSnapshot {
		return nil, nil
	}
	if p.cfg.Snapshots != nil {
		st, err := p.cfg.Snapshots.Read(p.devicePath(lv))
		switch {
		case err == nil && st.Snapshot && st.Invalid:
			return fmt.Errorf("snapshot LV %s/%s ran out of copy-on-write space (device-mapper status %q): its content is lost; delete it", lv.VolumeGroup, lv.Name, st.Status), nil
		case err == nil && st.Snapshot:
			return nil, nil
		case err == nil:
			err = fmt.Errorf("the device is not a device-mapper snapshot (status %q)", st.Status)
		}
		klog.FromContext(ctx).V(2).Info("Reading a snapshot's state from device-mapper failed; asking LVM", "lv", lv.VolumeGroup+"/"+lv.Name, "err", err)
	}
	after, err := p.cfg.LVM.GetLV(ctx, lv.VolumeGroup, lv.Name)
	if err != nil {
		return nil, err
	}
	return SnapshotUsable(after), nil
}

// copyDevice activates lv when it has no device node; activated says so.
func (p *Provisioner) copyDevice(ctx context.Context, lv *lvm.LogicalVolume, what string) (got *lvm.LogicalVolume, activated bool, err error) {
	if p.cfg.IsDeviceNode(p.devicePath(lv)) {
		return lv, false, nil
	}
	got, err = p.cfg.LVM.ActivateLV(ctx, lv.VolumeGroup, lv.Name)
	if err != nil {
		return nil, false, wrap(err, "activating the copy's "+what+" "+lv.VolumeGroup+"/"+lv.Name)
	}
	return got, true, nil
}

// deactivateAfterCopy logs a failure: the copy is whole either way.
func (p *Provisioner) deactivateAfterCopy(ctx context.Context, lv *lvm.LogicalVolume) {
	if err := p.cfg.LVM.DeactivateLV(ctx, lv.VolumeGroup, lv.Name); err != nil && !errors.Is(err, lvm.ErrNotFound) {
		klog.FromContext(ctx).Error(err, "Deactivating a snapshot activated for a copy failed; it stays active", "lv", lv.VolumeGroup+"/"+lv.Name)
		return
	}
	inactive := *lv
	inactive.Attr.Active = false
	p.cfg.View.Created(inactive)
}

func (p *Provisioner) copySource(ctx context.Context, target string, class *deviceclass.DeviceClass, src *lvm.LogicalVolume) (lvm.LogicalVolume, error) {
	name := volume.CopySourceLVNameFor(target)
	// An earlier try's snapshot is older: clone the source as it is now.
	p.removeCopySource(ctx, src.VolumeGroup, name)
	req := lvm.SnapshotRequest{VolumeGroup: src.VolumeGroup, Origin: src.Name, Name: name, Tags: volume.CopySourceTags(target, class.Name), OriginLV: src}
	srcClass := class
	if c, ok := volume.ClassFromTags(src.Tags); ok {
		if d, ok := p.cfg.Classes.Class(c); ok {
			srcClass = d
		}
	}
	// Under the room lock, so it never eats the spare others counted on.
	unlockRoom, err := p.cfg.View.LockRoom(ctx, src.VolumeGroup)
	if err != nil {
		return lvm.LogicalVolume{}, wrap(err, "the temporary snapshot of "+src.Name)
	}
	defer unlockRoom()
	switch {
	case srcClass.Thin() == (src.Attr.Type == lvm.TypeThin):
		if err := p.snapshotRoom(srcClass, src, &req); err != nil {
			return lvm.LogicalVolume{}, err
		}
		req.Tags = volume.CopySourceTags(target, class.Name)
	case src.Attr.Type != lvm.TypeThin:
		room, err := p.cfg.View.Capacity(srcClass)
		if err != nil {
			return lvm.LogicalVolume{}, wrap(err, "room for the temporary snapshot of "+src.Name)
		}
		req.CowSize = vgview.RoundUp(srcClass.SnapshotCowSize(src.Size), room.ExtentSize)
	}
	lv, err := p.cfg.LVM.CreateSnapshot(ctx, req)
	if errors.Is(err, lvm.ErrInsufficientSpace) {
		p.refreshAfter(ctx, "an out-of-space temporary snapshot")
		return lvm.LogicalVolume{}, errorf(ErrNoRoom, "the temporary snapshot %s of %s that a clone copies from: %v", name, src.Name, err)
	}
	if err != nil {
		return lvm.LogicalVolume{}, wrap(err, "creating the temporary snapshot "+name+" of "+src.Name)
	}
	p.cfg.View.Created(*lv)
	return *lv, nil
}

// removeCopySource logs a failure: the copy it served is whole.
func (p *Provisioner) removeCopySource(ctx context.Context, vg, name string) {
	lv, ok := p.cfg.View.LV(vg, name)
	if !ok {
		return
	}
	if k, _, owned := volume.Owned(lv.Tags); !owned || k != volume.KindCopySource {
		return
	}
	err := p.cfg.LVM.RemoveLV(ctx, vg, name)
	if err != nil && !errors.Is(err, lvm.ErrNotFound) {
		klog.FromContext(ctx).Error(err, "Removing a clone's temporary snapshot failed; it is removed with its volume", "lv", vg+"/"+name)
		return
	}
	p.cfg.View.Removed(vg, name)
}

func withoutTag(tags []string, tag string) []string {
	out := make([]string, 0, len(tags))
	for _, t := range tags {
		if t != tag {
			out = append(out, t)
		}
	}
	return out
}
