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

// A volume made from a content source (a restore from a snapshot, a clone
// of a volume) is, when the source is a thin LV in the pool of the asked
// class, a writable thin snapshot of it: instant, sharing blocks. Any
// other pairing copies the data into a new LV (blockcopy): the LV is made
// with volume.TagCopyPending, the data is copied and synced, and only
// then is the tag removed and the volume reported made. A clone copies
// from a temporary snapshot of its source, so that the copy is of one
// moment while the source is written. The copy is detached from the
// request's context: csi-provisioner gives up on a long call and retries,
// the retries answer ErrBusy while the copy runs, and the first retry
// after it finishes finds the volume made.

// copyTimeout bounds a copy that runs detached from its request.
const copyTimeout = 12 * time.Hour

// contentSource is a resolved volume_content_source.
type contentSource struct {
	// lv is the snapshot or volume LV to read.
	lv lvm.LogicalVolume
	// size is the size of the volume it holds.
	size uint64
	// id is the snapshot or volume ID, what names it in messages.
	id string
	// snapshot is true for a snapshot, false for a volume.
	snapshot bool
	// remote is set for a source on another node (lv is then unset).
	remote *RemoteSource
}

// resolveSource finds the LV of a content source on this node. A source
// of another node is ErrElsewhere naming that node (so that the pod is
// scheduled again): a snapshot ID names its node, a volume's node is carve
// controller's to know. A source that exists nowhere is
// ErrNotFound; a copy-on-write snapshot whose space ran out, or whose
// size tag is gone, is ErrRefused. A source of another node that the
// request's context grants a copy of (RemoteSource) is that remote source.
func (p *Provisioner) resolveSource(ctx context.Context, cs *Source) (*contentSource, error) {
	if rs := p.remoteSourceFor(ctx, cs); rs != nil {
		return p.resolveRemote(rs)
	}
	return p.resolveLocal(ctx, cs)
}

// resolveLocal finds the LV of a content source on this node (see
// resolveSource).
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
			// A copy of 0 bytes would hand out an empty volume as the
			// restore.
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

// sourceElsewhere answers for a clone's source volume that is not on this
// node (notHere says why): ErrNotFound. Which node holds it is carve
// controller's to know (the node agent has no API access): it sends a
// clone to its source's node, or grants a copy from there.
func (p *Provisioner) sourceElsewhere(notHere error) error {
	return errorf(ErrNotFound, "volume_content_source: %s (carve controller sends a clone to its source's node, or grants a copy from there)", notHere.Error())
}

// thinInto tells whether a source can become a volume of class as a thin
// snapshot: a thin LV in the class's pool.
func (src *contentSource) thinInto(class *deviceclass.DeviceClass) bool {
	return class.Thin() && src.lv.Attr.Type == lvm.TypeThin && src.lv.VolumeGroup == class.VolumeGroup && src.lv.Pool == class.ThinPool
}

// copiesIntoThin tells whether a volume of class made from src is a copy
// into a thin LV: the class is thin and src is not a thin LV of its pool.
func (src *contentSource) copiesIntoThin(class *deviceclass.DeviceClass) bool {
	return class.Thin() && !src.thinInto(class)
}

// checkCopyRoom checks, for a copy into a thin LV of size bytes, that
// what the copy writes fits the pool's real free space minus the spare,
// without the overprovision ratio: dm-thin provisions every block written,
// and a pool that fills stops every thin volume in it. The copy writes
// only the source's chunks that hold data (sparseInto), but which those
// are is known only by reading the whole source, as long as the copy
// itself; the bound is the source's size (a pool that does not zero new
// blocks gets every byte of the target, so size). Copies still running
// into the pool count for their whole size (vgview.PoolRoom). The caller
// holds the room lock.
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

// checkPoolRoom checks that need(room) bytes fit the real room of thin
// class's pool (vgview.PoolRoom), reading LVM once more before it
// refuses with refuse's error. The caller holds the room lock.
func (p *Provisioner) checkPoolRoom(ctx context.Context, class *deviceclass.DeviceClass, need func(vgview.PoolRoom) uint64, refuse func(vgview.PoolRoom, uint64) error) error {
	room, err := p.cfg.View.PoolRoom(class)
	if err != nil {
		return wrap(err, "device class "+class.Name)
	}
	if need(room) > room.Free {
		// Space freed outside carve shows at the next refresh: read LVM
		// once before refusing, as checkRoom does.
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

// pendingNote says, for a refusal, what copies still running into the
// pool hold of its room.
func pendingNote(room vgview.PoolRoom) string {
	if room.Pending == 0 {
		return ""
	}
	return fmt.Sprintf(", less %d bytes that copies still running into it may write", room.Pending)
}

// sparseInto tells whether c's copy may skip the source's zeros: its
// target is a thin LV this call made (never written: every block reads
// as zeros until written) in a pool that zeroes new blocks (a block the
// copy provisions reads zeros where a skipped chunk lies in it).
func (p *Provisioner) sparseInto(c *createCall) bool {
	if !c.fresh || !c.Class.Thin() {
		return false
	}
	pool, ok := p.cfg.View.Pool(c.Class.VolumeGroup, c.Class.ThinPool)
	return ok && pool.ZeroNewBlocks
}

// removeUnfinishedCopy removes the LV of an unfinished copy into a thin
// LV, found again by a retry (lv, never handed out), so that the copy
// goes into a new LV, and re-reads the room.
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

// sourceTag is the tag of a volume made from src.
func (src *contentSource) sourceTag() string {
	if src.snapshot {
		return volume.FromSnapshotTag(src.id)
	}
	return volume.FromVolumeTag(src.id)
}

// makeFromSource makes the LV of c from its source, of size bytes: a thin
// snapshot of the source (grown to size) when the source is a thin LV of
// the class's pool, else an empty LV carrying volume.TagCopyPending, which
// the caller fills (copyInto) outside the room lock. The caller holds the
// volume's lock and the room lock and has checked the room for size bytes.
func (p *Provisioner) makeFromSource(ctx context.Context, c *createCall, size uint64) (*lvm.LogicalVolume, error) {
	class, src, lvName := c.Class, c.src, c.lvName
	log := klog.FromContext(ctx).WithValues("source", src.id)
	tags := append(volume.VolumeTags(c.Name, class.Name, c.Params), src.sourceTag())
	tags = append(tags, askedTags(c.Range, size)...)
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
		// The view missed it: ask LVM and treat it as a repeat.
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

// existingFromSource answers for an LV made from a source before: a thin
// one is grown to size if a crash came before its growth; one whose copy
// did not finish is returned for the caller to copy again.
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

// grow extends a thin volume made from a smaller source to size bytes.
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

// copyInto copies src's data into the new LV dst (which carries
// TagCopyPending), then removes the tag; sparse skips the source's zeros
// and the target's tail (sparseInto). A clone reads a temporary
// snapshot of its source, removed afterwards. The copy runs detached from
// the request (see above) and is redone from the start when retried.
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
		// Done or failed, the copy needs it no more: a retry takes a new
		// one, of the source as it is then.
		defer p.removeCopySource(ctx, dst.VolumeGroup, tmp)
	}
	read, activated, err := p.copyDevice(ctx, &from, "source")
	if err != nil {
		return nil, err
	}
	if activated && src.snapshot {
		// A snapshot kept as a snapshot stays inactive until needed (a
		// thin one has the activation-skip flag): deactivate it again,
		// copied or not, so that its device is not left open to writes.
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
	// A copy-on-write source that ran out of space during the copy (or
	// before it: the view the source was found in may be older) was read
	// half old, half lost, or not at all. The copy is then not used, and
	// stays unfinished.
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
	// The copy is synced: it is whole whatever happens next. The tag goes
	// first, the temporary snapshot after (one left by a crash is removed
	// by the retry or by DeleteVolume).
	done, err := p.copied(ctx, write)
	if err != nil {
		return nil, err
	}
	log.Info("Copied the volume's data", "bytes", res.Bytes, "skippedZeros", res.Skipped, "duration", res.Duration)
	return done, nil
}

// sourceSpent tells, after a copy from lv, whether lv ran out of its
// copy-on-write space (unusable says how), or err when that cannot be
// read. Only a copy-on-write snapshot can; its state comes from the
// kernel (no lvm command), or from LVM when the kernel's cannot be read.
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

// copyDevice returns an LV of a copy with its device node: an active LV
// has one, so the common case asks LVM nothing; an LV without one (after
// a reboot, or a snapshot made with the activation-skip flag) is
// activated, and activated says so.
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

// deactivateAfterCopy deactivates a source that copyDevice activated; a
// failure (another copy reading it now, say) is logged, not returned: the
// copy is whole either way.
func (p *Provisioner) deactivateAfterCopy(ctx context.Context, lv *lvm.LogicalVolume) {
	if err := p.cfg.LVM.DeactivateLV(ctx, lv.VolumeGroup, lv.Name); err != nil && !errors.Is(err, lvm.ErrNotFound) {
		klog.FromContext(ctx).Error(err, "Deactivating a snapshot activated for a copy failed; it stays active", "lv", lv.VolumeGroup+"/"+lv.Name)
		return
	}
	inactive := *lv
	inactive.Attr.Active = false
	p.cfg.View.Created(inactive)
}

// copySource makes (again, if a crashed try left one) the temporary
// snapshot of a clone's source volume.
func (p *Provisioner) copySource(ctx context.Context, target string, class *deviceclass.DeviceClass, src *lvm.LogicalVolume) (lvm.LogicalVolume, error) {
	name := volume.CopySourceLVNameFor(target)
	// A snapshot left by an earlier try is of an older moment: make it
	// anew, so that the clone is of the source as it is now.
	p.removeCopySource(ctx, src.VolumeGroup, name)
	req := lvm.SnapshotRequest{VolumeGroup: src.VolumeGroup, Origin: src.Name, Name: name, Tags: volume.CopySourceTags(target, class.Name), OriginLV: src}
	srcClass := class
	if c, ok := volume.ClassFromTags(src.Tags); ok {
		if d, ok := p.cfg.Classes.Class(c); ok {
			srcClass = d
		}
	}
	// It takes room as any snapshot does (its copy-on-write space from the
	// volume group, or a thin LV's virtual size in the pool): checked and
	// made under the room lock, so that it never eats the spare that a
	// concurrent create or expansion counted on.
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
		// Not a snapshot a restore reads: no size tag.
		req.Tags = volume.CopySourceTags(target, class.Name)
	case src.Attr.Type != lvm.TypeThin:
		// A source whose class is gone or changed: size the space by
		// the class asked, as before.
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

// removeCopySource removes a temporary snapshot if it is there; a failure
// is logged, not returned: the copy it served is whole.
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
