package router

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The calls of a move about a volume whose node the mover knows (its
// target, and the old volume) go to that node only: a volume with no PV
// is never looked for by asking every node, so no other node can claim
// it and no slow node holds the call up.

// DeleteVolumeOn is DeleteVolume sent to node only. A node whose agent
// is not connected is UNAVAILABLE: whether the volume is gone is not
// known until it answers. A volume that a PV pins to that node is
// FAILED_PRECONDITION: it is in use, not a move's leftover.
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

// ControllerGetVolumeOn is ControllerGetVolume sent to node only: NOT_FOUND
// from that node means the volume is not there; a node whose agent is
// not connected is UNAVAILABLE.
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
