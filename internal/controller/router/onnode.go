package router

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A move's calls about a volume whose node it knows go to that node only,
// so no other node can claim it and no slow node holds the call up.

// DeleteVolumeOn is DeleteVolume sent to node only. UNAVAILABLE when not
// connected; FAILED_PRECONDITION for a volume a PV pins there (in use, not
// a leftover).
func (s *Server) DeleteVolumeOn(ctx context.Context, node string, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if err := onNodeArgs(node, req.GetVolumeId()); err != nil {
		return nil, err
	}
	nodes, err := s.cfg.Volumes.NodesOf(req.GetVolumeId())
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "volume %s: whether a PersistentVolume names it is not known yet: %v", req.GetVolumeId(), err)
	}
	for _, n := range nodes {
		if n == node {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s on node %s: a PersistentVolume names it; not deleting it", req.GetVolumeId(), node)
		}
	}
	return send(ctx, s, node, "DeleteVolume", csi.ControllerClient.DeleteVolume, req, codes.Unavailable)
}

// ControllerGetVolumeOn is ControllerGetVolume sent to node only;
// UNAVAILABLE when not connected.
func (s *Server) ControllerGetVolumeOn(ctx context.Context, node string, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	if err := onNodeArgs(node, req.GetVolumeId()); err != nil {
		return nil, err
	}
	return send(ctx, s, node, "ControllerGetVolume", csi.ControllerClient.ControllerGetVolume, req, codes.Unavailable)
}

func onNodeArgs(node, id string) error {
	switch {
	case node == "":
		return status.Error(codes.InvalidArgument, "node: must be set")
	case id == "":
		return status.Error(codes.InvalidArgument, "volume_id: must be set")
	}
	return nil
}
