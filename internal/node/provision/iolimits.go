package provision

import (
	"context"
	"errors"
	"slices"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// TagLVM changes LV tags; *lvm.Client implements it.
type TagLVM interface {
	// ChangeTags changes tags in one commit; lvm.ErrNotFound without the LV.
	ChangeTags(ctx context.Context, vg, name string, add, del []string) error
}

var _ TagLVM = (*lvm.Client)(nil)

// SetIOLimits records params' IO limits in vg/name's tags under its lock and
// returns its limits. Errors: ErrInvalid, ErrNotFound, ErrBusy.
func (p *Provisioner) SetIOLimits(ctx context.Context, vg, name string, params map[string]string) (volume.IOLimits, error) {
	id := volume.VolumeID(vg, name)
	if _, err := volume.ParseIOLimits(params, volume.IOLimits{}, false); err != nil {
		return volume.IOLimits{}, errorf(ErrInvalid, "mutable_parameters: %v", err)
	}
	t, ok := p.cfg.LVM.(TagLVM)
	if !ok {
		return volume.IOLimits{}, errorf(ErrInternal, "volume %s: this node's LVM cannot change tags", id)
	}
	if !p.locks.TryAcquire(name) {
		return volume.IOLimits{}, errorf(ErrBusy, "volume %s: an operation is in flight", id)
	}
	defer p.locks.Release(name)
	lv, err := p.cfg.LVM.GetLV(ctx, vg, name)
	switch {
	case errors.Is(err, lvm.ErrNotFound):
		return volume.IOLimits{}, errorf(ErrNotFound, "volume %s does not exist on node %s", id, p.cfg.NodeName)
	case err != nil:
		return volume.IOLimits{}, err
	}
	if k, _, owned := volume.Owned(lv.Tags); !owned || k != volume.KindVolume {
		return volume.IOLimits{}, errorf(ErrNotFound, "volume %s: LV %s is not a carve volume", id, id)
	}
	old := volume.IOLimitsFromTags(lv.Tags)
	limits, err := volume.ParseIOLimits(params, old, false)
	if err != nil {
		return volume.IOLimits{}, errorf(ErrInvalid, "mutable_parameters: %v", err)
	}
	want := volume.IOLimitTags(limits)
	have := slices.DeleteFunc(slices.Clone(lv.Tags), func(t string) bool { return !volume.IsIOLimitTag(t) })
	add := slices.DeleteFunc(slices.Clone(want), func(t string) bool { return slices.Contains(have, t) })
	del := slices.DeleteFunc(have, func(t string) bool { return slices.Contains(want, t) })
	if len(add)+len(del) == 0 {
		return limits, nil
	}
	if err := t.ChangeTags(ctx, vg, name, add, del); err != nil {
		return volume.IOLimits{}, err
	}
	if got, err := p.cfg.LVM.GetLV(ctx, vg, name); err == nil {
		p.cfg.View.Created(*got)
	} else {
		p.cfg.View.Changed()
	}
	klog.FromContext(ctx).Info("Recorded IO limits", "volumeID", id, "from", old.String(), "to", limits.String())
	return limits, nil
}
