// Package provision is carve's volume lifecycle on one node, with no
// transport: making, copying, snapshotting and deleting volumes, and
// removing orphans. Its errors are *Error kinds (errors.go) or lvm's wrapped;
// the CSI edge maps them to gRPC codes.
package provision

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/api/moveapi"
	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/blockcopy"
	"github.com/carve-csi/carve/internal/node/deviceclass"
	"github.com/carve-csi/carve/internal/node/dmsnapshot"
	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/jobs"
	"github.com/carve-csi/carve/internal/node/luks"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/marks"
	"github.com/carve-csi/carve/internal/node/vgview"
	"github.com/carve-csi/carve/internal/node/volumelock"
	"github.com/carve-csi/carve/internal/volume"
)

// Config holds what the Provisioner needs; main builds it.
type Config struct {
	// NodeName is this node.
	NodeName string
	Classes  *deviceclass.Config
	LVM      LVM
	// View is the in-memory state reads use; refreshed once before use.
	View *vgview.View
	// Metrics records phases and steps; nil records nothing.
	Metrics *metrics.Recorder
	// Eraser zeroes new raw-block volumes; nil is erase.Devices.
	Eraser erase.Eraser
	// Copier copies what is not a thin snapshot in the class's pool.
	Copier Copier
	// Puller copies from another node; nil makes none.
	Puller Puller
	// Snapshots reads a copy-on-write snapshot's kernel state; nil asks LVM.
	Snapshots SnapshotReader
	// Changes names changes from metadata; nil makes catch-ups compare data.
	Changes ChangeFinder
	// Marks records thick LVs being made until ready; required.
	Marks *marks.Marks
	// Formatting is the node server's: a made or deleted volume's mark comes
	// off, so an older LV's mark never has a stage erase a new one.
	Formatting *marks.Marks
	// Locks are the per-volume locks; nil is a new set.
	Locks *volumelock.Locks
	// IsDeviceNode tells whether path is a block device; nil checks the file.
	IsDeviceNode func(path string) bool
	// LUKS runs cryptsetup; nil makes no encrypted volumes.
	LUKS luks.Interface
	// HasLUKSHeader overrides HasLUKSHeader in tests.
	HasLUKSHeader func(path string) (bool, error)
	// DevDir is where LVM makes device nodes; empty is volume.DevDir.
	DevDir string
}

// LVM is what the provisioner needs of LVM; *lvm.Client implements it.
type LVM interface {
	// Report reads the named VGs (all when none).
	Report(ctx context.Context, vgs ...string) (*lvm.Report, error)
	// GetLV returns lvm.ErrNotFound or lvm.ErrVolumeGroupNotFound.
	GetLV(ctx context.Context, vg, name string) (*lvm.LogicalVolume, error)
	// CreateLV returns lvm.ErrAlreadyExists when the name is taken.
	CreateLV(ctx context.Context, req lvm.CreateRequest) (*lvm.LogicalVolume, error)
	// ExtendLV is a no-op for an LV that is already at least size bytes.
	ExtendLV(ctx context.Context, vg, name string, size uint64) (*lvm.LogicalVolume, error)
	// DeleteTags takes tags off; a missing tag is no error.
	DeleteTags(ctx context.Context, vg, name string, tags ...string) error
	// RemoveLV returns lvm.ErrNotFound or lvm.ErrVolumeGroupNotFound.
	RemoveLV(ctx context.Context, vg, name string) error
	// CreateSnapshot makes a thin (CowSize zero) or copy-on-write snapshot.
	CreateSnapshot(ctx context.Context, req lvm.SnapshotRequest) (*lvm.LogicalVolume, error)
	// ActivateLV activates an LV and a thin LV's pool.
	ActivateLV(ctx context.Context, vg, name string) (*lvm.LogicalVolume, error)
	// DeactivateLV deactivates an LV; an inactive one is left as it is.
	DeactivateLV(ctx context.Context, vg, name string) error
}

var _ LVM = (*lvm.Client)(nil)

// Settler's Settle waits until no mutation of vg runs (they may outlive
// their callers), or ctx ends.
type Settler interface {
	Settle(ctx context.Context, vg string) error
}

var _ Settler = (*lvm.Client)(nil)

// Copier copies size bytes of src to dst and syncs dst.
type Copier interface {
	Copy(ctx context.Context, dst, src string, size uint64, sparse bool, progress func(uint64)) (blockcopy.Result, error)
}

var _ Copier = blockcopy.Copier{}

// SnapshotReader reads a device-mapper snapshot's state (dmsnapshot.Reader).
type SnapshotReader interface {
	Read(path string) (dmsnapshot.State, error)
}

// Provisioner makes, copies, snapshots and removes this node's volume LVs.
type Provisioner struct {
	cfg   Config
	locks *volumelock.Locks
	// finishing erases new LVs beyond one call (erasing a large volume outlasts
	// csi-provisioner's deadline); retries join it. Ended work is not kept: a
	// retry reads the outcome from the LV's tags.
	finishing jobs.Set[*lvm.LogicalVolume]
	// copying holds LVs a Create copies into: a repeat says
	// moveapi.ErrorCopyInProgress so its caller waits.
	copying sync.Map
}

// New returns the Provisioner of cfg.
func New(cfg Config) *Provisioner {
	if cfg.Eraser == nil {
		cfg.Eraser = erase.Devices{}
	}
	if cfg.Locks == nil {
		cfg.Locks = volumelock.New()
	}
	if cfg.IsDeviceNode == nil {
		cfg.IsDeviceNode = volume.IsBlockDevice
	}
	if cfg.DevDir == "" {
		cfg.DevDir = volume.DevDir(os.Environ())
	}
	if cfg.HasLUKSHeader == nil {
		cfg.HasLUKSHeader = HasLUKSHeader
	}
	return &Provisioner{cfg: cfg, locks: cfg.Locks}
}

func (p *Provisioner) devicePath(lv *lvm.LogicalVolume) string {
	return lv.Device(p.cfg.DevDir)
}

// Lock takes the per-volume lock of lvName; busy is ErrBusy.
func (p *Provisioner) Lock(lvName, what string) (func(), error) {
	if !p.locks.TryAcquire(lvName) {
		if _, ok := p.copying.Load(lvName); ok {
			return nil, reasonf(ErrBusy, moveapi.ErrorCopyInProgress, "%s: its data is still being copied into it by an earlier call; retry later", what)
		}
		return nil, errorf(ErrBusy, "an operation on %s is already in progress; retry later", what)
	}
	return func() { p.locks.Release(lvName) }, nil
}

// Busy tells whether a call holds lvName's lock.
func (p *Provisioner) Busy(lvName string) bool { return p.locks.IsHeld(lvName) }

// BusyNames lists, sorted, the names whose lock is held now.
func (p *Provisioner) BusyNames() []string { return p.locks.Keys() }

// RemoveOrphan removes carve LV vg/name that QuarantineOrphan quarantined
// from orphanOf, under its per-volume lock (busy is an error: the next pass
// tries again), and clears its original name's marks. A gone LV is success;
// one not carve's, not quarantined from orphanOf, with snapshots, or open
// is refused.
func (p *Provisioner) RemoveOrphan(ctx context.Context, vg, name, orphanOf string) error {
	if !p.locks.TryAcquire(name) {
		return fmt.Errorf("LV %s: an operation is in flight", volume.VolumeID(vg, name))
	}
	defer p.locks.Release(name)
	lv, err := p.cfg.LVM.GetLV(ctx, vg, name)
	switch {
	case errors.Is(err, lvm.ErrNotFound):
		p.cfg.View.Removed(vg, name)
		return nil
	case err != nil:
		return err
	case !volume.IsCarve(lv.Tags):
		return fmt.Errorf("LV %s does not carry carve's tag %s", volume.VolumeID(vg, name), volume.TagOwner)
	}
	if q, ok := volume.QuarantinedFrom(name, lv.Tags); !ok || q.Original != orphanOf || orphanOf == "" {
		return fmt.Errorf("LV %s is not an orphan quarantined from %q; carve removes only those", volume.VolumeID(vg, name), orphanOf)
	}
	if snaps := p.snapshotsOf(vg, name); len(snaps) > 0 {
		return fmt.Errorf("LV %s has snapshots %v; carve removes it only once they are deleted", volume.VolumeID(vg, name), snaps)
	}
	switch deps, err := p.dependentsOf(ctx, vg, name); {
	case err != nil:
		return fmt.Errorf("LV %s: looking for its snapshots: %w", volume.VolumeID(vg, name), err)
	case len(deps) > 0:
		return fmt.Errorf("LV %s is the origin of %v; carve removes it only once no LV has it as origin", volume.VolumeID(vg, name), deps)
	}
	class, _ := volume.ClassFromTags(lv.Tags)
	start := time.Now()
	err = p.cfg.LVM.RemoveLV(ctx, vg, name)
	p.cfg.Metrics.ObserveStep(metrics.PhaseDelete, metrics.StepLVRemove, class, time.Since(start), err)
	if err != nil && !errors.Is(err, lvm.ErrNotFound) {
		return err
	}
	p.cfg.View.Removed(vg, name)
	p.clearMark(ctx, vg, orphanOf)
	return nil
}

// Available tells whether CreateVolume has handed lv out: not half-made,
// not copy-pending, not a quarantined orphan. An unreadable mark counts as
// unfinished.
func (p *Provisioner) Available(lv *lvm.LogicalVolume) bool {
	if volume.IsQuarantineName(lv.Name) {
		return false
	}
	half, err := p.unfinished(lv)
	return err == nil && !half && !volume.CopyPending(lv.Tags)
}

// refreshAfter re-reads LVM after a mutation found less room than the view.
func (p *Provisioner) refreshAfter(ctx context.Context, what string) {
	if err := p.cfg.View.Refresh(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Refreshing the volume-group view failed", "after", what)
	}
}
