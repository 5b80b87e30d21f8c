package provision

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/volume"
)

// A catch-up is a move's last copy (peercopy, delta.go): the target, copied
// from a snapshot of the source (the base), gets only the chunks that differ
// since, from device-mapper metadata where possible, else by comparing. The
// target keeps volume.TagCopyPending until its content matched the source's
// digest and was synced, so a crash never leaves it looking finished.

// CatchUpRequest is one catch-up of a volume of this node.
type CatchUpRequest struct {
	VolumeID string
	// Source is the source node's grant; Size is the source volume's.
	Source RemoteSource
	// Base is the snapshot of the source the target was made from.
	Base string
}

// DeltaResult is what a catch-up did.
type DeltaResult struct {
	Received uint64
	// Sum is the digest of the target's whole content, equal to the source's.
	Sum      []byte
	Duration time.Duration
}

// DeltaPuller writes a catch-up stream into dst, syncs it and checks it
// against the source's digest (only the places written when sentOK).
type DeltaPuller interface {
	PullDelta(ctx context.Context, src RemoteSource, dst string, sentOK bool, progress func(uint64)) (DeltaResult, error)
}

type tagAdder interface {
	ChangeTags(ctx context.Context, vg, name string, add, del []string) error
}

// CatchUp brings r.VolumeID up to date from r.Source under its lock. The
// copy-pending tag comes off only once the data checked out and was synced.
func (p *Provisioner) CatchUp(ctx context.Context, r CatchUpRequest) (DeltaResult, error) {
	var res DeltaResult
	dp, ok := p.cfg.Puller.(DeltaPuller)
	if !ok {
		return res, errorf(ErrUnavailable, "node %s copies from no other node", p.cfg.NodeName)
	}
	tagger, ok := p.cfg.LVM.(tagAdder)
	if !ok {
		return res, errorf(ErrInternal, "the LVM client of node %s cannot tag volumes", p.cfg.NodeName)
	}
	id, src := r.VolumeID, r.Source
	vg, name, err := volume.ParseVolumeID(id)
	if err != nil {
		return res, errorf(ErrNotFound, "target_volume_id: volume %q does not exist: %v", id, err)
	}
	unlock, err := p.Lock(name, "volume "+id)
	if err != nil {
		return res, err
	}
	defer unlock()
	lv, err := p.volumeFromLVM(ctx, vg, name, id)
	if err != nil {
		return res, err
	}
	if lv.Attr.Open {
		return res, errorf(ErrRefused, "target volume %s is open on node %s (staged or mounted): a catch-up writes only into a volume nothing uses", id, p.cfg.NodeName)
	}
	if !slices.Contains(volume.SourceTags(lv.Tags), volume.FromSnapshotTag(r.Base)) {
		return res, reasonf(ErrRefused, moveapi.ErrorNotFromBase, "target volume %s on node %s was not made from base %s (its source tags: %q): a catch-up sends only what changed since the base, so its target must hold the base",
			id, p.cfg.NodeName, r.Base, volume.SourceTags(lv.Tags))
	}
	if lv.Size != src.Size {
		return res, reasonf(ErrRefused, moveapi.ErrorSizeMismatch, "target volume %s on node %s has %d bytes, the source %s on node %s has %d: a catch-up needs both of one size",
			id, p.cfg.NodeName, lv.Size, src.ID, src.Node, src.Size)
	}
	log := klog.FromContext(ctx).WithValues("volumeID", id, "source", src.ID, "sourceNode", src.Node, "base", r.Base, "copy", src.CopyID)
	sentOK := true
	if lv.Attr.Type == lvm.TypeThin {
		if sentOK, err = p.markThinCatchUp(ctx, tagger, lv); err != nil {
			return res, err
		}
		if !sentOK {
			log.Info("The target's thin pool does not zero new blocks: the catch-up checks the whole volume, not only the places it writes", "pool", lv.Pool)
		}
	} else if err := p.markCatchUp(ctx, tagger, lv); err != nil {
		return res, err
	}
	if !volume.CopyPending(lv.Tags) {
		pending := *lv
		pending.Tags = append(append([]string(nil), lv.Tags...), volume.TagCopyPending)
		lv = &pending
	}
	write, _, err := p.copyDevice(ctx, lv, "target")
	if err != nil {
		return res, err
	}
	res, err = dp.PullDelta(ctx, src, p.devicePath(write), sentOK, nil)
	if err != nil {
		return res, fmt.Errorf("catching up %s from %s on node %s (%d bytes written; it stays copy-pending, and a repeat starts again): %w",
			id, src.ID, src.Node, res.Received, err)
	}
	if _, err := p.copied(ctx, write); err != nil {
		return res, err
	}
	log.Info("Caught up with the source volume on another node", "receivedBytes", res.Received, "duration", res.Duration)
	return res, nil
}

// markCatchUp tags lv copy-pending (maybe again, after a crash).
func (p *Provisioner) markCatchUp(ctx context.Context, tagger tagAdder, lv *lvm.LogicalVolume) error {
	if volume.CopyPending(lv.Tags) {
		return nil
	}
	id := volume.VolumeID(lv.VolumeGroup, lv.Name)
	if err := tagger.ChangeTags(ctx, lv.VolumeGroup, lv.Name, []string{volume.TagCopyPending}, nil); err != nil {
		return wrap(err, "marking "+id+" copy-pending for its catch-up")
	}
	pending := *lv
	pending.Tags = append(append([]string(nil), lv.Tags...), volume.TagCopyPending)
	p.cfg.View.Created(pending)
	return nil
}

// markThinCatchUp checks under the room lock that the catch-up fits thin lv's
// pool (a full pool stops all its volumes) and tags lv before unlocking.
// sentOK is false in a pool that does not zero new blocks, where a new block
// keeps old data beside the writes.
func (p *Provisioner) markThinCatchUp(ctx context.Context, tagger tagAdder, lv *lvm.LogicalVolume) (sentOK bool, err error) {
	id := volume.VolumeID(lv.VolumeGroup, lv.Name)
	cname, _ := volume.ClassFromTags(lv.Tags)
	class, ok := p.cfg.Classes.Class(cname)
	if !ok || !class.Thin() || class.VolumeGroup != lv.VolumeGroup || class.ThinPool != lv.Pool {
		return false, errorf(ErrRefused, "target volume %s on node %s: thin pool %s is no thin device class's of this node (class tag %q): its room cannot be checked", id, p.cfg.NodeName, lv.Pool, cname)
	}
	unlockRoom, err := p.cfg.View.LockRoom(ctx, lv.VolumeGroup)
	if err != nil {
		return false, wrap(err, "volume "+id)
	}
	defer unlockRoom()
	if err := p.cfg.View.Refresh(ctx); err != nil {
		return false, wrap(err, "reading thin pool "+lv.VolumeGroup+"/"+lv.Pool+" before the catch-up of "+id)
	}
	// A target tagged already counts in the pool's Pending.
	var own uint64
	if volume.CopyPending(lv.Tags) {
		own = lv.Size
	}
	var zeroes bool
	err = p.checkPoolRoom(ctx, class, func(room vgview.PoolRoom) uint64 {
		zeroes = room.ZeroNewBlocks
		return sub(lv.Size, own)
	}, func(room vgview.PoolRoom, n uint64) error {
		return errorf(ErrNoRoom, "device class %s on node %s: the catch-up of %s into thin pool %s may write %d bytes of real space (the volume's size: it may provision any block the seed did not); the pool has %d bytes free (after a spare of %d%s)",
			class.Name, p.cfg.NodeName, id, room.Pool, n, room.Free, class.SpareBytes(), pendingNote(room))
	})
	if err != nil {
		return false, err
	}
	return zeroes, p.markCatchUp(ctx, tagger, lv)
}

func sub(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// ChangeFinder names changes from device-mapper metadata; *changemap.Finder.
type ChangeFinder interface {
	ThinChanges(ctx context.Context, vg, pool, base, vol string) (changemap.Set, error)
	SnapshotChanges(ctx context.Context, vg, snap string) (changemap.Set, error)
	ThinMapped(ctx context.Context, vg, pool, vol string) (changemap.Set, error)
	// The *OfIDs variants need only the pool active.
	ThinChangesOfIDs(ctx context.Context, vg, pool string, baseID, volID uint64) (changemap.Set, error)
	ThinMappedOfID(ctx context.Context, vg, pool string, id uint64) (changemap.Set, error)
	PoolActive(vg, pool string) bool
}

// DeltaCompare is the Delta.Method when no metadata named the changes.
const DeltaCompare = "compare"

// Delta is what ReadDelta hands its reader.
type Delta struct {
	Volume, Base string
	Size         uint64
	Method       string
	// Changed holds every byte that may differ, unless Method is DeltaCompare.
	Changed  changemap.Set
	Fallback string
}

// changes falls back to the compare, and says why, when changedBlocks fails.
func (p *Provisioner) changes(ctx context.Context, lv, base *lvm.LogicalVolume) (method string, set changemap.Set, why string) {
	method, set, err := p.changedBlocks(ctx, base, lv)
	if err != nil {
		return DeltaCompare, nil, err.Error()
	}
	return method, set, ""
}

// DeltaSize is the size of volumeID for a catch-up against baseID.
func (p *Provisioner) DeltaSize(ctx context.Context, volumeID, baseID string) (uint64, error) {
	lv, _, err := p.deltaSource(ctx, volumeID, baseID)
	if err != nil {
		return 0, err
	}
	return lv.Size, nil
}

// ReadDelta hands read the devices and changes under the volume's lock. A
// volume opened meanwhile, or an overflowed base, is ErrRefused.
func (p *Provisioner) ReadDelta(ctx context.Context, volumeID, baseID string, read func(Delta) error) error {
	_, name, err := volume.ParseVolumeID(volumeID)
	if err != nil {
		return errorf(ErrNotFound, "volume %q does not exist: %v", volumeID, err)
	}
	unlock, err := p.Lock(name, "volume "+volumeID)
	if err != nil {
		return err
	}
	defer unlock()
	lv, base, err := p.deltaSource(ctx, volumeID, baseID)
	if err != nil {
		return err
	}
	vol, _, err := p.copyDevice(ctx, lv, "source")
	if err != nil {
		return err
	}
	old, activated, err := p.copyDevice(ctx, base, "base")
	if err != nil {
		return err
	}
	if activated {
		defer p.deactivateAfterCopy(context.WithoutCancel(ctx), old)
	}
	d := Delta{Volume: p.devicePath(vol), Base: p.devicePath(old), Size: lv.Size}
	d.Method, d.Changed, d.Fallback = p.changes(ctx, vol, old)
	if d.Method == DeltaCompare {
		klog.FromContext(ctx).Info("A catch-up compares the whole volume with its base: its changes cannot be named from metadata",
			"volumeID", volumeID, "base", baseID, "reason", d.Fallback)
	}
	rerr := read(d)
	// The target closes the stream as soon as it checked the data: the checks
	// after the read must not be canceled with it.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), afterReadTimeout)
	defer cancel()
	if unusable, aerr := p.sourceSpent(ctx, old); aerr == nil && unusable != nil {
		return reasonf(ErrRefused, moveapi.ErrorBaseOverflowed, "base %s ran out of its snapshot space while it was read; the catch-up is not used: %v", baseID, unusable)
	}
	if rerr != nil {
		return rerr
	}
	after, err := p.cfg.LVM.GetLV(ctx, lv.VolumeGroup, lv.Name)
	if err != nil {
		return wrap(err, "reading volume "+volumeID+" after its catch-up")
	}
	if after.Attr.Open {
		return errorf(ErrRefused, "volume %s was opened on node %s while it was read for a catch-up: it may have changed; a catch-up reads only a volume nothing uses", volumeID, p.cfg.NodeName)
	}
	return nil
}

const afterReadTimeout = time.Minute

// deltaSource reads LVM (whether a volume is open changes without carve):
// ErrNotFound, or ErrRefused when open, copy-pending, or the base overflowed.
func (p *Provisioner) deltaSource(ctx context.Context, volumeID, baseID string) (*lvm.LogicalVolume, *lvm.LogicalVolume, error) {
	vg, name, err := volume.ParseVolumeID(volumeID)
	if err != nil {
		return nil, nil, errorf(ErrNotFound, "volume_id: volume %q does not exist: %v", volumeID, err)
	}
	base, err := p.SnapshotByID(ctx, baseID, false)
	if errors.Is(err, ErrElsewhere) {
		return nil, nil, errorf(ErrNotFound, "base_snapshot_id: %v", err)
	}
	if err != nil {
		return nil, nil, err
	}
	if origin, _ := volume.OriginFromTags(base.Tags); origin != name || base.VolumeGroup != vg {
		return nil, nil, errorf(ErrNotFound, "base_snapshot_id: snapshot %s is of volume %s, not of %s", baseID, volume.VolumeID(base.VolumeGroup, origin), volumeID)
	}
	if err := SnapshotUsable(base); err != nil {
		return nil, nil, reasonf(ErrRefused, moveapi.ErrorBaseOverflowed, "base_snapshot_id: snapshot %s cannot be read: %v", baseID, err)
	}
	lv, err := p.volumeFromLVM(ctx, vg, name, volumeID)
	if err != nil {
		return nil, nil, err
	}
	if lv.Attr.Open {
		return nil, nil, errorf(ErrRefused, "volume %s is open on node %s (staged or mounted: still in use); a catch-up reads it only once nothing uses it", volumeID, p.cfg.NodeName)
	}
	if volume.CopyPending(lv.Tags) {
		return nil, nil, reasonf(ErrRefused, moveapi.ErrorSourceCopyPending, "volume %s is still being copied into; it cannot be the source of a catch-up", volumeID)
	}
	return lv, base, nil
}

func (p *Provisioner) volumeFromLVM(ctx context.Context, vg, name, id string) (*lvm.LogicalVolume, error) {
	if !p.cfg.Classes.HasVolumeGroup(vg) {
		return nil, errorf(ErrNotFound, "volume %s does not exist on node %s: volume group %s is none of its device classes'", id, p.cfg.NodeName, vg)
	}
	lv, err := p.cfg.LVM.GetLV(ctx, vg, name)
	if errors.Is(err, lvm.ErrNotFound) {
		return nil, errorf(ErrNotFound, "volume %s does not exist on node %s", id, p.cfg.NodeName)
	}
	if err != nil {
		return nil, wrap(err, "looking up volume "+id)
	}
	if k, _, owned := volume.Owned(lv.Tags); !owned || k != volume.KindVolume {
		return nil, errorf(ErrNotFound, "volume %s does not exist: LV %s/%s is not a carve volume", id, vg, name)
	}
	return lv, nil
}
