package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/carve-csi/carve/internal/node/fs"
	"github.com/carve-csi/carve/internal/volume"
)

// NodeGetVolumeStats implements csi.NodeServer with statfs or the device
// size and no LVM command: kubelet calls it every minute for every volume.
func (n *NodeServer) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if err := nodeRequireID(id); err != nil {
		return nil, err
	}
	if path == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_path is required")
	}
	vol, err := parseID(id)
	if err != nil {
		return nil, err
	}
	st, err := n.mountedAt(id, n.openedDevice(vol, n.device(vol)), path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		size, err := n.cfg.FS.DeviceSize(ctx, path)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "volume %q: %v", id, err)
		}
		return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
			{Unit: csi.VolumeUsage_BYTES, Total: int64(size)},
		}}, nil
	}
	s, err := n.cfg.FS.Stats(path)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %q: %v", id, err)
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: s.TotalBytes, Available: s.AvailableBytes, Used: s.UsedBytes},
		{Unit: csi.VolumeUsage_INODES, Total: s.TotalInodes, Available: s.FreeInodes, Used: s.UsedInodes},
	}}, nil
}

func (n *NodeServer) mountedAt(id, device, path string) (os.FileInfo, error) {
	if !filepath.IsAbs(path) {
		return nil, status.Errorf(codes.NotFound, "volume %q is not at %q: not an absolute path", id, path)
	}
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.NotFound, "volume %q is not at %s: the path does not exist", id, path)
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %q: %v", id, err)
	}
	mp, err := n.cfg.FS.MountPoint(path)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "reading the mount at %s: %v", path, err)
	}
	if mp == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q is not at %s: nothing is mounted there", id, path)
	}
	if !fs.SameDevice(mp.Device, device) && !fs.SameDeviceNode(path, device) {
		return nil, status.Errorf(codes.NotFound, "volume %q is not at %s: %s is mounted there", id, path, mp.Device)
	}
	return st, nil
}

// NodeGetVolumeHealth implements csi.NodeServer: the LV's health, plus
// INACCESSIBLE when it is not mounted where the CO says.
func (n *NodeServer) NodeGetVolumeHealth(ctx context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if err := nodeRequireID(id); err != nil {
		return nil, err
	}
	publish, staging := req.GetVolumePublishPath(), req.GetStagingTargetPath()
	for _, p := range []struct{ path, field string }{{publish, "volume_publish_path"}, {staging, "staging_target_path"}} {
		if p.path != "" {
			if err := nodeCheckPath(p.path, p.field); err != nil {
				return nil, err
			}
		}
	}
	vol, err := parseID(id)
	if err != nil {
		return nil, err
	}
	lv, _, err := n.findLV(ctx, vol)
	if lvGone(err) {
		h, merr := n.goneButMounted(vol, publish, staging)
		if merr != nil {
			return nil, status.Errorf(codes.Internal, "volume %s: its LV is gone, and whether it is still mounted cannot be told: %v", vol, merr)
		}
		if h != nil {
			return &csi.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
		}
	}
	if err != nil {
		return nil, lookupStatus(vol, err)
	}
	h := volumeHealth(id, lv, nil)
	device := lv.Device(n.cfg.DevDir)
	notMounted := func(p string) {
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "NotMounted",
			Message: fmt.Sprintf("the volume is not mounted at %s", p)})
	}
	publishIsDir := false
	if publish != "" {
		if _, err := n.mountedAt(id, device, publish); err != nil {
			notMounted(publish)
		} else if d, err := fs.IsDirectory(publish); err == nil {
			publishIsDir = d
		}
	}
	// A raw block volume is never mounted at its staging path.
	if staging != "" && publishIsDir {
		if _, err := n.mountedAt(id, device, staging); err != nil {
			notMounted(staging)
		}
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
}

// goneButMounted is the health of a gone LV still mounted at one of paths;
// nil when nothing is.
func (n *NodeServer) goneButMounted(vol volume.ID, paths ...string) (*csi.VolumeHealth, error) {
	for _, p := range paths {
		if p == "" {
			continue
		}
		mp, err := n.cfg.FS.MountPoint(p)
		if err != nil {
			return nil, err
		}
		if mp != nil {
			return &csi.VolumeHealth{VolumeId: vol.String(),
				HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{{
					Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "LogicalVolumeMissing",
					Message: fmt.Sprintf("LV %s/%s no longer exists but %s is still mounted", vol.VG, vol.LV, p)}}}, nil
		}
	}
	return nil, nil
}
