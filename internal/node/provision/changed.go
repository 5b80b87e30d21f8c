package provision

import (
	"context"
	"fmt"

	"github.com/carve-csi/carve/internal/node/changemap"
	"github.com/carve-csi/carve/internal/node/lvm"
)

// Which blocks changed since a snapshot is named in one place: a backup's
// delta between two snapshots (SnapshotDelta, which answers the node
// channel's SnapshotBlocks and so the CSI SnapshotMetadata service) and a
// move's catch-up against its seed (ReadDelta) both call changedBlocks.
// Every move, and every restore moved on from its first copy, thus runs
// the code a backup tool is answered with, on real device-mapper.

// How the changes since a base were found (BlockMap.Method, Delta.Method).
const (
	// MapThinDelta: thin_delta between the two thin devices, exact at the
	// pool's block.
	MapThinDelta = "thin_delta"
	// MapCOW: the copy-on-write exception tables: a superset in the
	// snapshots' chunks.
	MapCOW = "cow_exceptions"
)

// changedBlocks names, from device-mapper metadata and without reading
// data, every byte where lv may differ from base, an older snapshot of the
// same volume. lv is a later snapshot of that volume (a backup's delta) or
// the volume itself (a move's catch-up); both must be active.
//
//   - Thin, both in one pool: thin_delta between their thin IDs (from
//     LVM's metadata when the caller read them, lvm.LogicalVolume.ThinID,
//     else from the active devices' tables): the pool blocks mapped
//     differently (rewritten, written or discarded since).
//   - Thick: the exception table of base, which lists each chunk of the
//     origin written since base was taken, so every chunk that differs;
//     when lv is a copy-on-write snapshot too, its own table as well,
//     which base's holds already unless the two were taken in the same
//     second (LVM's clock does not order them then). A superset: chunks
//     written after lv are named too.
//   - For a thick pair, the bytes the volume grew by since base.
//
// A pair no metadata maps (another pool, a thin base of a thick volume, a
// node without a ChangeFinder) is ErrRefused; a failure to read the
// metadata is returned as it is, wrapped with the method. The caller
// decides: the catch-up compares data instead, a backup's delta fails.
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
