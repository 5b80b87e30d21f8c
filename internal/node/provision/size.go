package provision

import (
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/volume"
)

// minFilesystemSize: mkfs.xfs (xfsprogs 5.19+) refuses devices under
// 300 MiB, which would fail every NodeStage.
var minFilesystemSize = map[string]uint64{"xfs": 300 << 20}

// VolumeSize resolves r to whole units: required_bytes rounded up, at least
// fsType's minimum; 0 is volume.DefaultVolumeSize (or a smaller limit).
// Past limit_bytes it is ErrOutOfRange.
func VolumeSize(r Range, unit uint64, fsType string) (uint64, error) {
	req, lim := r.Required, r.Limit
	switch {
	case req < 0:
		return 0, errorf(ErrInvalid, "capacity_range: required_bytes %d is negative", req)
	case lim < 0:
		return 0, errorf(ErrInvalid, "capacity_range: limit_bytes %d is negative", lim)
	case lim > 0 && req > lim:
		return 0, errorf(ErrInvalid, "capacity_range: required_bytes %d exceeds limit_bytes %d", req, lim)
	}
	size := uint64(req)
	if size == 0 {
		size = volume.DefaultVolumeSize
		if lim > 0 && uint64(lim) < size {
			size = uint64(lim) / unit * unit
			if size == 0 {
				return 0, errorf(ErrOutOfRange, "capacity_range: limit_bytes %d is smaller than one extent (%d bytes, an extent per stripe for a striped class)", lim, unit)
			}
		}
	}
	if floor := minFilesystemSize[fsType]; size < floor {
		if lim > 0 && uint64(lim) < floor {
			return 0, errorf(ErrOutOfRange, "capacity_range: limit_bytes %d is below the %d bytes a %s filesystem needs", lim, floor, fsType)
		}
		size = floor
	}
	size = vgview.RoundUp(size, unit)
	if lim > 0 && size > uint64(lim) {
		return 0, errorf(ErrOutOfRange, "capacity_range: %d bytes rounded up to whole extents (a multiple of %d bytes, an extent per stripe for a striped class) is %d, above limit_bytes %d", req, unit, size, lim)
	}
	return size, nil
}

func sizeFits(size uint64, r Range) bool {
	if r.Required > 0 && size < uint64(r.Required) {
		return false
	}
	if r.Limit > 0 && size > uint64(r.Limit) {
		return false
	}
	return true
}

// sourceSize is at least the source's size, rounded, within the limit.
func sourceSize(size, srcSize, unit uint64, r Range) (uint64, error) {
	if size >= srcSize {
		return size, nil
	}
	size = vgview.RoundUp(srcSize, unit)
	if lim := r.Limit; lim > 0 && size > uint64(lim) {
		return 0, errorf(ErrOutOfRange, "capacity_range: limit_bytes %d is smaller than the content source's %d bytes", lim, srcSize)
	}
	return size, nil
}
