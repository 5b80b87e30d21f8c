package driver

import (
	"context"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/blockcopy"
)

// LVM is what the CSI servers need of LVM; *lvm.Client implements it. The
// errors are the lvm package's (lvm.ErrNotFound, lvm.ErrInsufficientSpace,
// lvm.ErrAlreadyExists, lvm.ErrInvalidArgument), mapped to gRPC codes only
// in this package.
type LVM interface {
	// Report reads the named VGs (every one when none is named), their
	// LVs and thin pools with one command; one named VG that does not
	// exist is lvm.ErrVolumeGroupNotFound.
	Report(ctx context.Context, vgs ...string) (*lvm.Report, error)
	// GetLV returns lvm.ErrNotFound when the LV does not exist, and
	// lvm.ErrVolumeGroupNotFound (also an lvm.ErrNotFound) when its VG
	// does not.
	GetLV(ctx context.Context, vg, name string) (*lvm.LogicalVolume, error)
	// CreateLV returns lvm.ErrAlreadyExists when the name is taken.
	CreateLV(ctx context.Context, req lvm.CreateRequest) (*lvm.LogicalVolume, error)
	// ExtendLV is a no-op for an LV that is already at least size bytes.
	ExtendLV(ctx context.Context, vg, name string, size uint64) (*lvm.LogicalVolume, error)
	// DeleteTags takes tags off an LV; a tag it does not carry is no
	// error. lvm.ErrNotFound when the LV does not exist.
	DeleteTags(ctx context.Context, vg, name string, tags ...string) error
	// RemoveLV returns lvm.ErrNotFound when the LV does not exist,
	// lvm.ErrVolumeGroupNotFound when its VG does not.
	RemoveLV(ctx context.Context, vg, name string) error
	// CreateSnapshot makes a thin snapshot (req.CowSize zero) or a
	// copy-on-write one; lvm.ErrAlreadyExists when the name is taken,
	// lvm.ErrNotFound when the origin does not exist.
	CreateSnapshot(ctx context.Context, req lvm.SnapshotRequest) (*lvm.LogicalVolume, error)
	// ActivateLV activates one LV (a thin LV's pool with it) and returns
	// it; an active LV is returned as it is. lvm.ErrNotFound when the LV
	// does not exist.
	ActivateLV(ctx context.Context, vg, name string) (*lvm.LogicalVolume, error)
}

var _ LVM = (*lvm.Client)(nil)

// Copier copies the first size bytes of the device src to the device dst
// and syncs dst; *blockcopy.Copier implements it. progress, when set, gets
// the bytes copied so far.
type Copier interface {
	Copy(ctx context.Context, dst, src string, size uint64, progress func(uint64)) (blockcopy.Result, error)
}

var _ Copier = blockcopy.Copier{}
