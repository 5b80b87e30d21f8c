package provision

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// Delete removes the volume LV vg/lvName; one gone, or not in this node's
// volume groups, is deleted already. Not carve's, a thick origin, or open is
// ErrRefused. While the volume group is missing the answer is
// ErrUnavailable, so a volume that comes back with the disk is never
// dropped. The removal is flushed to the disks before Delete returns.
func (p *Provisioner) Delete(ctx context.Context, vg, lvName, id string) (class string, err error) {
	unlock, err := p.Lock(lvName, "volume "+id)
	if err != nil {
		return "", err
	}
	defer unlock()
	if err := p.notFinishing(lvName, id); err != nil {
		return "", err
	}
	lv, found, err := p.lvToDelete(ctx, vg, lvName, id)
	if err != nil || !found {
		if err == nil {
			if err = p.flushRemoval(ctx, vg, id); err == nil {
				p.clearMark(ctx, vg, lvName)
			}
		}
		return "", err
	}
	if !volume.IsCarve(lv.Tags) {
		return "", errorf(ErrRefused, "LV %s does not carry carve's tag %s; carve does not remove it", id, volume.TagOwner)
	}
	class, _ = volume.ClassFromTags(lv.Tags)
	if lv.Attr.Type != lvm.TypeThin {
		// lvremove would take a thick origin's snapshots with it.
		if snaps := p.snapshotsOf(vg, lvName); len(snaps) > 0 {
			return class, errorf(ErrRefused, "volume %s has snapshots %s; delete them first (a thick volume's snapshots cannot outlive it)", id, strings.Join(snaps, ", "))
		}
		switch deps, err := p.dependentsOf(ctx, vg, lvName); {
		case errors.Is(err, lvm.ErrVolumeGroupNotFound):
			return class, vgMissing(id, vg, err)
		case err != nil:
			return class, wrap(err, "looking for the snapshots of "+id)
		case len(deps) > 0:
			return class, errorf(ErrRefused, "volume %s is the origin of LV %s, which carve did not make as a snapshot (another tool's snapshot, or a clone's copy source); "+
				"lvremove would remove it with the volume, so carve does not: remove it first", id, strings.Join(deps, ", "))
		}
	}
	if volume.Encrypted(lv.Tags) {
		if err := p.cryptoErase(ctx, &lv, id, class); err != nil {
			return class, err
		}
	}
	p.removeCopySource(ctx, vg, volume.CopySourceLVNameFor(lvName))
	stepStart := time.Now()
	err = p.cfg.LVM.RemoveLV(ctx, vg, lvName)
	p.cfg.Metrics.ObserveStep(metrics.PhaseDelete, metrics.StepLVRemove, classLabel(class), time.Since(stepStart), err)
	switch {
	case errors.Is(err, lvm.ErrVolumeGroupNotFound):
		return class, vgMissing(id, vg, err)
	case errors.Is(err, lvm.ErrNotFound):
	case errors.Is(err, lvm.ErrInUse):
		return class, errorf(ErrRefused, "volume %s is in use (open or mounted); unstage it first: %v", id, err)
	case err != nil:
		return class, wrap(err, "removing "+id)
	default:
		klog.FromContext(ctx).Info("Deleted volume", "volumeID", id)
	}
	if err := p.flushRemoval(ctx, vg, id); err != nil {
		return class, err
	}
	p.cfg.View.Removed(vg, lvName)
	p.clearMark(ctx, vg, lvName)
	return class, nil
}

// flushRemoval flushes the disks' write caches: a volume a power cut brings
// back is one the cluster believes gone. The retry of a failed flush finds
// the LV gone and flushes again.
func (p *Provisioner) flushRemoval(ctx context.Context, vg, id string) error {
	if err := erase.FlushAll(ctx, p.cfg.Eraser, p.cfg.View.PhysicalVolumes(vg)); err != nil {
		return fmt.Errorf("making the removal of %s durable: %w", id, err)
	}
	return nil
}

// notFinishing is ErrBusy while a given-up CreateVolume still erases lvName.
func (p *Provisioner) notFinishing(lvName, id string) error {
	if p.finishing.Running(lvName) {
		return errorf(ErrBusy, "volume %s is still being prepared (a CreateVolume's erasure goes on); retry once it ends", id)
	}
	return nil
}

// DeleteSnapshot removes snapshot LV vg/lvName; ErrRefused while copied.
func (p *Provisioner) DeleteSnapshot(ctx context.Context, vg, lvName, id string) (class string, err error) {
	unlock, err := p.Lock(lvName, "snapshot "+id)
	if err != nil {
		return "", err
	}
	defer unlock()
	lv, found, err := p.lvToDelete(ctx, vg, lvName, id)
	if err != nil || !found {
		if err == nil {
			err = p.flushRemoval(ctx, vg, id)
		}
		return "", err
	}
	k, class, owned := volume.Owned(lv.Tags)
	if !owned || k != volume.KindSnapshot {
		return "", errorf(ErrRefused, "LV %s/%s is not a carve snapshot; carve does not remove it", vg, lvName)
	}
	stepStart := time.Now()
	err = p.cfg.LVM.RemoveLV(ctx, vg, lvName)
	p.cfg.Metrics.ObserveStep(metrics.PhaseSnapshotDelete, metrics.StepLVRemove, class, time.Since(stepStart), err)
	switch {
	case errors.Is(err, lvm.ErrVolumeGroupNotFound):
		return class, vgMissing(id, vg, err)
	case errors.Is(err, lvm.ErrNotFound):
	case errors.Is(err, lvm.ErrInUse):
		return class, errorf(ErrRefused, "snapshot %s is in use (a restore or clone is copying from it); retry later: %v", id, err)
	case err != nil:
		return class, wrap(err, "removing snapshot "+id)
	}
	if err := p.flushRemoval(ctx, vg, id); err != nil {
		return class, err
	}
	p.cfg.View.Removed(vg, lvName)
	klog.FromContext(ctx).Info("Deleted snapshot", "snapshotID", id)
	return class, nil
}

func classLabel(class string) string {
	if class == "" {
		return metrics.UnknownClass
	}
	return class
}

// lvToDelete finds the LV in the view, else LVM; found is false when it is
// gone or not this node's. A missing configured VG is an error, so a delete
// is never reported done for a volume carve could not see.
func (p *Provisioner) lvToDelete(ctx context.Context, vg, lvName, id string) (lv lvm.LogicalVolume, found bool, err error) {
	if lv, ok := p.cfg.View.LV(vg, lvName); ok {
		return lv, true, nil
	}
	got, gerr := p.cfg.LVM.GetLV(ctx, vg, lvName)
	switch {
	case errors.Is(gerr, lvm.ErrVolumeGroupNotFound) && p.cfg.Classes.HasVolumeGroup(vg):
		return lvm.LogicalVolume{}, false, vgMissing(id, vg, gerr)
	case errors.Is(gerr, lvm.ErrNotFound):
		return lvm.LogicalVolume{}, false, nil
	case gerr != nil:
		return lvm.LogicalVolume{}, false, wrap(gerr, "looking up "+id)
	}
	return *got, true, nil
}

func vgMissing(id, vg string, err error) error {
	return errorf(ErrUnavailable, "volume %s: volume group %s is missing on this node, so whether its LV is gone cannot be known; "+
		"the deletion waits until the volume group is back (or is removed from the device-class file): %v", id, vg, err)
}

// clearMark drops a removed LV's marks; a leftover is harmless.
func (p *Provisioner) clearMark(ctx context.Context, vg, lv string) {
	if err := errors.Join(p.cfg.Marks.Clear(vg, lv), p.clearFormatting(vg, lv)); err != nil {
		klog.FromContext(ctx).Error(err, "Clearing the marks of a removed LV", "vg", vg, "lv", lv)
	}
}

func (p *Provisioner) clearFormatting(vg, lv string) error {
	if p.cfg.Formatting == nil {
		return nil
	}
	return p.cfg.Formatting.Clear(vg, lv)
}

// dependentsOf names the LVs whose origin is vg/name, from LVM: lvremove
// --yes takes a thick origin's snapshots with it, also another tool's that
// the view has not seen yet.
func (p *Provisioner) dependentsOf(ctx context.Context, vg, name string) ([]string, error) {
	r, err := p.cfg.LVM.Report(ctx, vg)
	if err != nil {
		return nil, err
	}
	var deps []string
	for _, lv := range r.LogicalVolumes {
		if lv.VolumeGroup == vg && lv.Origin == name {
			deps = append(deps, vg+"/"+lv.Name)
		}
	}
	return deps, nil
}

func (p *Provisioner) snapshotsOf(vg, name string) []string {
	var ids []string
	for _, lv := range p.cfg.View.Snapshots() {
		if o, _ := volume.OriginFromTags(lv.Tags); lv.VolumeGroup == vg && (o == name || lv.Origin == name) {
			ids = append(ids, volume.SnapshotID(p.cfg.NodeName, vg, lv.Name))
		}
	}
	return ids
}
