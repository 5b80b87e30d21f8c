package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/lvm"
	"github.com/carve-csi/carve/pkg/fs"
	"github.com/carve-csi/carve/pkg/metrics"
)

// NodeExpandVolume implements csi.NodeServer: lvextend to required_bytes,
// then an online grow of the mounted filesystem; a raw block volume is
// only extended. Repeating it extends nothing and grows nothing more, and
// it also completes an expansion that stopped between the two steps.
func (n *NodeServer) NodeExpandVolume(ctx context.Context, req *csi.NodeExpandVolumeRequest) (resp *csi.NodeExpandVolumeResponse, err error) {
	start, class := time.Now(), unknownClassLabel
	defer func() { n.cfg.Metrics.ObservePhase(metrics.PhaseExpand, class, time.Since(start), err) }()

	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := nodeRequireID(id); err != nil {
		return nil, err
	}
	if path == "" {
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
	var access *volumeAccess
	if req.GetVolumeCapability() != nil {
		a, err := nodeCapability(req.GetVolumeCapability(), "volume_capability")
		if err != nil {
			return nil, err
		}
		access = &a
	}
	if err := n.acquire(id); err != nil {
		return nil, err
	}
	defer n.release(id)

	lv, err := n.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	class, _ = n.classOf(id)
	if err := nodeCheckPath(path, "volume_path"); err != nil {
		return nil, err
	}
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.NotFound, "volume %q is not at %s: the path does not exist", id, path)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %q: %v", id, err)
	}
	block := !st.IsDir()
	if access != nil && access.block != block {
		return nil, status.Errorf(codes.InvalidArgument, "volume_capability is %s but volume_path %s is a %s", access.describe(), path, map[bool]string{true: "file (a block volume)", false: "directory (a filesystem)"}[block])
	}
	device := lvDevicePath(lv)
	if !block {
		mp, err := n.cfg.FS.MountPoint(path)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "reading the mount at %s: %v", path, err)
		}
		if mp == nil || !fs.SameDevice(mp.Device, device) {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %q is not mounted at %s; its filesystem can only grow online", id, path)
		}
	}
	// A mounted filesystem's LV is active. A raw block volume's may not be
	// (deactivated under a published target file): its device node is what
	// the pod uses, so it is activated before it grows.
	if lv, err = n.activate(ctx, id, lv); err != nil {
		return nil, err
	}

	if uint64(required) > lv.Size {
		grown, err := n.extend(ctx, id, class, lv, uint64(required), uint64(limit))
		if err != nil {
			return nil, err
		}
		lv = grown
	}
	if !block {
		t := time.Now()
		_, err := n.cfg.FS.Resize(ctx, device, path)
		n.step(metrics.PhaseExpand, metrics.StepFilesystemGrow, class, t, err)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "volume %q: %v", id, err)
		}
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: int64(lv.Size)}, nil
}

// extend grows the LV of volume id to required bytes: under the volume
// group's room lock, after checking the growth against its class's room as
// CreateVolume checks a new volume (NodeConfig.Classes and View). A growth
// that does not fit now is RESOURCE_EXHAUSTED (the kubelet retries it
// later); a size above limit_bytes after rounding to extents, or above
// what the class could ever hold on this node, is OUT_OF_RANGE (the CSI
// code for a capacity range the plugin cannot serve: the request must
// change).
func (n *NodeServer) extend(ctx context.Context, id, class string, lv *lvm.LogicalVolume, required, limit uint64) (*lvm.LogicalVolume, error) {
	log := klog.FromContext(ctx).WithValues("volumeID", id)
	if n.cfg.Classes != nil && n.cfg.View != nil {
		d, ok := n.cfg.Classes.Class(class)
		if class == unknownClassLabel || !ok || d.VolumeGroup != lv.VolumeGroup || d.ThinPool != lv.Pool {
			return nil, status.Errorf(codes.ResourceExhausted, "volume %q: its device class %q is not one of this node's classes for LV %s/%s (pool %q), so there is no room to check a growth against",
				id, class, lv.VolumeGroup, lv.Name, lv.Pool)
		}
		unlock, err := n.cfg.View.LockRoom(ctx, lv.VolumeGroup)
		if err != nil {
			return nil, toStatus(err, fmt.Sprintf("extending volume %q", id))
		}
		defer unlock()
		size, err := n.cfg.View.RoomToGrow(d, lv.Size, required)
		if err != nil {
			return nil, toStatus(err, fmt.Sprintf("extending volume %q from %d to %d bytes", id, lv.Size, required))
		}
		if limit > 0 && size > limit {
			return nil, status.Errorf(codes.OutOfRange, "volume %q: %d bytes asked are %d in whole extents, above limit_bytes %d", id, required, size, limit)
		}
	}
	t := time.Now()
	grown, err := n.cfg.LVM.ExtendLV(ctx, lv.VolumeGroup, lv.Name, required)
	n.step(metrics.PhaseExpand, metrics.StepLVExtend, class, t, err)
	if err != nil {
		return nil, toStatus(err, fmt.Sprintf("extending volume %q to %d bytes", id, required))
	}
	if n.cfg.View != nil {
		n.cfg.View.Extended(*lv, *grown)
	}
	if n.cfg.OnChange != nil {
		n.cfg.OnChange()
	}
	log.Info("Extended LV", "from", lv.Size, "to", grown.Size)
	return grown, nil
}
