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

// A volume from a source is a writable thin snapshot when the source is a
// thin LV in the class's pool; otherwise the data is copied into a new LV
// tagged volume.TagCopyPending until synced, a clone from a temporary
// snapshot. The copy is detached: retries answer ErrBusy while it runs.

type contentSource struct {
	lv       lvm.LogicalVolume
	size     uint64
	id       string
	snapshot bool
	remote   *RemoteSource
}

// resolveSource finds the LV of a content source. Another node's source is
// ErrElsewhere (the controller knows where) or the context's RemoteSource;
// none is ErrNotFound; an overflowed or untagged copy-on-write snapshot is
// ErrRefused.
func (p *Provisioner) resolveSource(ctx context.Context, cs *Source) (*contentSource, error) {
	if rs := p.remoteSourceFor(ctx, cs); rs != nil {
		return p.resolveRemote(rs)
	}
	return p.resolveLocal(ctx, cs)
}

func (p *Provisioner) resolveLocal(ctx context.Context, cs *Source) (*contentSource, error) {
	if cs.Snapshot {
		lv, err := p.SnapshotByID(ctx, cs.ID, true)
		if err != nil {
			return nil, err
		}
		if err := SnapshotUsable(lv); err != nil {
			return nil, errorf(ErrRefused, "volume_content_source: snapshot %s cannot be restored: %v", cs.ID, err)
		}
		size := SnapshotSize(lv)
		if size == 0 {
			// A copy of 0 bytes would hand out an empty volume as the restore.
			return nil, errorf(ErrRefused, "volume_content_source: snapshot %s cannot be restored: its LV %s/%s has no size tag %s<bytes> (removed by hand or by another tool?), so the size of the volume it holds is unknown",
				cs.ID, lv.VolumeGroup, lv.Name, volume.TagSizePrefix)
		}
		return &contentSource{lv: *lv, size: size, id: cs.ID, snapshot: true}, nil
	}
	id := cs.ID
	vg, name, err := volume.ParseVolumeID(id)
	if err != nil {
		return nil, errorf(ErrNotFound, "volume_content_source: volume %q does not exist: %v", id, err)
	}
	lv, err := p.sourceLV(ctx, vg, name, id)
	if errors.Is(err, ErrNotFound) {
		return nil, p.sourceElsewhere(err)
	}
	if err != nil {
		return nil, err
	}
	if volume.CopyPending(lv.Tags) {
		return nil, errorf(ErrRefused, "volume_content_source: volume %s is still being copied into; clone it once it is made", id)
	}
	return &contentSource{lv: *lv, size: lv.Size, id: id}, nil
}

// sourceElsewhere is ErrNotFound: carve controller knows the source's node.
func (p *Provisioner) sourceElsewhere(notHere error) error {
	return errorf(ErrNotFound, "volume_content_source: %s (carve controller sends a clone to its source's node, or grants a copy from there)", notHere.Error())
}

// thinInto: src is a thin LV in class's pool.
func (src *contentSource) thinInto(class *deviceclass.DeviceClass) bool {
	return class.Thin() && src.lv.Attr.Type == lvm.TypeThin && src.lv.VolumeGroup == class.VolumeGroup && src.lv.Pool == class.ThinPool
}

// copiesIntoThin: class is thin and src is not a thin LV of its pool.
func (src *contentSource) copiesIntoThin(class *deviceclass.DeviceClass) bool {
	return class.Thin() && !src.thinInto(class)
}

// checkCopyRoom checks a copy into a thin LV against the pool's real free
// space minus the spare, without the overprovision ratio: a full pool stops
// every thin volume in it. The bound is size, as which chunks hold data is
// unknown until read. The caller holds the room lock.
func (p *Provisioner) checkCopyRoom(ctx context.Context, c *createCall, size uint64) error {
	return p.checkPoolRoom(ctx, c.Class, func(room vgview.PoolRoom) uint64 {
		if room.ZeroNewBlocks {
			return c.src.size
		}
		return size
	}, func(room vgview.PoolRoom, n uint64) error {
		return errorf(ErrNoRoom, "device class %s on node %s: copying %s into thin pool %s needs %d bytes of real space (the source's size: a copy writes the source's data, and the overprovision ratio does not apply to it); the pool has %d bytes free (after a spare of %d%s)",
			c.Class.Name, p.cfg.NodeName, c.src.id, room.Pool, n, room.Free, c.Class.SpareBytes(), pendingNote(room))
	})
}

// checkPoolRoom re-reads LVM once before refusing; room lock held.
func (p *Provisioner) checkPoolRoom(ctx context.Context, class *deviceclass.DeviceClass, need func(vgview.PoolRoom) uint64, refuse func(vgview.PoolRoom, uint64) error) error {
	room, err := p.cfg.View.PoolRoom(class)
	if err != nil {
		return wrap(err, "device class "+class.Name)
	}
	if need(room) > room.Free {
		if rerr := p.cfg.View.Refresh(ctx); rerr != nil {
			klog.FromContext(ctx).Error(rerr, "Refreshing the volume-group view before refusing a copy failed")
		} else if room, err = p.cfg.View.PoolRoom(class); err != nil {
			return wrap(err, "device class "+class.Name)
		}
	}
	if n := need(room); n > room.Free {
		return refuse(room, n)
	}
	return nil
}

func pendingNote(room vgview.PoolRoom) string {
	if room.Pending == 0 {
		return ""
	}
	return fmt.Sprintf(", less %d bytes that copies still running into it may write", room.Pending)
}

// sparseInto: the target is a thin LV this call made in a zeroing pool.
func (p *Provisioner) sparseInto(c *createCall) bool {
	if !c.fresh || !c.Class.Thin() {
		return false
	}
	pool, ok := p.cfg.View.Pool(c.Class.VolumeGroup, c.Class.ThinPool)
	return ok && pool.ZeroNewBlocks
}

func (src *contentSource) sourceTag() string {
	if src.snapshot {
		return volume.FromSnapshotTag(src.id)
	}
	return volume.FromVolumeTag(src.id)
}

// makeFromSource makes c's LV: a thin snapshot of the source (grown to
// size), else an empty copy-pending LV that the caller fills outside the
// room lock. The caller holds the volume and room locks and checked room.
func (p *Provisioner) makeFromSource(ctx context.Context, c *createCall, size uint64) (*lvm.LogicalVolume, error) {
	class, src, lvName := c.Class, c.src, c.lvName
	log := klog.FromContext(ctx).WithValues("source", src.id)
	tags := append(volume.VolumeTags(c.Name, class.Name, c.Params), src.sourceTag())
	tags = append(tags, volume.IOLimitTags(c.IOLimits)...)
	tags = append(tags, askedTags(c.Range, size)...)
	tags = append(tags, encryptionTags(c.Request)...)
	var lv *lvm.LogicalVolume
	var err error
	t := time.Now()
	if src.thinInto(class) {
		lv, err = p.cfg.LVM.CreateSnapshot(ctx, lvm.SnapshotRequest{VolumeGroup: class.VolumeGroup, Origin: src.lv.Name, Name: lvName, Tags: tags, OriginLV: &src.lv})
	} else {
		creq := lvm.CreateRequest{VolumeGroup: class.VolumeGroup, Name: lvName, Size: size, Tags: append(tags, volume.TagCopyPending)}
		if class.Thin() {
			creq.ThinPool = class.ThinPool
		} else {
			creq.Options = class.LVCreateOptions
		}
		lv, err = p.cfg.LVM.CreateLV(ctx, creq)
		c.fresh = err == nil
	}
	p.cfg.Metrics.ObserveStep(c.phase, metrics.StepLVCreate, class.Name, time.Since(t), err)
	if errors.Is(err, lvm.ErrAlreadyExists) {
		got, gerr := p.cfg.LVM.GetLV(ctx, class.VolumeGroup, lvName)
		if gerr != nil {
			return nil, wrap(gerr, "looking up existing LV "+volume.VolumeID(class.VolumeGroup, lvName))
		}
		p.cfg.View.Created(*got)
		return p.existingFromSource(ctx, got, c, size)
	}
	if err != nil {
		if errors.Is(err, lvm.ErrInsufficientSpace) {
			p.refreshAfter(ctx, "an out-of-space lvcreate")
		}
		return nil, wrap(err, "creating LV "+volume.VolumeID(class.VolumeGroup, lvName))
	}
	p.cfg.View.Created(*lv)
	if src.thinInto(class) {
		if lv, err = p.grow(ctx, lv, size, class, c.phase); err != nil {
			return nil, err
		}
		log.Info("Created volume as a thin snapshot of its source", "size", lv.Size)
	} else {
		log.Info("Created volume to copy its source into", "size", lv.Size)
	}
	return lv, nil
}

// existingFromSource grows a thin LV a crash left ungrown.
func (p *Provisioner) existingFromSource(ctx context.Context, lv *lvm.LogicalVolume, c *createCall, size uint64) (*lvm.LogicalVolume, error) {
	if err := sameVolume(lv, c.Request); err != nil {
		return nil, err
	}
	if volume.CopyPending(lv.Tags) {
		klog.FromContext(ctx).Info("Volume exists with an unfinished copy; copying again", "source", c.src.id)
		return lv, nil
	}
	lv, err := p.grow(ctx, lv, size, c.Class, c.phase)
	if err != nil {
		return nil, err
	}
	if err := p.compatible(lv, c.Request); err != nil {
		return nil, err
	}
	return lv, nil
}

func (p *Provisioner) grow(ctx context.Context, lv *lvm.LogicalVolume, size uint64, class *deviceclass.DeviceClass, phase string) (*lvm.LogicalVolume, error) {
	if lv.Size >= size {
		return lv, nil
	}
	t := time.Now()
	got, err := p.cfg.LVM.ExtendLV(ctx, lv.VolumeGroup, lv.Name, size)
	p.cfg.Metrics.ObserveStep(phase, metrics.StepLVExtend, class.Name, time.Since(t), err)
	if err != nil {
		return nil, wrap(err, fmt.Sprintf("growing %s to %d bytes", volume.VolumeID(lv.VolumeGroup, lv.Name), size))
	}
	p.cfg.View.Extended(*lv, *got)
	return got, nil
}
