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
	// ErrNoRoom is a growth the class cannot give now.
	ErrNoRoom = errors.New("not enough room in the device class")
	// ErrBeyondClass is larger than the class could ever hold here.
	ErrBeyondClass = errors.New("larger than the device class can hold on this node")
)

// LockRoom takes vg's room lock: CreateVolume holds it from its room check
// through lvcreate, NodeExpandVolume from RoomToGrow through lvextend, both
// applying their result to the view before releasing it.
func (v *View) LockRoom(ctx context.Context, vg string) (func(), error) {
	unlock, err := v.room.Lock(ctx, vg)
	if err != nil {
		return nil, fmt.Errorf("waiting for the room lock of volume group %s: %w", vg, err)
	}
	return unlock, nil
}

// RoomToGrow checks, as creation is checked, that a volume of d may grow
// from `from` to `to` bytes, and returns the size lvextend will make.
// ErrBeyondClass, ErrNoRoom, ErrClassUnavailable. The caller holds the room
// lock.
func (v *View) RoomToGrow(d *deviceclass.DeviceClass, from, to uint64) (uint64, error) {
	c, err := v.Capacity(d)
	if err != nil {
		return 0, err
	}
	// LVM grows a striped LV by whole extents per stripe.
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

// Extended applies a growth at once so the next room check counts it.
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

// PoolRoom is what written data may take of a thin pool.
type PoolRoom struct {
	Pool string
	// Free is the free data space minus the spare and Pending.
	Free uint64
	// Pending: copy-pending LVs may each write up to their size.
	Pending       uint64
	ZeroNewBlocks bool
}

// PoolRoom is d's pool's real room; hold the room lock.
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
