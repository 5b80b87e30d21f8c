package router

import (
	"context"
	"errors"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/carve-csi/carve/internal/volume"
)

// DeleteVolume implements csi.ControllerServer; a volume no node has is
// deleted already.
func (s *Server) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: must be set")
	}
	node, err := s.nodeOfVolume(ctx, id)
	if errors.Is(err, errNoVolume) {
		klog.FromContext(ctx).V(2).Info("DeleteVolume of a volume no node has; nothing to do", "volumeID", id)
		return &csi.DeleteVolumeResponse{}, nil
	}
	if err != nil {
		return nil, err
	}
	return send(ctx, s, node, "DeleteVolume", csi.ControllerClient.DeleteVolume, req, codes.Unavailable)
}

// ValidateVolumeCapabilities implements csi.ControllerServer.
func (s *Server) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_capabilities: at least one capability must be given")
	}
	node, err := s.volumeNode(ctx, "volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return send(ctx, s, node, "ValidateVolumeCapabilities", csi.ControllerClient.ValidateVolumeCapabilities, req, codes.Unavailable)
}

// ControllerGetVolume implements csi.ControllerServer.
func (s *Server) ControllerGetVolume(ctx context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	node, err := s.volumeNode(ctx, "volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return send(ctx, s, node, "ControllerGetVolume", csi.ControllerClient.ControllerGetVolume, req, codes.Unavailable)
}

// ControllerGetVolumeHealth implements csi.ControllerServer.
func (s *Server) ControllerGetVolumeHealth(ctx context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	node, err := s.volumeNode(ctx, "volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return send(ctx, s, node, "ControllerGetVolumeHealth", csi.ControllerClient.ControllerGetVolumeHealth, req, codes.Unavailable)
}

// ControllerModifyVolume implements csi.ControllerServer: the volume's node
// records and applies the new IO limits. Mutable parameters that are not
// limits are INVALID_ARGUMENT before any node is asked.
func (s *Server) ControllerModifyVolume(ctx context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id: must be set")
	}
	if _, err := volume.ParseIOLimits(req.GetMutableParameters(), volume.IOLimits{}, false); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "mutable_parameters: %v", err)
	}
	node, err := s.volumeNode(ctx, "volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	return send(ctx, s, node, "ControllerModifyVolume", csi.ControllerClient.ControllerModifyVolume, req, codes.Unavailable)
}

// CreateSnapshot implements csi.ControllerServer on the source's node.
func (s *Server) CreateSnapshot(ctx context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name: must be set")
	}
	node, err := s.volumeNode(ctx, "source_volume_id", req.GetSourceVolumeId())
	if err != nil {
		return nil, err
	}
	resp, err := send(ctx, s, node, "CreateSnapshot", csi.ControllerClient.CreateSnapshot, req, codes.Unavailable)
	if err != nil {
		return nil, err
	}
	if err := s.checkSnapshot(ctx, node, "CreateSnapshot", resp.GetSnapshot(), ""); err != nil {
		return nil, err
	}
	if got := resp.GetSnapshot().GetSourceVolumeId(); got != req.GetSourceVolumeId() {
		return nil, s.refuse(ctx, node, "CreateSnapshot", refusedVolumeID, "source_volume_id %q for a snapshot of %q", got, req.GetSourceVolumeId())
	}
	return resp, nil
}

// volumeNode is nodeOfVolume for a call needing the volume: "" is
// InvalidArgument, a volume no node has NotFound.
func (s *Server) volumeNode(ctx context.Context, field, id string) (string, error) {
	if id == "" {
		return "", status.Errorf(codes.InvalidArgument, "%s: must be set", field)
	}
	node, err := s.nodeOfVolume(ctx, id)
	if errors.Is(err, errNoVolume) {
		if _, perr := volume.ParseID(id); perr != nil {
			return "", status.Errorf(codes.NotFound, "%s: volume %q does not exist: %v", field, id, perr)
		}
		return "", status.Errorf(codes.NotFound, "%s: volume %q does not exist on any connected node", field, id)
	}
	return node, err
}

// DeleteSnapshot implements csi.ControllerServer; a foreign ID succeeds.
func (s *Server) DeleteSnapshot(ctx context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id: must be set")
	}
	node, _, _, perr := volume.ParseSnapshotID(id)
	if perr != nil {
		klog.FromContext(ctx).V(2).Info("DeleteSnapshot of an ID that is not carve's; nothing to do", "snapshotID", id, "reason", perr.Error())
		return &csi.DeleteSnapshotResponse{}, nil
	}
	return send(ctx, s, node, "DeleteSnapshot", csi.ControllerClient.DeleteSnapshot, req, codes.Unavailable)
}

// GetSnapshot implements csi.ControllerServer; a foreign ID is NotFound.
func (s *Server) GetSnapshot(ctx context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	id := req.GetSnapshotId()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id: must be set")
	}
	node, _, _, err := volume.ParseSnapshotID(id)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "snapshot_id: snapshot %q does not exist: %v", id, err)
	}
	resp, err := send(ctx, s, node, "GetSnapshot", csi.ControllerClient.GetSnapshot, req, codes.Unavailable)
	if err != nil {
		return nil, err
	}
	if err := s.checkSnapshot(ctx, node, "GetSnapshot", resp.GetSnapshot(), id); err != nil {
		return nil, err
	}
	return resp, nil
}
