package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/node/nodestatus"
	"github.com/carve-csi/carve/internal/volume"
)

// ControllerModifyVolume implements csi.ControllerServer: the mutable
// parameters are IO limits, recorded in the LV's tags (where NodePublish and
// a restarted agent find them) and applied at once to published pods. A node
// that cannot apply limits answers FAILED_PRECONDITION after recording them.
func (s *ControllerServer) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: must be set")
	}
	if _, err := volume.ParseIOLimits(req.GetMutableParameters(), volume.IOLimits{}, false); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "mutable_parameters: %v", err)
	}
	vol, err := volume.ParseID(id)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume_id: volume %q does not exist: %v", id, err)
	}
	limits, err := s.p.SetIOLimits(ctx, vol.VG, vol.LV, req.GetMutableParameters())
	if err != nil {
		return nil, nodestatus.Of(err, "")
	}
	if s.cfg.Limits == nil {
		return &csi.ControllerModifyVolumeResponse{}, nil
	}
	n, err := s.cfg.Limits.ApplyIOLimits(ctx, vol, limits)
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).V(2).Info("Applied IO limits", "volumeID", id, "limits", limits.String(), "pods", n)
	return &csi.ControllerModifyVolumeResponse{}, nil
}
