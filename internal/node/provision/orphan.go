package provision

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// QuarantineLVM is what QuarantineOrphan needs of LVM beside LVM.
type QuarantineLVM interface {
	// ChangeTags changes tags in one commit; lvm.ErrNotFound without the LV.
	ChangeTags(ctx context.Context, vg, name string, add, del []string) error
	// RenameLV renames an LV; lvm.ErrNotFound, lvm.ErrAlreadyExists.
	RenameLV(ctx context.Context, vg, name, newName string) error
}

var _ QuarantineLVM = (*lvm.Client)(nil)

// QuarantineOrphan deactivates an orphan LV, tags it with its name and at,
// and renames it to volume.QuarantineName; only RemoveOrphan, after a second
// grace, removes its data. It returns the new name ("" for an LV gone).
// Refused: not carve's, with snapshots or dependents, or open.
func (p *Provisioner) QuarantineOrphan(ctx context.Context, vg, name string, at time.Time) (string, error) {
	id := volume.VolumeID(vg, name)
	newName, ok := volume.QuarantineName(name)
	if !ok {
		return "", fmt.Errorf("LV %s: not the name of a carve volume, or quarantined already", id)
	}
	q, ok := p.cfg.LVM.(QuarantineLVM)
	if !ok {
		return "", fmt.Errorf("LV %s: this node's LVM cannot rename LVs", id)
	}
	for _, n := range []string{name, newName} {
		if !p.locks.TryAcquire(n) {
			return "", fmt.Errorf("LV %s: an operation is in flight", volume.VolumeID(vg, n))
		}
		defer p.locks.Release(n)
	}
	if err := p.notFinishing(name, id); err != nil {
		return "", err
	}
	lv, err := p.cfg.LVM.GetLV(ctx, vg, name)
	if errors.Is(err, lvm.ErrNotFound) {
		p.cfg.View.Removed(vg, name)
		done, err := p.cfg.LVM.GetLV(ctx, vg, newName)
		switch {
		case errors.Is(err, lvm.ErrNotFound):
			return "", nil
		case err != nil:
			return "", err
		}
		if qd, ok := volume.QuarantinedFrom(done.Name, done.Tags); ok && qd.Original == name {
			p.cfg.View.Created(*done)
			return newName, nil
		}
		return "", fmt.Errorf("LV %s is gone and %s is not its quarantine", id, volume.VolumeID(vg, newName))
	}
	if err != nil {
		return "", err
	}
	if err := p.quarantinable(ctx, lv); err != nil {
		return "", err
	}
	log := klog.FromContext(ctx)
	// Deactivation fails on an open LV, which is left as it was.
	if err := p.cfg.LVM.DeactivateLV(ctx, vg, name); err != nil {
		return "", fmt.Errorf("LV %s: deactivating it before the quarantine: %w", id, err)
	}
	// Newer orphan tags replace older ones: the second grace runs from now.
	old := slices.DeleteFunc(slices.Clone(lv.Tags), func(t string) bool { return !volume.IsOrphanTag(t) })
	if err := q.ChangeTags(ctx, vg, name, volume.OrphanTags(name, at), old); err != nil {
		return "", fmt.Errorf("LV %s: tagging it for the quarantine: %w", id, err)
	}
	if err := q.RenameLV(ctx, vg, name, newName); err != nil {
		return "", fmt.Errorf("LV %s: renaming it to %s: %w", id, newName, err)
	}
	p.cfg.View.Removed(vg, name)
	if got, err := p.cfg.LVM.GetLV(ctx, vg, newName); err == nil {
		p.cfg.View.Created(*got)
	} else {
		p.cfg.View.Changed()
	}
	log.Info("Quarantined orphaned volume: deactivated and renamed; lvrename restores it", "lv", id, "as", newName)
	return newName, nil
}

// quarantinable refuses what QuarantineOrphan must not touch.
func (p *Provisioner) quarantinable(ctx context.Context, lv *lvm.LogicalVolume) error {
	id := volume.VolumeID(lv.VolumeGroup, lv.Name)
	if k, _, owned := volume.Owned(lv.Tags); !owned || k != volume.KindVolume {
		return fmt.Errorf("LV %s is not a carve volume (tag %s)", id, volume.TagOwner)
	}
	if _, ok := volume.ClaimFromTags(lv.Tags); !ok {
		return fmt.Errorf("LV %s carries no claim tag (%s); carve never quarantines or removes it", id, volume.TagClaimPrefix)
	}
	if snaps := p.snapshotsOf(lv.VolumeGroup, lv.Name); len(snaps) > 0 {
		return fmt.Errorf("LV %s has snapshots %v; carve quarantines it only once they are deleted", id, snaps)
	}
	switch deps, err := p.dependentsOf(ctx, lv.VolumeGroup, lv.Name); {
	case err != nil:
		return fmt.Errorf("LV %s: looking for its snapshots: %w", id, err)
	case len(deps) > 0:
		return fmt.Errorf("LV %s is the origin of %v; carve quarantines it only once no LV has it as origin", id, deps)
	}
	return nil
}
