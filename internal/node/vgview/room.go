package vgview

import (
	"context"
	"errors"
	"fmt"

	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/volume"
)

// Errors of RoomToGrow, beside ErrClassUnavailable.
var (
	// ErrNoRoom is a growth the class cannot give now; it may once space
	// is freed.
	ErrNoRoom = errors.New("not enough room in the device class")
	// ErrBeyondClass is a size larger than the class could ever hold on
	// this node, however much were freed.
	ErrBeyondClass = errors.New("larger than the device class can hold on this node")
)

// LockRoom takes the room lock of volume group vg and returns the function
// that releases it. CreateVolume holds it from its room check to the end of
// its lvcreate, NodeExpandVolume from RoomToGrow to the end of its
// lvextend, and both apply their result to the view (Created, Extended)
// before releasing it. Waiting ends with the context.
func (v *View) LockRoom(ctx context.Context, vg string) (func(), error) {
	unlock, err := v.room.Lock(ctx, vg)
	if err != nil {
		return nil, fmt.Errorf("waiting for the room lock of volume group %s: %w", vg, err)
	}
	return unlock, nil
}

// RoomToGrow checks, as creation is checked, that a volume of class d may
// grow from `from` to at least `to` bytes, and returns the size it will have
// (`to` rounded to whole extents, per stripe). ErrBeyondClass (wrapped): more
// than the class could ever hold; ErrNoRoom: not now; ErrClassUnavailable.
// The caller holds the volume group's room lock.
func (v *View) RoomToGrow(d *deviceclass.DeviceClass, from, to uint64) (uint64, error) {
	c, err := v.Capacity(d)
	if err != nil {
		return 0, err
	}
	// LVM grows a striped LV by whole extents per stripe: the size is the
	// one lvextend will make, for the caller's limit_bytes check.
	unit := c.ExtentSize
	if !d.Thin() {
		unit = d.LVCreateOptions.SizeUnit(c.ExtentSize)
	}
	size := RoundUp(to, unit)
	if size <= from {
		return from, nil
	}
	if size > c.Ceiling {
		return 0, fmt.Errorf("device class %s: %d bytes asked, the most a volume can have on this node is %d: %w",
			d.Name, size, c.Ceiling, ErrBeyondClass)
	}
	if grow := size - from; grow > c.Available {
		return 0, fmt.Errorf("device class %s: growing by %d bytes to %d, %d available (after a spare of %d): %w",
			d.Name, grow, size, c.Available, d.SpareBytes(), ErrNoRoom)
	}
	return size, nil
}

// Extended applies the growth of an LV (before and after lvextend) to the
// view at once, so that the next room check counts it, and asks for a full
// refresh soon.
func (v *View) Extended(before, after lvm.LogicalVolume) {
	defer v.changes.fire()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.lvs[after.VolumeGroup+"/"+after.Name] = after
	if after.Size <= before.Size {
		v.gen++
		v.markDirtyLocked()
		return
	}
	v.applyLocked(lvm.LogicalVolume{VolumeGroup: after.VolumeGroup, Pool: after.Pool, Size: after.Size - before.Size}, +1)
}

// PoolRoom is the real room of a thin class's pool: what data written into
// it (a copy, not a volume's virtual size) may take without the ratio.
type PoolRoom struct {
	// Pool is the pool, "vg/pool".
	Pool string
	// Free is the pool's free data space minus the class's spare and
	// minus Pending.
	Free uint64
	// Pending is the virtual size of the pool's LVs that a copy is still
	// to fill (volume.TagCopyPending): each may write up to its size.
	Pending uint64
	// ZeroNewBlocks is the pool's flag (lvm.ThinPool.ZeroNewBlocks).
	ZeroNewBlocks bool
}

// PoolRoom is the real room of thin class d's pool, from the pool's
// data_percent; ErrClassUnavailable (wrapped) as Capacity. Call it with
// the volume group's room lock held.
func (v *View) PoolRoom(d *deviceclass.DeviceClass) (PoolRoom, error) {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if !d.Thin() {
		return PoolRoom{}, fmt.Errorf("device class %s is not thin", d.Name)
	}
	if err := v.classProblemLocked(d); err != nil {
		return PoolRoom{}, err
	}
	pool := v.pools[d.VolumeGroup+"/"+d.ThinPool]
	r := PoolRoom{Pool: d.VolumeGroup + "/" + d.ThinPool, ZeroNewBlocks: pool.ZeroNewBlocks}
	for _, lv := range v.lvs {
		if lv.VolumeGroup == d.VolumeGroup && lv.Pool == d.ThinPool && volume.CopyPending(lv.Tags) {
			r.Pending += lv.Size
		}
	}
	r.Free = sub(realFree(d, pool), r.Pending)
	return r, nil
}
