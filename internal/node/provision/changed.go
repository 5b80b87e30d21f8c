package provision

import (
	"context"
	"fmt"

	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/lvm"
)

// A backup's delta and a move's catch-up both use changedBlocks, so every
// move runs the code a backup tool is answered with.

const (
	// MapThinDelta: thin_delta, exact at the pool's block.
	MapThinDelta = "thin_delta"
	// MapCOW: the copy-on-write exception tables, a superset in chunks.
	MapCOW = "cow_exceptions"
)

// changedBlocks names, from device-mapper metadata, every byte where lv (a
// later snapshot, or the volume) may differ from base, an older snapshot;
// both active.
//   - Thin, one pool: thin_delta between their thin IDs.
//   - Thick: base's exception table (every origin chunk written since), and
//     lv's own when it is a snapshot too, which base's holds unless both
//     were taken in one second (LVM's clock does not order them); plus the
//     bytes the volume grew by. A superset.
//
// A pair no metadata maps is ErrRefused; the catch-up then compares data,
// a backup's delta fails.
func (p *Provisioner) changedBlocks(ctx context.Context, base, lv *lvm.LogicalVolume) (method string, set changemap.Set, err error) {
	finder := p.cfg.Changes
	if finder == nil {
		return "", nil, errorf(ErrRefused, "node %s names no changes from device-mapper metadata", p.cfg.NodeName)
	}
	thin := lv.Attr.Type == lvm.TypeThin
	switch {
	case thin && base.Attr.Type == lvm.TypeThin && lv.Pool != "" && lv.Pool == base.Pool:
		if base.ThinID != 0 && lv.ThinID != 0 {
			set, err = finder.ThinChangesOfIDs(ctx, lv.VolumeGroup, lv.Pool, base.ThinID, lv.ThinID)
		} else {
			set, err = finder.ThinChanges(ctx, lv.VolumeGroup, lv.Pool, base.Name, lv.Name)
		}
		if err != nil {
			return MapThinDelta, nil, fmt.Errorf("%s failed: %w", MapThinDelta, err)
		}
		return MapThinDelta, set, nil
	case thin && base.Attr.Type == lvm.TypeThin:
		return "", nil, errorf(ErrRefused, "the base is in thin pool %q, the volume in %q: no one pool's metadata maps the changes between them", base.Pool, lv.Pool)
	case base.Attr.Type == lvm.TypeSnapshot && base.VolumeGroup == lv.VolumeGroup && base.Origin != "" &&
		(lv.Attr.Type == lvm.TypeThick && lv.Name == base.Origin || lv.Attr.Type == lvm.TypeSnapshot && lv.Origin == base.Origin):
		tables := []*lvm.LogicalVolume{base}
		if lv.Attr.Type == lvm.TypeSnapshot {
			tables = append(tables, lv)
		}
		for _, s := range tables {
			t, err := finder.SnapshotChanges(ctx, s.VolumeGroup, s.Name)
			if err != nil {
				return MapCOW, nil, fmt.Errorf("%s failed: %w", MapCOW, err)
			}
			for _, e := range t {
				set = set.Add(e.Off, e.Len)
			}
		}
		if old, now := SnapshotSize(base), SnapshotSize(lv); old < now {
			set = set.Add(old, now-old)
		}
		return MapCOW, set, nil
	}
	return "", nil, errorf(ErrRefused, "no metadata maps the changes of a %s LV (origin %q) since a %s base (origin %q)", lv.Attr.Type, lv.Origin, base.Attr.Type, base.Origin)
}
