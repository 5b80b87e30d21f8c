package provision

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// Block maps come from device-mapper metadata, without reading data. Devices
// and the pool's metadata snapshot are held only while it is read, never
// while a slow client reads the answer.

// How a block map was made (BlockMap.Method).
const (
	MapThinDump = "thin_dump"
	// MapWhole: a thick snapshot, allocated whole.
	MapWhole = "whole"
)

// BlockMap is the answer of SnapshotAllocated and SnapshotDelta.
type BlockMap struct {
	// Capacity is the size of the snapshot's volume; every block lies below it.
	Capacity uint64
	// Blocks are exact for a thin snapshot, a superset in chunks for a thick one.
	Blocks changemap.Set
	Method string
}

// SnapshotAllocated is the block map of snapshot id's allocated blocks.
// Errors: ErrInvalid, ErrNotFound, ErrBusy, ErrRefused.
func (p *Provisioner) SnapshotAllocated(ctx context.Context, id string) (BlockMap, error) {
	var m BlockMap
	// A thick snapshot's answer is its size alone: no activation.
	thin := func(lv *lvm.LogicalVolume) bool { return lv.Attr.Type == lvm.TypeThin }
	err := p.withSnapshots(ctx, []snapshotArg{{"snapshot_id", id}}, thin, func(snaps []*lvm.LogicalVolume) error {
		s := snaps[0]
		var err error
		if m.Capacity, err = snapshotCapacity(s, "snapshot_id", id); err != nil {
			return err
		}
		if s.Attr.Type != lvm.TypeThin {
			m.Method, m.Blocks = MapWhole, changemap.Set{}.Add(0, m.Capacity)
			return nil
		}
		var set changemap.Set
		if s.ThinID != 0 {
			set, err = p.cfg.Changes.ThinMappedOfID(ctx, s.VolumeGroup, s.Pool, s.ThinID)
		} else {
			set, err = p.cfg.Changes.ThinMapped(ctx, s.VolumeGroup, s.Pool, s.Name)
		}
		if err != nil {
			return wrapBlocks(err, "the mapped blocks of snapshot "+id)
		}
		m.Method, m.Blocks = MapThinDump, set
		return nil
	})
	if err != nil {
		return BlockMap{}, err
	}
	m.Blocks = clip(m.Blocks, m.Capacity)
	return m, nil
}

// SnapshotDelta is where snapshot targetID may differ from the older baseID
// of the same volume (changedBlocks). Errors as SnapshotAllocated's.
func (p *Provisioner) SnapshotDelta(ctx context.Context, baseID, targetID string) (BlockMap, error) {
	var m BlockMap
	args := []snapshotArg{{"base_snapshot_id", baseID}, {"target_snapshot_id", targetID}}
	mapped := func(lv *lvm.LogicalVolume) bool {
		return lv.Attr.Type == lvm.TypeThin || lv.Attr.Type == lvm.TypeSnapshot
	}
	err := p.withSnapshots(ctx, args, mapped, func(snaps []*lvm.LogicalVolume) error {
		base, target := snaps[0], snaps[1]
		if err := deltaPair(base, target, baseID, targetID); err != nil {
			return err
		}
		var err error
		if m.Capacity, err = snapshotCapacity(target, "target_snapshot_id", targetID); err != nil {
			return err
		}
		m.Method, m.Blocks, err = p.changedBlocks(ctx, base, target)
		if errors.Is(err, ErrRefused) {
			return errorf(ErrRefused, "base_snapshot_id: snapshot %s, target_snapshot_id %s: %v", baseID, targetID, err)
		}
		if err != nil {
			return wrapBlocks(err, "the blocks where snapshot "+targetID+" differs from "+baseID)
		}
		return nil
	})
	if err != nil {
		return BlockMap{}, err
	}
	m.Blocks = clip(m.Blocks, m.Capacity)
	return m, nil
}

type snapshotArg struct{ field, id string }

// withSnapshots runs read under the snapshots' per-volume locks with the
// devices device asks for active, then checks no copy-on-write one overflowed.
func (p *Provisioner) withSnapshots(ctx context.Context, args []snapshotArg, device func(*lvm.LogicalVolume) bool, read func([]*lvm.LogicalVolume) error) error {
	if p.cfg.Changes == nil {
		return errorf(ErrRefused, "node %s names no blocks from device-mapper metadata", p.cfg.NodeName)
	}
	snaps := make([]*lvm.LogicalVolume, 0, len(args))
	for _, a := range args {
		if a.id == "" {
			return errorf(ErrInvalid, "%s: must be set", a.field)
		}
		_, _, name, err := volume.ParseSnapshotID(a.id)
		if err != nil {
			return errorf(ErrNotFound, "%s: snapshot %q does not exist: %v", a.field, a.id, err)
		}
		unlock, err := p.Lock(name, a.field+" "+a.id+" (a snapshot being made or deleted)")
		if err != nil {
			if len(snaps) == 1 && snaps[0].Name == name {
				return errorf(ErrInvalid, "%s and %s: both name snapshot %s", args[0].field, a.field, a.id)
			}
			return err
		}
		defer unlock()
		lv, err := p.SnapshotByID(ctx, a.id, false)
		if errors.Is(err, ErrElsewhere) {
			return errorf(ErrNotFound, "%s: %v", a.field, err)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", a.field, err)
		}
		if err := SnapshotUsable(lv); err != nil {
			return errorf(ErrRefused, "%s: snapshot %s: %v", a.field, a.id, err)
		}
		if !device(lv) {
			snaps = append(snaps, lv)
			continue
		}
		if withID, ok := p.thinIDFromLVM(ctx, lv); ok {
			snaps = append(snaps, withID)
			continue
		}
		dev, activated, err := p.copyDevice(ctx, lv, "snapshot")
		if err != nil {
			return fmt.Errorf("%s: %w", a.field, err)
		}
		if activated {
			defer p.deactivateAfterCopy(context.WithoutCancel(ctx), dev)
		}
		snaps = append(snaps, dev)
	}
	start := time.Now()
	if err := read(snaps); err != nil {
		return err
	}
	for _, a := range args {
		s := snaps[0]
		snaps = snaps[1:]
		if !device(s) {
			continue
		}
		if unusable, err := p.sourceSpent(ctx, s); err == nil && unusable != nil {
			return errorf(ErrRefused, "%s: snapshot %s ran out of its copy-on-write space while its blocks were read: %v", a.field, a.id, unusable)
		}
	}
	klog.FromContext(ctx).V(2).Info("Read snapshot metadata", "snapshots", len(args), "took", time.Since(start))
	return nil
}

type thinIDReader interface {
	ThinID(ctx context.Context, vg, name string) (uint64, error)
}

// thinIDFromLVM reads lv's thin ID from LVM when its pool is active, sparing
// the activation, most of a call's time. Not ok otherwise.
func (p *Provisioner) thinIDFromLVM(ctx context.Context, lv *lvm.LogicalVolume) (*lvm.LogicalVolume, bool) {
	r, ok := p.cfg.LVM.(thinIDReader)
	if !ok || lv.Attr.Type != lvm.TypeThin || lv.Pool == "" || !p.cfg.Changes.PoolActive(lv.VolumeGroup, lv.Pool) {
		return nil, false
	}
	id, err := r.ThinID(ctx, lv.VolumeGroup, lv.Name)
	if err != nil || id == 0 {
		klog.FromContext(ctx).V(2).Info("Reading a thin ID from LVM failed; activating the LV to read its table", "lv", lv.VolumeGroup+"/"+lv.Name, "thinID", id, "err", err)
		return nil, false
	}
	withID := *lv
	withID.ThinID = id
	return &withID, true
}

// deltaPair refuses a base that is not an older snapshot of the target's
// volume; snapshots of one second are not ordered.
func deltaPair(base, target *lvm.LogicalVolume, baseID, targetID string) error {
	bo, _ := volume.OriginFromTags(base.Tags)
	to, _ := volume.OriginFromTags(target.Tags)
	if bo != to || base.VolumeGroup != target.VolumeGroup {
		return errorf(ErrInvalid, "base_snapshot_id: snapshot %s is of volume %s, target_snapshot_id %s of volume %s: a delta is between two snapshots of one volume",
			baseID, volume.VolumeID(base.VolumeGroup, bo), targetID, volume.VolumeID(target.VolumeGroup, to))
	}
	if !base.Time.IsZero() && !target.Time.IsZero() && base.Time.After(target.Time) {
		return errorf(ErrInvalid, "base_snapshot_id: snapshot %s was taken at %s, after target_snapshot_id %s (%s): the base must be the older",
			baseID, base.Time.UTC().Format(time.RFC3339), targetID, target.Time.UTC().Format(time.RFC3339))
	}
	return nil
}

// snapshotCapacity is ErrRefused for a thick snapshot whose size tag is gone.
func snapshotCapacity(lv *lvm.LogicalVolume, field, id string) (uint64, error) {
	n := SnapshotSize(lv)
	if n == 0 {
		return 0, errorf(ErrRefused, "%s: snapshot %s records no size (its tag %s<bytes> is gone): put it back with lvchange --addtag", field, id, volume.TagSizePrefix)
	}
	return n, nil
}

// wrapBlocks: ErrUnavailable while another holds the metadata snapshot.
func wrapBlocks(err error, what string) error {
	if errors.Is(err, changemap.ErrMetadataSnapHeld) {
		return errorf(ErrUnavailable, "%s: %v", what, err)
	}
	return errorf(ErrInternal, "%s: %v", what, err)
}

func clip(s changemap.Set, size uint64) changemap.Set {
	out := make(changemap.Set, 0, len(s))
	for _, e := range s {
		if e.Off >= size {
			break
		}
		out = append(out, changemap.Extent{Off: e.Off, Len: min(e.Len, size-e.Off)})
	}
	return out
}
