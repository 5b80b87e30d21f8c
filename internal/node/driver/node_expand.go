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

// NodeExpandVolume implements csi.NodeServer: lvextend, then an online grow
// of the mounted filesystem. A repeat completes an expansion that stopped
// between the two steps.
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
	device := n.openedDevice(vol, lv.Device(n.cfg.DevDir))
	block, err := n.expandPath(vol, device, path, access)
	if err != nil {
		return nil, err
	}
	// A raw block volume's LV may be inactive; its device node is what the pod
	// uses.
	if lv, err = n.activate(ctx, vol, lv); err != nil {
		return nil, err
	}

	if required := uint64(req.GetCapacityRange().GetRequiredBytes()); required > lv.Size {
		if lv, err = n.extend(ctx, op, vol, class, lv, required, uint64(req.GetCapacityRange().GetLimitBytes())); err != nil {
			return nil, err
		}
	}
	// The opened LUKS device grows before its filesystem.
	if err := n.resizeEncrypted(ctx, vol, lv.Device(n.cfg.DevDir)); err != nil {
		return nil, err
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

// expandPath checks volume_path: a directory with the filesystem mounted,
// or a file (a published raw block volume). It tells which.
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

// extend grows vol's LV under the room lock: RESOURCE_EXHAUSTED when it does
// not fit now, OUT_OF_RANGE past limit_bytes or the class's maximum.
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

// metadataDevices are what a flush makes the metadata change durable
// through: the group's PVs from the view, else the LV's device.
func (n *NodeServer) metadataDevices(lv *lvm.LogicalVolume) []string {
	if n.cfg.View != nil {
		if pvs := n.cfg.View.PhysicalVolumes(lv.VolumeGroup); len(pvs) > 0 {
			return pvs
		}
	}
	return []string{lv.Device(n.cfg.DevDir)}
}

// checkGrowth takes the room lock (released by unlock) and checks the
// growth against the room of the class.
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
