package driver

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/metrics"
	"github.com/carve-csi/carve/internal/node/capability"
	"github.com/carve-csi/carve/internal/node/erase"
	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/internal/node/lvm"
	"github.com/carve-csi/carve/internal/node/nodestatus"
	"github.com/carve-csi/carve/internal/volume"
)

// NodeExpandVolume implements csi.NodeServer: lvextend to required_bytes,
// then an online grow of the mounted filesystem; a raw block volume is
// only extended. Repeating it extends nothing and grows nothing more, and
// it also completes an expansion that stopped between the two steps.
func (n *NodeServer) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (resp *csi.NodeExpandVolumeResponse, err error) {
	op := n.begin(metrics.PhaseExpand)
	defer op.End(&err)

	id, path := req.GetVolumeId(), req.GetVolumePath()
	access, err := expandAccess(req)
	if err != nil {
		return nil, err
	}
	if err := n.acquire(id); err != nil {
		return nil, err
	}
	defer n.release(id)

	vol, err := parseID(id)
	if err != nil {
		return nil, err
	}
	lv, class, err := n.lookup(ctx, vol)
	if err != nil {
		return nil, err
	}
	op.SetClass(class)
	device := lv.Device(n.cfg.DevDir)
	block, err := n.expandPath(vol, device, path, access)
	if err != nil {
		return nil, err
	}
	// A mounted filesystem's LV is active. A raw block volume's may not be
	// (deactivated under a published target file): its device node is what
	// the pod uses, so it is activated before it grows.
	if lv, err = n.activate(ctx, vol, lv); err != nil {
		return nil, err
	}

	if required := uint64(req.GetCapacityRange().GetRequiredBytes()); required > lv.Size {
		if lv, err = n.extend(ctx, op, vol, class, lv, required, uint64(req.GetCapacityRange().GetLimitBytes())); err != nil {
			return nil, err
		}
	}
	if !block {
		if err := op.Step(metrics.StepFilesystemGrow, func() error {
			_, err := n.cfg.FS.Resize(ctx, device, path)
			return err
		}); err != nil {
			return nil, status.Errorf(codes.Internal, "volume %q: %v", id, err)
		}
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: int64(lv.Size)}, nil
}

// expandAccess checks the arguments of an expansion and reads its
// capability, if it has one (nil otherwise).
func expandAccess(req *csi.NodeExpandVolumeRequest) (*capability.Access, error) {
	if err := nodeRequireID(req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetVolumePath() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_path is required")
	}
	required, limit := req.GetCapacityRange().GetRequiredBytes(), req.GetCapacityRange().GetLimitBytes()
	switch {
	case required < 0:
		return nil, status.Errorf(codes.InvalidArgument, "capacity_range.required_bytes %d is negative", required)
	case limit < 0:
		return nil, status.Errorf(codes.InvalidArgument, "capacity_range.limit_bytes %d is negative", limit)
	case limit > 0 && required > limit:
		return nil, status.Errorf(codes.OutOfRange, "capacity_range.required_bytes %d exceeds limit_bytes %d", required, limit)
	}
	if req.GetVolumeCapability() == nil {
		return nil, nil
	}
	a, err := nodeAccess(req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	return &a, nil
}

// expandPath checks volume_path of an expansion: a directory where the
// volume's filesystem is mounted, or a file (a published raw block
// volume), as the capability, if given, says. It tells which.
func (n *NodeServer) expandPath(vol volume.ID, device, path string, access *capability.Access) (block bool, err error) {
	if err := nodeCheckPath(path, "volume_path"); err != nil {
		return false, err
	}
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, status.Errorf(codes.NotFound, "volume %q is not at %s: the path does not exist", vol, path)
	}
	if err != nil {
		return false, status.Errorf(codes.Internal, "volume %q: %v", vol, err)
	}
	block = !st.IsDir()
	if access != nil && access.Block != block {
		return false, status.Errorf(codes.InvalidArgument, "volume_capability is %s but volume_path %s is a %s", access.Describe(), path, map[bool]string{true: "file (a block volume)", false: "directory (a filesystem)"}[block])
	}
	if block {
		return true, nil
	}
	mp, err := n.cfg.FS.MountPoint(path)
	if err != nil {
		return false, status.Errorf(codes.Internal, "reading the mount at %s: %v", path, err)
	}
	if mp == nil || !fs.SameDevice(mp.Device, device) {
		return false, status.Errorf(codes.FailedPrecondition, "volume %q is not mounted at %s; its filesystem can only grow online", vol, path)
	}
	return false, nil
}

// extend grows the LV of vol to required bytes under the volume group's room
// lock, checked against its class's room as CreateVolume checks a new volume.
// A growth that does not fit now is RESOURCE_EXHAUSTED (the kubelet retries);
// one past limit_bytes after rounding, or past what the class could ever hold
// here, is OUT_OF_RANGE: the request must change.
func (n *NodeServer) extend(ctx context.Context, op *metrics.Op, vol volume.ID, class string, lv *lvm.LogicalVolume, required, limit uint64) (*lvm.LogicalVolume, error) {
	if n.cfg.Classes != nil && n.cfg.View != nil {
		unlock, err := n.checkGrowth(ctx, vol, class, lv, required, limit)
		if err != nil {
			return nil, err
		}
		defer unlock()
	}
	var grown *lvm.LogicalVolume
	if err := op.Step(metrics.StepLVExtend, func() (err error) {
		grown, err = n.cfg.LVM.ExtendLV(ctx, lv.VolumeGroup, lv.Name, required)
		return err
	}); err != nil {
		return nil, nodestatus.Of(err, fmt.Sprintf("extending volume %q to %d bytes", vol, required))
	}
	if err := erase.FlushAll(ctx, n.cfg.Eraser, n.metadataDevices(lv)); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %q: making its extension durable: %v", vol, err)
	}
	if n.cfg.View != nil {
		n.cfg.View.Extended(*lv, *grown)
	}
	klog.FromContext(ctx).Info("Extended LV", "volumeID", vol.String(), "from", lv.Size, "to", grown.Size)
	return grown, nil
}

// metadataDevices are what a flush makes a metadata change of lv's volume
// group durable through (erase.Flush): a growth a power cut undoes is one the
// PV already counts. They are the group's PVs as the view last read them, or
// else the LV's own device.
func (n *NodeServer) metadataDevices(lv *lvm.LogicalVolume) []string {
	if n.cfg.View != nil {
		if pvs := n.cfg.View.PhysicalVolumes(lv.VolumeGroup); len(pvs) > 0 {
			return pvs
		}
	}
	return []string{lv.Device(n.cfg.DevDir)}
}

// checkGrowth takes the room lock of the volume's group and checks the
// growth against the room of its class; the caller holds the lock, to be
// released with unlock, while it extends.
func (n *NodeServer) checkGrowth(ctx context.Context, vol volume.ID, class string, lv *lvm.LogicalVolume, required, limit uint64) (unlock func(), err error) {
	d, ok := n.cfg.Classes.Class(class)
	if class == metrics.UnknownClass || !ok || d.VolumeGroup != lv.VolumeGroup || d.ThinPool != lv.Pool {
		return nil, status.Errorf(codes.ResourceExhausted, "volume %q: its device class %q is not one of this node's classes for LV %s/%s (pool %q), so there is no room to check a growth against",
			vol, class, lv.VolumeGroup, lv.Name, lv.Pool)
	}
	unlock, err = n.cfg.View.LockRoom(ctx, lv.VolumeGroup)
	if err != nil {
		return nil, nodestatus.Of(err, fmt.Sprintf("extending volume %q", vol))
	}
	size, err := n.cfg.View.RoomToGrow(d, lv.Size, required)
	if err != nil {
		unlock()
		return nil, nodestatus.Of(err, fmt.Sprintf("extending volume %q from %d to %d bytes", vol, lv.Size, required))
	}
	if limit > 0 && size > limit {
		unlock()
		return nil, status.Errorf(codes.OutOfRange, "volume %q: %d bytes asked are %d in whole extents, above limit_bytes %d", vol, required, size, limit)
	}
	return unlock, nil
}
