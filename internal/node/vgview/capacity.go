package vgview

import (
	"math"

	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/lvm"
)

// Capacity is what one device class can still give out on this node.
type Capacity struct {
	// Available is GetCapacity's answer in bytes, whole extents.
	Available uint64
	// MaxVolume is the largest single volume that fits now.
	MaxVolume  uint64
	ExtentSize uint64
	// Ceiling is the most the class could ever hold here (not reported).
	Ceiling uint64
	// MetadataFull: no room for one more volume's metadata, so no capacity.
	MetadataFull bool
}

func limitByMetadata(c Capacity, vg lvm.VolumeGroup) Capacity {
	if vg.MetadataFull() {
		c.Available, c.MaxVolume, c.MetadataFull = 0, 0, true
	}
	return c
}

// ThickCapacity is the VG's free space minus the spare; raid1 with m
// mirrors writes every byte m+1 times plus a metadata extent per image.
// Whether free space spans enough PVs for striping is left to lvcreate,
// whose failure is RESOURCE_EXHAUSTED.
func ThickCapacity(d *deviceclass.DeviceClass, vg lvm.VolumeGroup) Capacity {
	c := Capacity{ExtentSize: vg.ExtentSize}
	usable := func(free uint64) uint64 {
		u := sub(free, d.SpareBytes())
		if m := d.LVCreateOptions.Mirrors; m > 0 {
			images := uint64(m) + 1
			u = sub(u, images*vg.ExtentSize) / images
		}
		return floorTo(u, vg.ExtentSize)
	}
	c.Available = usable(vg.Free)
	c.MaxVolume = c.Available
	c.Ceiling = usable(vg.Size)
	return c
}

// ThinCapacity is the smaller of the overprovision bound (pool size x ratio
// minus the virtual size given out) and the real-space bound (free data
// minus the spare, x ratio), so a pool filling with written data stops
// attracting volumes before it runs out. A thin class's spare is kept in
// the pool.
func ThinCapacity(d *deviceclass.DeviceClass, vg lvm.VolumeGroup, pool lvm.ThinPool) Capacity {
	c := Capacity{ExtentSize: vg.ExtentSize}
	ratio := d.Ratio()
	limit := mulRatio(pool.Size, ratio)
	virtualRoom := sub(limit, pool.VirtualSize)
	realRoom := mulRatio(realFree(d, pool), ratio)
	c.Available = floorTo(min(virtualRoom, realRoom), vg.ExtentSize)
	c.MaxVolume = c.Available
	c.Ceiling = floorTo(min(limit, mulRatio(sub(pool.Size, d.SpareBytes()), ratio)), vg.ExtentSize)
	return c
}

func realFree(d *deviceclass.DeviceClass, pool lvm.ThinPool) uint64 {
	used := uint64(math.Ceil(float64(pool.Size) * clampPercent(pool.DataPercent) / 100))
	return sub(sub(pool.Size, used), d.SpareBytes())
}

func sub(a, b uint64) uint64 {
	if a <= b {
		return 0
	}
	return a - b
}

func floorTo(v, unit uint64) uint64 {
	if unit == 0 {
		return v
	}
	return v / unit * unit
}

func mulRatio(v uint64, ratio float64) uint64 {
	f := float64(v) * ratio
	if f >= math.MaxUint64 {
		return math.MaxUint64
	}
	return uint64(f)
}

func clampPercent(p float64) float64 {
	switch {
	case p < 0 || math.IsNaN(p):
		return 0
	case p > 100:
		return 100
	}
	return p
}

// RoundUp rounds size up to whole extents.
func RoundUp(size, extent uint64) uint64 {
	if extent == 0 {
		return size
	}
	return (size + extent - 1) / extent * extent
}
